-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, limit, type, type, ... (no types: any)
local wid, wjson, now, lease = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit = tonumber(ARGV[6])

-- Delayed jobs that are due join their tenants' lines, by run_at, then enqueue order.
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 1000)
for _, m in ipairs(due) do
  local id = string.sub(m, 13)
  local f = redis.call('HMGET', jkey(id), '_ty', '_pq', 'tenant', '_fc', 'run_at', 'status')
  if f[1] and f[6] == '"queued"' then
    local tag = fair_tag(cjson.decode(f[3]), f[2], f[4])
    add_ready(id, f[1], f[2], tag, string.sub(m, 1, 12), f[5]) -- a claim is looking now
  end
  redis.call('ZREM', DELAYED, m)
end

local types = types_from(7)

-- A ready job is due unless the clock of whoever queued it ran ahead of ours: skip those.
local now_code = run_code(now)
local candidates, type_of = {}, {}
for _, ty in ipairs(types) do
  local found, offset = 0, 0
  while found < limit do
    local members = redis.call('ZRANGE', rkey(ty), '-', '+', 'BYLEX', 'LIMIT', offset, limit)
    for _, m in ipairs(members) do
      if string.sub(m, M_RUN, M_ID - 1) <= now_code then
        candidates[#candidates + 1] = m
        type_of[m] = ty
        found = found + 1
      end
    end
    if #members < limit or offset > 20 * limit then break end
    offset = offset + limit
  end
end
if #types > 1 then table.sort(candidates) end

local out = {}
local clocks = {} -- priority code -> the largest tag claimed at it
for i = 1, math.min(limit, #candidates) do
  local m = candidates[i]
  local ty = type_of[m]
  local id = string.sub(m, M_ID)
  local j = jkey(id)
  redis.call('ZREM', rkey(ty), m)
  local pq, tag = string.sub(m, 1, 3), tonumber(string.sub(m, M_TAG, M_SEQ - 1))
  if not clocks[pq] or tag > clocks[pq] then clocks[pq] = tag end
  local f = redis.call('HMGET', j, 'attempts', 'fence', '_sq', 'priority')
  local attempt = tonumber(f[1]) + 1
  local cur = '{"attempt":' .. attempt .. ',"worker_id":' .. wjson .. ',"started_at":' .. now
  redis.call('HSET', j, 'status', '"processing"', 'attempts', attempt,
    'fence', tonumber(f[2]) + 1, 'worker_id', wjson, 'lease_expires_at', lease,
    'started_at', now, '_cur', cur)
  redis.call('ZADD', LEASES, lease, id)
  reindex(id, ty, tonumber(f[3]), 'queued', 'processing')
  redis.call('HINCRBY', QPRIO, f[4], -1)
  event(id, 'status',
    '{"status":"processing","attempt":' .. attempt .. ',"worker_id":' .. wjson .. '}', now)
  out[#out + 1] = read_job(id)
end
-- Claiming moves each priority's clock up to the largest tag claimed (never down: a released
-- job keeps an older tag).
for pq, tag in pairs(clocks) do
  local clock = tonumber(redis.call('HGET', FAIR, pq))
  if not clock or tag > clock then redis.call('HSET', FAIR, pq, string.format('%.0f', tag)) end
end
return out
