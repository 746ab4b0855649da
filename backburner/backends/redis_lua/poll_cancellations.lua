-- ARGV: P, worker_id
local key = P .. 'c:' .. ARGV[2]
local signals = redis.call('HGETALL', key)
redis.call('DEL', key)
return signals
