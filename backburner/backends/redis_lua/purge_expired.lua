-- ARGV: P, now, limit
local ids = redis.call('ZRANGEBYSCORE', EXPIRING, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  forget(id, redis.call('HMGET', jkey(id), '_ty', 'status', '_ik', 'worker_id'))
end
return #ids
