-- ARGV: P, status, ...
local counts = {}
for i = 2, #ARGV do counts[#counts + 1] = count_status(ARGV[i]) end
return {counts, redis.call('HGETALL', QPRIO), redis.call('HGETALL', P .. 'workers')}
