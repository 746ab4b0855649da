-- ARGV: P, id, fence, type, data, now, [progress_percent, [progress_message as JSON]]
local id = ARGV[2]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', 'fence', '_es')
if f[1] ~= '"processing"' or f[2] ~= ARGV[3] then return {'lost'} end
if ARGV[7] then
  redis.call('HSET', j, '_pp', ARGV[7])
  if ARGV[8] then redis.call('HSET', j, '_pm', ARGV[8]) else redis.call('HDEL', j, '_pm') end
end
return {'ok', event(id, ARGV[4], ARGV[5], ARGV[6], f[3])}
