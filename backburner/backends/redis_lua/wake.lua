-- ARGV: P, id, now
-- A queued job not due yet (in DELAYED, run_at > now) becomes due now: run_at = now, a fair
-- tag (it joins its tenant's line now, as a claim's move of a due delayed job would) and its
-- ready queue, with the wake-up an enqueue publishes. A job queued in its ready queue with a
-- run_at ahead of now (a clock ahead of the caller's) keeps its tag and gets run_at = now.
-- Anything else (missing, not queued, due already) returns 0 and changes nothing.
local id, now = ARGV[2], ARGV[3]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', 'run_at', '_ty', '_sq', 'priority', '_pq',
  'tenant', '_fc', '_tg')
if f[1] ~= '"queued"' then return 0 end
local run_at = tonumber(f[2])
if not run_at or run_at <= tonumber(now) then return 0 end
local ty, sq, _, _, pq, tenant, cost = job_line(id, f[3], f[4], f[5], f[6], f[7], f[8])
if not ty then return 0 end
if redis.call('ZREM', DELAYED, sq .. id) == 1 then
  redis.call('HSET', j, 'run_at', now)
  enqueue_ready(id, ty, pq, fair_tag(tenant, ty, pq, cost), sq, now)
  return 1
end
local tag = tonumber(f[9])
if tag and redis.call('ZREM', rkey(ty), ready_member(id, pq, tag, sq, f[2])) == 1 then
  redis.call('HSET', j, 'run_at', now)
  enqueue_ready(id, ty, pq, tag, sq, now)
  return 1
end
return 0
