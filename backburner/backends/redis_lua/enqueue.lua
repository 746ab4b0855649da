-- ARGV: P, id, type, spec, fingerprint, idempotency_key|'', max_queue|'', priority_code,
--       run_at, delayed 0|1, created_at, priority, tenant, fair cost, max_in_flight|'',
--       per_minute|'', parent_id|'', field, value, ... (the parent_id field too, as JSON; not
--       the fields written here from the other arguments: redis_codec.new_job_fields)
-- Checks in the order of Backend.enqueue; a refusal writes nothing.
local id, ty, spec, fp, ik = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local tenant = ARGV[13]
local tenant_json = cjson.encode(tenant)
local parent = ARGV[17] ~= '' and ARGV[17] or nil
if redis.call('EXISTS', jkey(id), skey(id)) > 0 then return {'exists'} end
if ik ~= '' then
  local other = redis.call('GET', P .. 'k:' .. ik)
  if other then
    local held = redis.call('HMGET', jkey(other), '_fp', 'tenant')
    local other_fp = held[1]
    if other_fp then
      -- A key belongs to one tenant: another tenant's job is neither returned nor named.
      if held[2] ~= tenant_json then return {'conflict', ''} end
      if other_fp ~= fp then return {'conflict', other} end
      -- A write all the same: a WAIT behind this repeat (?replicas=N) waits for the replicas
      -- to have everything written before it, the first enqueue's write included.
      redis.call('INCR', P .. 'seq')
      return {'duplicate', read_job(other)}
    end
  end
end
if ARGV[7] ~= '' then
  local queued = count_status('queued')
  if queued >= tonumber(ARGV[7]) then return {'full', queued} end
end
if ARGV[15] ~= '' then
  local in_flight = tonumber(redis.call('HGET', INFLIGHT, tenant) or 0)
  if in_flight >= tonumber(ARGV[15]) then return {'quota'} end
end
local tat = nil -- GCRA, as backends/admission.py rate_check, with created_at as now
if ARGV[16] ~= '' then
  local now, window = tonumber(ARGV[11]), 60.0
  local stored = tonumber(redis.call('HGET', RATES, tenant))
  local start = now
  if stored and stored >= now then start = stored end
  local after = start + window / tonumber(ARGV[16])
  local wait = after - now - window
  if wait > 1e-9 then return {'rate', num(wait)} end
  tat = after
end
local seq = redis.call('INCR', P .. 'seq')
local sq = string.format('%012d', seq)
local j, now = jkey(id), ARGV[11]
local fields = {unpack(ARGV, 18)}
-- The first event ("queued", seq 1) is not stored: read_events makes it from _ca. The job
-- has no stream yet (_es '0'): it gets one when it needs one (prelude: event).
local delayed, pq = ARGV[10] == '1', ARGV[8]
-- An idle worker may take a job due now at once (prelude: idle_taker). With this type's queue
-- empty the job is the one its claim would take: it is written as that claim leaves a job,
-- never queued (a third of the commands of queueing it and claiming it back). Behind other
-- ready jobs, the queue's head is handed instead (hand_head).
local taker, reg, reg_text = nil, nil, nil
if not delayed then taker, reg, reg_text = idle_taker(ty, now) end
local claimed = taker ~= nil and redis.call('EXISTS', rkey(ty)) == 0
-- A job due now joins its tenant's line at once: its tag goes in with the rest of its hash.
local tag, known = nil, false
if not delayed then
  tag, known = fair_tag(tenant, ty, pq, tonumber(ARGV[14]), claimed)
  fields[#fields + 1] = '_tg'
  fields[#fields + 1] = string.format('%d', tag)
end
-- A type whose clock was there is in {bb}:types (the enqueue that opened it added it): the
-- add follows the clock's write at once, so no error in between leaves a clock without it.
if not known then redis.call('SADD', P .. 'types', ty) end
-- Only a job with an idempotency key has a fingerprint to match (_fp), and progress 0 is what
-- an absent _pp reads as: every field fewer costs each of the job's later writes and reads.
if ik ~= '' then
  fields[#fields + 1] = '_fp'
  fields[#fields + 1] = fp
end
-- As claim_jobs writes a claimed job: attempt 1 under fence 1, its open attempt's record
-- standing for its "processing" event (seq 2), the lease from the worker's registration.
local status, attempts, ev, lease, cur = '"queued"', '0', '1', nil, nil
if claimed then
  status, attempts, ev = '"processing"', '1', '2'
  lease = num(tonumber(now) + tonumber(reg.l))
  cur = '{"attempt":1,"worker_id":' .. reg.j .. ',"started_at":' .. now .. ',"ev":2'
  for _, v in ipairs({'worker_id', reg.j, 'lease_expires_at', lease, 'started_at', now,
    '_cur', cur}) do
    fields[#fields + 1] = v
  end
end
redis.call('HSET', j, '_sq', sq, '_ev', ev, '_es', '0', '_ca', now, 'status', status,
  'priority', ARGV[12], 'attempts', attempts, 'fence', attempts, '_ty', ty, '_pq', pq,
  'tenant', tenant_json, '_fc', ARGV[14], unpack(fields))
redis.call('SET', skey(id), spec)
if ik ~= '' then redis.call('SET', P .. 'k:' .. ik, id) end
if tat then redis.call('HSET', RATES, tenant, num(tat)) end
join_flight(tenant, parent)
-- Scored by sq, the seq as text: a number would be written out as a double, a printf each.
redis.call('ZADD', P .. 'i:all', sq, id)
redis.call('ZADD', nkey(tenant), sq, id)
if parent then redis.call('ZADD', pkey(parent), sq, id) end
if claimed then
  reindex(id, ty, sq, nil, 'processing')
  end_idle(taker, reg_text, reg)
  redis.call('ZADD', LEASES, lease_score(lease), id)
  -- Its document from what was just written, not read back: the hash holds just these.
  local written = {priority = ARGV[12], tenant = tenant_json}
  for i = 1, #fields, 2 do written[fields[i]] = fields[i + 1] end
  local doc = read_job(id, {status, attempts, attempts, reg.j, lease, now, cur}, spec, written)
  redis.call('PUBLISH', P .. 'hand:' .. taker, doc)
  return {'ok'}
end
reindex(id, ty, sq, nil, 'queued')
redis.call('HINCRBY', QPRIO, ARGV[12], '1')
if delayed then
  enqueue_delayed(id, ty, sq, ARGV[9])
else
  redis.call('ZADD', rkey(ty), '0', ready_member(id, pq, tag, sq, ARGV[9]))
  -- Else the waiters of its type are woken to claim it.
  if not (taker and hand_head(ty, now, taker, reg, reg_text)) then
    redis.call('PUBLISH', WAKE, ty)
  end
end
return {'ok'}
