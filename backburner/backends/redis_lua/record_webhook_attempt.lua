-- ARGV: P, msg_id, claim, attempt JSON, status JSON text, next_at|'', body JSON text,
--       attempt's at
-- Applies only to a message still pending under claim (the number claim_webhooks handed out
-- with it): a message deleted meanwhile (with its job), settled, claimed again after the lease
-- ended, or redelivered is left as it is, and 0 returned; else 1. An applied attempt counts a
-- try; the first one fixes the body. A settled message goes into WH_DELIVERED or WH_FAILED,
-- scored by the attempt's time. A pending one's job is kept until an hour past its next
-- attempt at least (outbox.WEBHOOK_KEEP_S): a long Retry-After would outlast it.
local msg, status = ARGV[2], ARGV[5]
local m = whk(msg)
local f = redis.call('HMGET', m, 'status', 'claim', 'attempts', 'body')
if f[1] ~= '"pending"' or tonumber(f[2] or '0') ~= tonumber(ARGV[3]) then return 0 end
local log = string.sub(f[3], 1, -2) -- the array without its closing bracket
if log ~= '[' then log = log .. ',' end
redis.call('HSET', m, 'attempts', log .. ARGV[4] .. ']', 'status', status)
redis.call('HINCRBY', m, 'tries', 1)
if not f[4] then redis.call('HSET', m, 'body', ARGV[7]) end
if status == '"pending"' then
  redis.call('HSET', m, 'next_at', ARGV[6])
  redis.call('ZADD', WH_DUE, ARGV[6], msg)
  redis.call('ZREM', WH_DELIVERED, msg)
  redis.call('ZREM', WH_FAILED, msg)
  local id = json_string(redis.call('HGET', m, 'task_id'))
  if id then keep_job_until(id, tonumber(ARGV[6]) + 3600, ARGV[8]) end
else
  redis.call('HDEL', m, 'next_at')
  redis.call('ZREM', WH_DUE, msg)
  if status == '"delivered"' then
    redis.call('ZADD', WH_DELIVERED, ARGV[8], msg)
    redis.call('ZREM', WH_FAILED, msg)
  else
    redis.call('ZADD', WH_FAILED, ARGV[8], msg)
    redis.call('ZREM', WH_DELIVERED, msg)
  end
end
return 1
