-- ARGV: P, id, now, msg_id, webhook event
local id, now = ARGV[2], ARGV[3]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', '_ty', '_sq', '_tg', 'worker_id', 'fence', '_cur',
  '_ttl', '_ik', 'priority', 'webhook_url', 'tenant', '_pq', 'run_at')
if not f[1] then return {'missing'} end
local status = raw(f[1])
if TERMINAL[status] then return {'unchanged', read_job(id)} end
local ty, url = f[2], f[11]
if not url then url = spec_webhook_url(id) end -- a job of the previous release
if status == 'queued' then
  if f[4] then -- it was tagged (a delayed job's stale tag names no member: nothing removed)
    redis.call('ZREM', rkey(ty), ready_member(id, f[13], f[4], f[3], f[14]))
  end
  redis.call('ZREM', DELAYED, f[3] .. id)
  redis.call('HINCRBY', QPRIO, f[10], -1)
elseif status == 'processing' then
  close_history(id, f[7], now, 'cancelled', nil)
  redis.call('ZREM', LEASES, id)
  local signals = P .. 'c:' .. cjson.decode(f[5])
  redis.call('HSET', signals, id, f[6])
  redis.call('EXPIRE', signals, 86400)
end
local expires = tonumber(now) + tonumber(f[8])
redis.call('HSET', j, 'status', '"cancelled"', 'finished_at', now, 'expires_at', num(expires))
redis.call('HDEL', j, 'lease_expires_at', '_tg')
reindex(id, ty, tonumber(f[3]), status, 'cancelled')
if f[12] then leave_flight(cjson.decode(f[12])) end
event(id, 'status', '{"status":"cancelled"}', now)
write_webhook(id, url, ARGV[4], ARGV[5], now, make_terminal(id, f[9], expires, now))
return {'ok', read_job(id)}
