-- ARGV: P, now, status, ...
-- The last reply: the queued jobs not due at now (delayed, a retry's backoff, a parked
-- pipeline): they wait in DELAYED, scored by run_at (those due and not moved yet are due).
local counts = {}
for i = 3, #ARGV do counts[#counts + 1] = count_status(ARGV[i]) end
return {counts, redis.call('HGETALL', QPRIO), redis.call('HGETALL', P .. 'workers'),
  redis.call('ZCOUNT', DELAYED, '(' .. ARGV[2], '+inf')}
