-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, limit, type, type, ... (no types: any)
local wid, wjson, now, lease = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit = tonumber(ARGV[6])

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
local clocks = {} -- type -> priority code -> the largest tag claimed from that queue
-- The index writes of all claimed jobs go out as one variadic command per key after the
-- loop: a command costs about as much as the member it moves, so per job they were the
-- larger part of a claim.
local ready_out, queued_out, processing_in = {}, {}, {} -- type -> ZREM/ZADD arguments
local all_ids, all_seqs, leases, prios = {}, {}, {}, {}
for i = 1, math.min(limit, #candidates) do
  local m = candidates[i]
  local ty = type_of[m]
  local id = string.sub(m, M_ID)
  local j = jkey(id)
  local seq = tonumber(string.sub(m, M_SEQ, M_RUN - 1))
  if not ready_out[ty] then ready_out[ty], queued_out[ty], processing_in[ty] = {}, {}, {} end
  table.insert(ready_out[ty], m)
  table.insert(queued_out[ty], id)
  table.insert(processing_in[ty], seq)
  table.insert(processing_in[ty], id)
  table.insert(all_ids, id)
  table.insert(all_seqs, seq)
  table.insert(all_seqs, id)
  table.insert(leases, lease)
  table.insert(leases, id)
  local pq, tag = string.sub(m, 1, 3), tonumber(string.sub(m, M_TAG, M_SEQ - 1))
  local top = clocks[ty]
  if not top then top = {}; clocks[ty] = top end
  if not top[pq] or tag > top[pq] then top[pq] = tag end
  local f = redis.call('HMGET', j, 'attempts', 'fence', 'priority', '_ev')
  local attempt = (tonumber(f[1]) or 0) + 1
  local ev = (tonumber(f[4]) or 0) + 1 -- the seq of its status event
  local cur = '{"attempt":' .. attempt .. ',"worker_id":' .. wjson .. ',"started_at":' .. now
  redis.call('HSET', j, 'status', '"processing"', 'attempts', attempt,
    'fence', (tonumber(f[2]) or 0) + 1, 'worker_id', wjson, 'lease_expires_at', lease,
    'started_at', now, '_cur', cur, '_ev', ev)
  local priority = f[3] or string.format('%d', 100 - tonumber(pq))
  prios[priority] = (prios[priority] or 0) + 1
  event_at(id, ev, 'status',
    '{"status":"processing","attempt":' .. attempt .. ',"worker_id":' .. wjson .. '}', now)
  out[#out + 1] = read_job(id)
end
-- A command with the arguments args, 1,000 at a time (unpack has a limit; 1,000 keeps pairs).
local function in_chunks(command, key, args)
  for first = 1, #args, 1000 do
    redis.call(command, key, unpack(args, first, math.min(#args, first + 999)))
  end
end
in_chunks('ZADD', LEASES, leases)
in_chunks('ZREM', P .. 'i:s:queued', all_ids)
in_chunks('ZADD', P .. 'i:s:processing', all_seqs)
for ty, members in pairs(ready_out) do
  in_chunks('ZREM', rkey(ty), members)
  in_chunks('ZREM', P .. 'i:st:queued:' .. ty, queued_out[ty])
  in_chunks('ZADD', P .. 'i:st:processing:' .. ty, processing_in[ty])
end
for priority, count in pairs(prios) do redis.call('HINCRBY', QPRIO, priority, -count) end
-- Claiming moves each queue's clock up to the largest tag claimed from it (never down: a
-- released job keeps an older tag). Only that queue's: another type's tenants keep their place.
for ty, top in pairs(clocks) do
  local key = fkey(ty)
  for pq, tag in pairs(top) do
    local clock = tonumber(redis.call('HGET', key, pq))
    if tag > (clock or 0) then redis.call('HSET', key, pq, string.format('%.0f', tag)) end
  end
end
return out
