-- ARGV: P, id, fence, now, msg_id, event. A task.progress message for a running job that has a
-- webhook_url and opted in (webhook_progress), unless its last one still waits unsent (the
-- job's _whp names it: pending, with no attempt made, so its body is made from the job's
-- progress when it goes; one on its way with older progress is followed by another, which the
-- dispatcher adds when it has gone: see dispatcher.py).
-- Returns {'lost'} (not processing under fence), {'ok', 1} if written, else {'ok', 0}.
local id, now, msg = ARGV[2], ARGV[4], ARGV[5]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', 'fence', 'webhook_url', 'webhook_progress', '_whp')
if f[1] ~= '"processing"' or f[2] ~= ARGV[3] then return {'lost'} end
if not f[3] or f[4] ~= 'true' then return {'ok', 0} end
if f[5] then
  local w = redis.call('HMGET', whk(f[5]), 'status', 'body')
  if w[1] == '"pending"' and not w[2] then return {'ok', 0} end
end
add_webhook(id, f[3], msg, ARGV[6], now)
redis.call('HSET', j, '_whp', msg)
return {'ok', 1}
