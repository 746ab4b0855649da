-- ARGV: P, id, fence, now, only_if_lease_expired 0|1, msg_id, webhook event|'', want job 1|0,
-- next claim (JSON: {w: worker id, j: it as JSON, s: lease seconds, t: types or null, n: limit})
-- or '', kind, ...
--   complete: result, usage|'', event data
--   fail:     error, dead-letter ttl
--   retry:    error, run_at, delayed 0|1
--   release:  event data, usage|''|'{}' (the attempt's so far: '' leaves it, '{}' clears it)
--   wait:     event data, run_at, delayed 0|1, usage (as release's)
-- Returns {'lost'} or {'ok', the job as read_job makes it, next}; with want job 0, a completed
-- or failed job is not read back: {'ok', false, expires_at, progress percent, progress message
-- (JSON text) or nil, next}, what its caller cannot know from the job as it claimed it. next:
-- the jobs the next claim took for the worker (as claim returns them), in the same step: the
-- worker's freed slot is filled without a claim of its own (none asked: none).
local id, fence, now, msg, hook, kind = ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7], ARGV[10]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', 'fence', 'lease_expires_at', '_cur', '_ty', '_sq',
  'attempts', '_ttl', '_ik', 'priority', '_pq', 'webhook_url', 'tenant', '_fc', '_tg',
  'parent_id', '_hist', '_ev', '_pp', '_pm', '_es')
if f[1] ~= '"processing"' or f[2] ~= fence then return {'lost'} end
-- (Numbers are read from text only where they are used: tonumber of a timestamp runs strtod
-- twice, a tenth of a finish's instructions went to it.)
local now_n = tonumber(now)
if ARGV[5] == '1' then
  local lease_end = tonumber(f[3]) -- none: it cannot be running on a lease any more
  if lease_end and lease_end > now_n then return {'lost'} end
end

-- Everything is read and checked before the first write, so no input makes the script fail
-- half-way (a job queued in no queue, a count off by one).
if kind ~= 'complete' and kind ~= 'fail' and kind ~= 'retry' and kind ~= 'release'
  and kind ~= 'wait' then
  return redis.error_reply('unknown outcome ' .. tostring(kind))
end
local ty, sq, _, priority, pq, tenant, cost = job_line(id, f[5], f[6], f[10], f[11], f[13],
  f[14])
if not ty then return redis.error_reply('job ' .. id .. ' has no task type') end
local cur, ik = f[4], f[9]
local parent = parent_of(f[16]) -- a child counts as open until it is terminal
local attempts = kind ~= 'complete' and (tonumber(f[7]) or 0) or 0
local url = f[12] -- nil for a job of the previous release: its spec holds it
-- No message id: the caller saw the job has no webhook_url (its claim read spec and hash).
if not url and msg ~= '' and (kind == 'complete' or kind == 'fail') then
  url = spec_webhook_url(id)
end
local ttl = 0
if kind == 'complete' then ttl = job_ttl(id, f[8]) end
local tag = kind == 'release' and tonumber(f[15]) -- a Release puts the job back in its place
if kind == 'release' and not tag then -- none kept: at the front, at its queue's clock
  tag = tonumber(redis.call('HGET', fkey(ty), pq)) or 0
end
local ev = tonumber(f[18]) or 0 -- this transition's events take the seqs after it
-- With no stream, a Complete's, a Fail's or a RetryAt's events are made from the attempt's
-- record (prelude: event), which notes the seq of the first ("ee"). Others make the stream.
local es = f[21]
local derive = cur and es == '0'
local first = string.format('%d', ev + 1)

-- The job's one HSET: the outcome's fields (sets), the attempt in progress closed into _hist
-- (a job without one has none to close; extra: more members of its record), and _ev past the
-- `events` events it appends.
local function write_job(sets, outcome, error_json, events, extra)
  if cur then
    sets[#sets + 1] = '_hist'
    sets[#sets + 1] = closed_history(f[17], cur, now, outcome, error_json, extra)
  end
  sets[#sets + 1] = '_ev'
  sets[#sets + 1] = string.format('%d', ev + events)
  redis.call('HSET', j, unpack(sets))
end

-- A Wait's or a Release's usage argument: '' (or none) leaves the job's, '{}' clears it, else
-- it is the attempt's so far (redis_outcomes._usage_arg).
local function set_usage(sets, usage)
  if not usage or usage == '' then return end
  if usage == '{}' then
    redis.call('HDEL', j, 'usage')
    return
  end
  sets[#sets + 1] = 'usage'
  sets[#sets + 1] = usage
end

-- Set for a terminal outcome, what a caller not reading the job needs: expires (a number, and
-- as text: expires_at) and the progress percent.
local expires, expires_at, percent
zwrite('ZREM', LEASES, id)
if kind == 'complete' then
  expires, percent = now_n + ttl, '100'
  expires_at = num(expires)
  local sets = {'status', '"completed"', 'result', ARGV[11], 'finished_at', now,
    'expires_at', expires_at, '_pp', percent}
  if ARGV[12] ~= '' then
    sets[#sets + 1] = 'usage'
    sets[#sets + 1] = ARGV[12]
  end
  write_job(sets, 'completed', nil, 1, derive and ',"ee":' .. first or nil)
  if not derive then event_at(id, ev + 1, 'status', ARGV[13], now) end
  redis.call('HDEL', j, 'error', 'lease_expires_at', '_tg', '_cur')
  reindex(id, ty, sq, 'processing', 'completed')
  leave_flight(tenant, parent)
  write_webhook(id, url, msg, hook, now, make_terminal(id, ik, expires, now_n, expires_at))
elseif kind == 'fail' then
  local err = ARGV[11]
  expires, percent = now_n + tonumber(ARGV[12]), f[19] or '0'
  expires_at = num(expires)
  write_job({'status', '"failed"', 'error', err, 'finished_at', now, 'expires_at', expires_at},
    'failed', err, 2, derive and ',"ee":' .. first or nil)
  redis.call('HDEL', j, 'lease_expires_at', '_tg', '_cur')
  reindex(id, ty, sq, 'processing', 'failed')
  leave_flight(tenant, parent)
  if not derive then
    event_at(id, ev + 1, 'attempt_failed', '{"error":' .. err .. ',"attempt":' .. attempts .. '}',
      now)
    event_at(id, ev + 2, 'status', '{"status":"failed","error":' .. err .. '}', now)
  end
  write_webhook(id, url, msg, hook, now, make_terminal(id, ik, expires, now_n, expires_at))
elseif kind == 'retry' then
  local err, run_at = ARGV[11], ARGV[12]
  write_job({'status', '"queued"', 'error', err, 'run_at', run_at}, 'retry', err, 2,
    derive and ',"ee":' .. first .. ',"ra":' .. run_at or nil)
  redis.call('HDEL', j, 'worker_id', 'lease_expires_at', '_cur')
  reindex(id, ty, sq, 'processing', 'queued')
  tally(QPRIO, priority, 1, false)
  if not derive then
    event_at(id, ev + 1, 'attempt_failed',
      '{"error":' .. err .. ',"retry_at":' .. run_at .. ',"attempt":' .. attempts .. '}', now)
    event_at(id, ev + 2, 'status', '{"status":"queued"}', now)
  end
  if ARGV[13] == '1' then
    enqueue_delayed(id, ty, sq, run_at)
  else -- due now: to the back of its tenant's line
    enqueue_ready(id, ty, pq, fair_tag(tenant, ty, pq, cost), sq, run_at)
  end
elseif kind == 'wait' then -- a Release due at run_at: a new tag when due, like a RetryAt
  local run_at = ARGV[12]
  local sets = {'status', '"queued"', 'attempts', math.max(0, attempts - 1), 'run_at', run_at,
    '_es', '1'} -- (its event makes the stream, if there was none)
  set_usage(sets, ARGV[14])
  write_job(sets, 'waiting', nil, 1)
  redis.call('HDEL', j, 'worker_id', 'lease_expires_at', '_cur')
  reindex(id, ty, sq, 'processing', 'queued')
  tally(QPRIO, priority, 1, false)
  event_at(id, ev + 1, 'status', ARGV[11], now)
  if ARGV[13] == '1' then
    enqueue_delayed(id, ty, sq, run_at)
  else -- due now: to the back of its tenant's line
    enqueue_ready(id, ty, pq, fair_tag(tenant, ty, pq, cost), sq, run_at)
  end
else -- release
  local sets = {'status', '"queued"', 'attempts', math.max(0, attempts - 1), 'run_at', now,
    '_es', '1'} -- (its event makes the stream, if there was none)
  set_usage(sets, ARGV[12])
  write_job(sets, 'released', nil, 1)
  redis.call('HDEL', j, 'worker_id', 'lease_expires_at', '_cur')
  reindex(id, ty, sq, 'processing', 'queued')
  tally(QPRIO, priority, 1, false)
  event_at(id, ev + 1, 'status', ARGV[11], now)
  enqueue_ready(id, ty, pq, tag, sq, now)
end
-- The reply shows the job as this outcome left it: read before a claim could take it again
-- (a retry due now, claimed back by its own worker).
local reply
if ARGV[8] == '0' and expires then
  reply = {'ok', false, expires_at, percent, f[20]}
else
  reply = {'ok', read_job(id)}
end
local claimed = {}
if ARGV[9] ~= '' then
  local ask = next_claim(ARGV[9])
  if ask then
    local types = ask.t
    if type(types) ~= 'table' then types = redis.call('SMEMBERS', P .. 'types') end
    claimed = claim_for(ask.w, ask.j, now, lease_until(now, ask.s), types, tonumber(ask.n) or 1)
  end
end
reply[#reply + 1] = claimed
return reply
