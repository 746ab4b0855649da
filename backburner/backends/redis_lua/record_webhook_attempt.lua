-- ARGV: P, msg_id, attempt JSON, status JSON text, next_at|'', body JSON text, attempt's at
-- A message deleted meanwhile (with its job) is ignored. The first attempt fixes the body. A
-- settled message goes into WH_DELIVERED or WH_FAILED, scored by the attempt's time.
local msg, status = ARGV[2], ARGV[4]
local m = whk(msg)
local f = redis.call('HMGET', m, 'attempts', 'body')
if not f[1] then return 0 end
local log = string.sub(f[1], 1, -2) -- the array without its closing bracket
if log ~= '[' then log = log .. ',' end
redis.call('HSET', m, 'attempts', log .. ARGV[3] .. ']', 'status', status)
if not f[2] then redis.call('HSET', m, 'body', ARGV[6]) end
if status == '"pending"' then
  redis.call('HSET', m, 'next_at', ARGV[5])
  redis.call('ZADD', WH_DUE, ARGV[5], msg)
  redis.call('ZREM', WH_DELIVERED, msg)
  redis.call('ZREM', WH_FAILED, msg)
else
  redis.call('HDEL', m, 'next_at')
  redis.call('ZREM', WH_DUE, msg)
  if status == '"delivered"' then
    redis.call('ZADD', WH_DELIVERED, ARGV[7], msg)
    redis.call('ZREM', WH_FAILED, msg)
  else
    redis.call('ZADD', WH_FAILED, ARGV[7], msg)
    redis.call('ZREM', WH_DELIVERED, msg)
  end
end
return 1
