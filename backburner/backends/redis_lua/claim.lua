-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, limit, type, type, ... (no types: any)
-- A claim ends the worker's idle registration: nothing is handed to it while it claims.
local wid, wjson, now, lease = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit = tonumber(ARGV[6])
end_idle(wid)

-- Delayed jobs that are due join their tenants' lines, by run_at, then enqueue order.
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 1000)
for _, m in ipairs(due) do
  local id = string.sub(m, 13)
  local f = redis.call('HMGET', jkey(id), '_ty', '_pq', 'tenant', '_fc', 'run_at', 'status',
    'priority')
  if f[6] == '"queued"' and tonumber(f[5]) then -- (one without a type or run_at is dropped)
    local ty, sq, _, _, pq, tenant, cost = job_line(id, f[1], string.sub(m, 1, 12), f[7], f[2],
      f[3], f[4])
    if ty then add_ready(id, ty, pq, fair_tag(tenant, ty, pq, cost), sq, f[5]) end
  end
  redis.call('ZREM', DELAYED, m)
end

return claim_jobs(types_from(7), limit, wid, wjson, now, lease)
