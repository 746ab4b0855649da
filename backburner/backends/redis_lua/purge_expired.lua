-- ARGV: P, now, limit
local ids = redis.call('ZRANGEBYSCORE', EXPIRING, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  forget(id, redis.call('HMGET', jkey(id), unpack(FORGET_FIELDS)))
end
return #ids
