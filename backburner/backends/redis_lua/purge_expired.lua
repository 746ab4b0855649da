-- ARGV: P, now, limit, forget_before (workers last seen before it are forgotten)
local ids = redis.call('ZRANGEBYSCORE', EXPIRING, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  forget(id, redis.call('HMGET', jkey(id), unpack(FORGET_FIELDS)))
end
-- A worker's record is "<started> <last seen> <running>" (heartbeat.lua).
local workers, before, gone = redis.call('HGETALL', P .. 'workers'), tonumber(ARGV[4]), {}
for i = 1, #workers, 2 do
  local seen = tonumber(string.match(workers[i + 1], '^[^ ]+ ([^ ]+)'))
  if not seen or seen < before then gone[#gone + 1] = workers[i] end
end
in_chunks('HDEL', P .. 'workers', gone)
return #ids
