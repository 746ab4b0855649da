-- ARGV: P, id, fence, now, only_if_lease_expired 0|1, msg_id, webhook event|'', kind, ...
--   complete: result, usage|'', event data
--   fail:     error, dead-letter ttl
--   retry:    error, run_at, delayed 0|1
--   release:  event data
local id, fence, now, msg, hook, kind = ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7], ARGV[8]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', 'fence', 'lease_expires_at', '_cur', '_ty', '_sq',
  'attempts', '_ttl', '_ik', 'priority', '_pq', 'webhook_url', 'tenant', '_fc', '_tg')
if f[1] ~= '"processing"' or f[2] ~= fence then return {'lost'} end
if ARGV[5] == '1' and tonumber(f[3]) > tonumber(now) then return {'lost'} end
local cur, ty, seq, attempts, ik = f[4], f[5], tonumber(f[6]), f[7], f[9]
local url = f[12] -- nil for a job of the previous release: its spec holds it
if not url and (kind == 'complete' or kind == 'fail') then url = spec_webhook_url(id) end
redis.call('ZREM', LEASES, id)

if kind == 'complete' then
  close_history(id, cur, now, 'completed', nil)
  local expires = tonumber(now) + tonumber(f[8])
  redis.call('HSET', j, 'status', '"completed"', 'result', ARGV[9], 'finished_at', now,
    'expires_at', num(expires), '_pp', '100')
  if ARGV[10] ~= '' then redis.call('HSET', j, 'usage', ARGV[10]) end
  redis.call('HDEL', j, 'error', 'lease_expires_at', '_tg')
  reindex(id, ty, seq, 'processing', 'completed')
  if f[13] then leave_flight(cjson.decode(f[13])) end
  event(id, 'status', ARGV[11], now)
  write_webhook(id, url, msg, hook, now, make_terminal(id, ik, expires, now))
elseif kind == 'fail' then
  local err = ARGV[9]
  close_history(id, cur, now, 'failed', err)
  local expires = tonumber(now) + tonumber(ARGV[10])
  redis.call('HSET', j, 'status', '"failed"', 'error', err, 'finished_at', now,
    'expires_at', num(expires))
  redis.call('HDEL', j, 'lease_expires_at', '_tg')
  reindex(id, ty, seq, 'processing', 'failed')
  if f[13] then leave_flight(cjson.decode(f[13])) end
  event(id, 'attempt_failed', '{"error":' .. err .. ',"attempt":' .. attempts .. '}', now)
  event(id, 'status', '{"status":"failed","error":' .. err .. '}', now)
  write_webhook(id, url, msg, hook, now, make_terminal(id, ik, expires, now))
elseif kind == 'retry' then
  local err, run_at = ARGV[9], ARGV[10]
  close_history(id, cur, now, 'retry', err)
  redis.call('HSET', j, 'status', '"queued"', 'error', err, 'run_at', run_at)
  redis.call('HDEL', j, 'worker_id', 'lease_expires_at')
  reindex(id, ty, seq, 'processing', 'queued')
  redis.call('HINCRBY', QPRIO, f[10], 1)
  event(id, 'attempt_failed',
    '{"error":' .. err .. ',"retry_at":' .. run_at .. ',"attempt":' .. attempts .. '}', now)
  event(id, 'status', '{"status":"queued"}', now)
  if ARGV[11] == '1' then
    enqueue_delayed(id, ty, f[6], run_at)
  else -- due now: to the back of its tenant's line
    enqueue_ready(id, ty, f[11], fair_tag(cjson.decode(f[13]), f[11], f[14]), f[6], run_at)
  end
elseif kind == 'release' then
  close_history(id, cur, now, 'released', nil)
  redis.call('HSET', j, 'status', '"queued"', 'attempts', tonumber(attempts) - 1, 'run_at', now)
  redis.call('HDEL', j, 'worker_id', 'lease_expires_at')
  reindex(id, ty, seq, 'processing', 'queued')
  redis.call('HINCRBY', QPRIO, f[10], 1)
  event(id, 'status', ARGV[9], now)
  -- Its place in its tenant's line is kept: the tag it was claimed with.
  enqueue_ready(id, ty, f[11], f[15], f[6], now)
else
  return redis.error_reply('unknown outcome ' .. kind)
end
return {'ok', read_job(id)}
