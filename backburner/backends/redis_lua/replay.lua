-- ARGV: P, id, now, extra_attempts
local id, now = ARGV[2], ARGV[3]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', '_ty', '_sq', 'attempts', '_dl', '_ik', 'priority',
  '_pq', 'tenant', '_fc')
if not f[1] then return {'missing'} end
if f[1] ~= '"failed"' then return {'invalid', raw(f[1])} end
local ty, seq = f[2], tonumber(f[3])
redis.call('HSET', j, 'status', '"queued"', 'max_attempts', tonumber(f[4]) + tonumber(ARGV[4]),
  'run_at', now)
if f[5] then redis.call('HSET', j, 'deadline_at', num(tonumber(now) + tonumber(f[5]))) end
redis.call('HDEL', j, 'finished_at', 'expires_at', 'error', 'worker_id')
redis.call('PERSIST', j)
redis.call('PERSIST', skey(id))
redis.call('PERSIST', ekey(id))
if f[6] then redis.call('PERSIST', P .. 'k:' .. f[6]) end
expire_webhooks(id, nil) -- its messages stay as they are, and live as long as it does
redis.call('ZREM', EXPIRING, id)
reindex(id, ty, seq, 'failed', 'queued')
redis.call('HINCRBY', QPRIO, f[7], 1)
local tenant = cjson.decode(f[9])
redis.call('HINCRBY', INFLIGHT, tenant, 1)
event(id, 'status', '{"status":"queued","replayed":true}', now)
enqueue_ready(id, ty, f[8], fair_tag(tenant, f[8], f[10]), f[3], now) -- its line's back
return {'ok', read_job(id)}
