-- ARGV: P, id, now, extra_attempts, max_in_flight|'', cancelled_too 0|1
-- Refused ({'quota', tenant}, nothing written) when the job's tenant has max_in_flight jobs
-- queued or processing, unless it is a pipeline's child (children are not counted). Everything is read and checked before the first write, so no input
-- makes the script fail half-way (a job queued in no queue, a count off by one).
local id, now = ARGV[2], ARGV[3]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', '_ty', '_sq', 'attempts', '_dl', '_ik', 'priority',
  '_pq', 'tenant', '_fc', 'parent_id', '_es')
if not f[1] then return {'missing'} end
local was = raw(f[1])
if not (was == 'failed' or (was == 'cancelled' and ARGV[6] == '1')) then
  return {'invalid', was}
end
local ty, sq, seq, priority, pq, tenant, cost = job_line(id, f[2], f[3], f[7], f[8], f[9],
  f[10])
if not ty then return redis.error_reply('job ' .. id .. ' has no task type') end
if ARGV[5] ~= '' and not parent_of(f[11]) then -- (a child counts as its parent's work)
  local in_flight = tonumber(redis.call('HGET', INFLIGHT, tenant)) or 0
  if in_flight >= tonumber(ARGV[5]) then return {'quota', tenant} end
end
local max_attempts = (tonumber(f[4]) or 0) + tonumber(ARGV[4])
local lasts = tonumber(f[5]) -- a deadline restarts from now with the same length

redis.call('HSET', j, 'status', '"queued"', 'max_attempts', max_attempts, 'run_at', now)
if lasts then redis.call('HSET', j, 'deadline_at', num(tonumber(now) + lasts)) end
redis.call('HDEL', j, 'finished_at', 'expires_at', 'error', 'worker_id')
redis.call('PERSIST', j)
redis.call('PERSIST', skey(id))
redis.call('PERSIST', ekey(id))
if f[6] then redis.call('PERSIST', P .. 'k:' .. f[6]) end
expire_webhooks(id, nil) -- its messages stay as they are, and live as long as it does
redis.call('ZREM', EXPIRING, id)
reindex(id, ty, seq, was, 'queued')
redis.call('HINCRBY', QPRIO, priority, 1)
join_flight(tenant, parent_of(f[11]))
event(id, 'status', '{"status":"queued","replayed":true}', now, f[12])
local tag = fair_tag(tenant, ty, pq, cost) -- to the back of its tenant's line
enqueue_ready(id, ty, pq, tag, sq, now)
return {'ok', read_job(id)}
