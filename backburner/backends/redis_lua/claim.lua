-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, limit, run_code of now,
--       type, type, ... (no types: any)
local wid, wjson, now, lease = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit = tonumber(ARGV[6])

local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  local f = redis.call('HMGET', jkey(id), '_ty', '_qm')
  if f[1] and f[2] then redis.call('ZADD', rkey(f[1]), 0, f[2] .. id) end
  redis.call('ZREM', DELAYED, id)
end

local types = types_from(8)

-- A ready job is due unless the clock of whoever queued it ran ahead of ours: skip those.
local now_code = ARGV[7]
local candidates, type_of = {}, {}
for _, ty in ipairs(types) do
  local found, offset = 0, 0
  while found < limit do
    local members = redis.call('ZRANGE', rkey(ty), '-', '+', 'BYLEX', 'LIMIT', offset, limit)
    for _, m in ipairs(members) do
      if string.sub(m, 4, 20) <= now_code then
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
for i = 1, math.min(limit, #candidates) do
  local m = candidates[i]
  local ty = type_of[m]
  local id = string.sub(m, 33)
  local j = jkey(id)
  redis.call('ZREM', rkey(ty), m)
  local f = redis.call('HMGET', j, 'attempts', 'fence', '_sq', 'priority')
  local attempt = tonumber(f[1]) + 1
  local cur = '{"attempt":' .. attempt .. ',"worker_id":' .. wjson .. ',"started_at":' .. now
  redis.call('HSET', j, 'status', '"processing"', 'attempts', attempt,
    'fence', tonumber(f[2]) + 1, 'worker_id', wjson, 'lease_expires_at', lease,
    'started_at', now, '_cur', cur)
  redis.call('HDEL', j, '_qm')
  redis.call('ZADD', LEASES, lease, id)
  reindex(id, ty, tonumber(f[3]), 'queued', 'processing')
  redis.call('HINCRBY', QPRIO, f[4], -1)
  event(id, 'status',
    '{"status":"processing","attempt":' .. attempt .. ',"worker_id":' .. wjson .. '}', now)
  out[#out + 1] = read_job(id)
end
return out
