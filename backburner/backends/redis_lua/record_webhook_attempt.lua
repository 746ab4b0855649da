-- ARGV: P, msg_id, attempt JSON, status JSON text, next_at|'', body JSON text
-- A message deleted meanwhile (with its job) is ignored. The first attempt fixes the body.
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
else
  redis.call('HDEL', m, 'next_at')
  redis.call('ZREM', WH_DUE, msg)
end
return 1
