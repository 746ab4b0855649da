-- Shared by every script (prepended at load time). ARGV[1] is the key prefix, which ends in
-- a hash tag ("{bb}:"), so every key a script touches lives in one Redis Cluster slot.
-- Job hash fields named like Job fields hold JSON text; fields starting with "_" are ours.
local P = ARGV[1]
local TERMINAL = {completed = true, failed = true, cancelled = true}
local GRACE = 3600 -- EXPIRE backstop beyond expires_at; the sweeper purges indexes first

local function jkey(id) return P .. 'j:' .. id end
local function skey(id) return P .. 's:' .. id end
local function ekey(id) return P .. 'e:' .. id end
local function rkey(ty) return P .. 'r:' .. ty end
local DELAYED = P .. 'delayed'
local LEASES = P .. 'leases'
-- A job's score in LEASES: its lease's end (text) in whole seconds, rounded down. Redis keeps a
-- small sorted set (128 members) as a flat list, where an integer score is compared as is but
-- a fractional one is parsed from text at every step: adding a claim's 25 leases to 100 cost
-- 4 to 5 times as much (a microbenchmark). The sweeper checks each job's exact end
-- (redis_reads.py expired_leases).
local function lease_score(lease) return string.format('%d', math.floor(tonumber(lease))) end
local EXPIRING = P .. 'expiring'
local QPRIO = P .. 'qprio'
local WAKE = P .. 'wake'
local INFLIGHT = P .. 'inflight' -- tenant -> its jobs queued or processing
local RATES = P .. 'rates'       -- tenant -> its submission bucket's theoretical arrival time
local function nkey(tenant) return P .. 'i:n:' .. tenant end
-- Pipelines: a parent's children by seq (its listing index), and OPEN: parent id -> its
-- children queued or processing (has_open_children; no field: none).
local function pkey(parent) return P .. 'i:p:' .. parent end
local OPEN = P .. 'open'
-- Fair-share state of one task type's ready queues (one per priority): <pq> -> the clock of
-- the queue at priority code pq (3 digits), <pq>:<tenant> -> the tenant's last tag in it. The
-- fixed width of pq keeps the two kinds of field apart, whatever a tenant's name holds.
local function fkey(ty) return P .. 'fair:' .. ty end
-- <priority code> -> the largest clock of any type's queue at that priority (fair_level).
local FAIRTOP = P .. 'fairtop'
local DEFAULT_TENANT = 'default' -- base.DEFAULT_TENANT
local FAIR_SCALE = 10000         -- base.FAIR_SCALE: the fair cost of a job of weight 1

-- Exact text for a double: 17 significant digits always read back as the same number.
local function num(x) return string.format('%.17g', x) end
local function raw(json_string) return string.sub(json_string, 2, -2) end

-- The task types in ARGV from index first on; none given means every type ever enqueued.
local function types_from(first)
  if #ARGV < first then return redis.call('SMEMBERS', P .. 'types') end
  local types = {}
  for i = first, #ARGV do types[#types + 1] = ARGV[i] end
  return types
end

-- A command with the arguments args, 1,000 at a time (unpack has a limit; 1,000 keeps pairs).
local function in_chunks(command, key, args)
  for first = 1, #args, 1000 do
    redis.call(command, key, unpack(args, first, math.min(#args, first + 999)))
  end
end

-- The writes a batch of finishes (finish_many) gathers while its groups run and makes after
-- them, one variadic command per key and command: a command costs Redis about as much as the
-- one member it moves, so per job they were a large part of a finish. nil (every other
-- script, a finish alone): each is made at once. Only writes that nothing in the batch reads
-- before its end go here (index entries, counters), of members no two groups share (a finish
-- that applies takes its job out of processing, so the job's next finish in the batch is lost).
-- LATER: a list of {command, key, args}, and LATER[command .. ' ' .. key] = that entry.
-- Nothing may claim while it is set: claim_jobs writes at once, and a move it made would be
-- undone by a gathered one (finish_many claims after write_later; its groups never do).
local LATER = nil

-- A new entry of the batch for command on key: {command, key, {}, drop}. (Callers look
-- theirs up first, inline: a function call per write cost a finish 1.5% of its instructions.)
local function later(command, key, drop)
  local entry = {command, key, {}, drop}
  LATER[command .. ' ' .. key] = entry
  LATER[#LATER + 1] = entry
  return entry
end

-- ZADD key score member, or ZREM key member (b nil), now or with the batch's.
local function zwrite(command, key, a, b)
  if not LATER then
    if b then return redis.call(command, key, a, b) end
    return redis.call(command, key, a)
  end
  local args = (LATER[command .. ' ' .. key] or later(command, key))[3]
  args[#args + 1] = a
  if b then args[#args + 1] = b end
end

-- HINCRBY key field by, and HDEL the field when drop and the count fell to 0 or below: now,
-- or summed per field with the batch's (the same end, as the batch's counts only fall).
local function tally(key, field, by, drop)
  if not LATER then
    local left = redis.call('HINCRBY', key, field, string.format('%d', by))
    if left <= 0 and drop then redis.call('HDEL', key, field) end
    return
  end
  local counts = (LATER['HINCRBY ' .. key] or later('HINCRBY', key, drop))[3]
  counts[field] = (counts[field] or 0) + by
end

-- Make the batch's gathered writes, in the order their keys first came. One that fails (a
-- key of another type: a damaged store) fails alone, as it would have failed its group alone,
-- and says so in Redis's log: the finishes it belongs to are applied and answered.
local function write_later()
  local batch = LATER
  LATER = nil
  local function check(ok, err, command, key)
    if ok then return end
    if type(err) == 'table' then err = err.err end
    redis.log(redis.LOG_WARNING, 'backburner: ' .. command .. ' ' .. key .. ': ' .. tostring(err))
  end
  for _, entry in ipairs(batch) do
    local command, key, args = entry[1], entry[2], entry[3]
    if command == 'HINCRBY' then
      for field, by in pairs(args) do
        local ok, err = pcall(tally, key, field, by, entry[4])
        check(ok, err, command, key)
      end
    else
      local ok, err = pcall(in_chunks, command, key, args)
      check(ok, err, command, key)
    end
  end
end

-- A job's status index: {bb}:i:st:<status>:<type> (seq -> id). The only index by status or
-- by type: a listing by status merges the status's index of every type, one by type the
-- type's index of every status (redis_reads.py), so a transition moves one entry, not three.
local function stkey(status, ty) return P .. 'i:st:' .. status .. ':' .. ty end
local STATUSES = {'queued', 'processing', 'completed', 'failed', 'cancelled'} -- models.JobStatus

-- How many jobs have this status, over every task type ever enqueued.
local function count_status(status)
  local n = 0
  for _, ty in ipairs(redis.call('SMEMBERS', P .. 'types')) do
    n = n + redis.call('ZCARD', stkey(status, ty))
  end
  return n
end

local function reindex(id, ty, seq, from, to)
  if from then zwrite('ZREM', stkey(from, ty), id) end
  if to then zwrite('ZADD', stkey(to, ty), seq, id) end
end

-- An event under a seq the caller took: it read the job's _ev and writes it past seq itself.
-- (An integer is written by '%d': Redis and Lua write any other number as a double, by a
-- printf whose float path cost a finish more than any of its commands but two.)
local function event_at(id, seq, type, data, at)
  redis.call('XADD', ekey(id), string.format('%d-0', seq), 't', type, 'd', data, 'a', at)
end

-- Where a job's events are (docs/redis.md, "Events"). The first ("queued") is made from _ca
-- and never stored. A job of this release has no stream at first (its _es is '0'): the events
-- of a claim ("processing") and of a Complete, a Fail or a RetryAt are made from the attempt's
-- record, which notes their seqs (members "ev", "ee" of _cur and _hist; read_events.lua), as
-- a Redis Stream costs about 4 KB from its first entry and XADD was a tenth of what a claim
-- and a finish cost Redis. Any other event (append_event's, a Release's, a Wait's, a cancel's,
-- a replay's) makes its stream, and somebody waiting for its events (watch_heads.lua) does
-- too: _es becomes '1', and from then on every event goes to the stream, where XREAD BLOCK
-- sees it. No _es: a job of an earlier release, whose events all go to its stream.

-- An event under the job's next seq, into its stream; es: its _es as read (the caller's HMGET).
local function event(id, type, data, at, es)
  local j = jkey(id)
  local seq = redis.call('HINCRBY', j, '_ev', '1')
  event_at(id, seq, type, data, at)
  if es == '0' then redis.call('HSET', j, '_es', '1') end
  return seq
end

-- The hash fields a job's document is made from: every Job field but those of the spec (which
-- never are hash fields), progress and history (made from our own fields _pp, _pm, _hist and
-- _cur, read after them) and the estimates the API adds (tests check the list against
-- models.Job and redis_codec.new_job_spec). HMGET of a fixed list costs Redis less than
-- HGETALL: no copy and no Lua string of every field's name and of our other fields' values
-- (HGETALL's reply was a fifth of a claim). The first six are those a claim writes.
local DOC_FIELDS = {'status', 'attempts', 'fence', 'worker_id', 'lease_expires_at',
  'started_at', 'priority', 'run_at', 'finished_at', 'max_attempts', 'result', 'error',
  'usage', 'webhook_url', 'webhook_progress', 'tenant', 'parent_id', 'expires_at',
  'deadline_at', '_pp', '_pm', '_hist', '_cur'}
local N_JOB_FIELDS = #DOC_FIELDS - 4

-- The job as one JSON document, ready for pydantic to parse: the spec's members, every hash
-- field named like a Job field, then progress and history from our own fields. claimed: the
-- values of the first six fields and of _cur that a claim has just written, which are not
-- read back (the rest is read after its write: a hash of many fields reads faster once its
-- record has made it a hash table), or nil. spec: the job's spec, if the caller has it.
-- written: with claimed, the job's every other field (name -> value), when the caller has just
-- written the whole hash (an enqueue's hand-off): then nothing is read back.
local function read_job(id, claimed, spec, written)
  spec = spec or redis.call('GET', skey(id))
  if not spec then return false end
  local j, n, v, parts = jkey(id), N_JOB_FIELDS, nil, {'{', spec}
  local first = 1
  if claimed then
    first = 7
    if written then
      v = {}
      for i = 7, n + 3 do v[i - 6] = written[DOC_FIELDS[i]] end
    else
      v = redis.call('HMGET', j, unpack(DOC_FIELDS, 7, n + 3))
    end
    for i = 1, 6 do parts[#parts + 1] = ',"' .. DOC_FIELDS[i] .. '":' .. claimed[i] end
  else
    v = redis.call('HMGET', j, unpack(DOC_FIELDS, 1, n + 4))
  end
  -- v[i - o] is field i. (Copying the read values after the claimed ones, for one plain loop,
  -- made a claim 5% dearer in counted instructions: the table grows and rehashes.)
  local o = first - 1
  for i = first, n do
    local value = v[i - o]
    if value then parts[#parts + 1] = ',"' .. DOC_FIELDS[i] .. '":' .. value end
  end
  -- A job that has reported no progress leaves it out: it parses as the one shared default.
  local percent, message = v[n + 1 - o], v[n + 2 - o]
  if percent or message then
    parts[#parts + 1] = ',"progress":{"percent":' .. (percent or '0')
    if message then parts[#parts + 1] = ',"message":' .. message end
    parts[#parts + 1] = '}'
  end
  local closed, current = v[n + 3 - o] or '', claimed and claimed[7] or v[n + 4 - o]
  parts[#parts + 1] = ',"history":[' .. closed
  if current then
    if closed ~= '' then parts[#parts + 1] = ',' end
    parts[#parts + 1] = current .. '}'
  end
  parts[#parts + 1] = ']}'
  return table.concat(parts)
end

-- A ready queue's members sort as text: priority code (3 digits, highest priority first),
-- fair-share tag (19 digits), enqueue order (12), run code (run_at in µs, 17), then the id.
-- The run code takes no part in the order (seq is unique); a claim reads it to skip a job
-- queued by a clock ahead of its own. Offsets of each part within a member:
local M_TAG, M_SEQ, M_RUN, M_ID = 4, 23, 35, 52

local function run_code(run_at) -- whole µs, 17 digits (a claim compares its own now's)
  local us = math.floor(tonumber(run_at) * 1000000)
  if us < 0 then us = 0 end
  return string.format('%017d', us) -- (an integer's format: a float's costs a printf_fp)
end

-- The level of the queues at priority code pq: the largest clock of any type's queue there
-- (FAIRTOP's field, else found once by reading every type's: a store of an earlier release).
local function fair_level(pq)
  local top = tonumber(redis.call('HGET', FAIRTOP, pq))
  if top then return top end
  top = 0
  for _, ty in ipairs(redis.call('SMEMBERS', P .. 'types')) do
    local clock = tonumber(redis.call('HGET', fkey(ty), pq))
    if clock and clock > top then top = clock end
  end
  redis.call('HSET', FAIRTOP, pq, string.format('%d', top))
  return top
end

-- Move type ty's clock at pq up to tag (a number above the clock), and the level with it.
local function move_clock(ty, pq, tag)
  local text = string.format('%d', tag)
  redis.call('HSET', fkey(ty), pq, text)
  if tag > fair_level(pq) then redis.call('HSET', FAIRTOP, pq, text) end
end

-- Whether a job waits in type ty's ready queue at priority code pq (tagged, unclaimed).
local function queue_waits(ty, pq)
  local upto = string.format('%03d', tonumber(pq) + 1)
  return #redis.call('ZRANGE', rkey(ty), '[' .. pq, '(' .. upto, 'BYLEX', 'LIMIT', 0, 1) > 0
end

-- The tag of a job of tenant joining its line in type ty's queue at priority code pq now
-- (start-time fair queueing, as backends/admission.py FairClocks.tag): max(the tenant's last
-- tag in that queue, the queue's clock) + the job's cost (a number). Each queue has a clock of
-- its own, moved only by claims from it while jobs wait in it; a new queue, or one with none
-- waiting, starts level with the others at its priority (fair_level): a clock that stood still
-- while the others moved on would put its next backlog ahead of all their jobs, for a worker
-- serving several types. Tags are integers; a double holds them exactly below
-- 2^53, and below that '%d' (a 64-bit integer here) writes them exactly and their code (19
-- digits) keeps them in order. They are written by '%d', not by a float format: see event_at.
-- claimed: the job is claimed in the same step (an enqueue's hand-off), so the queue's clock
-- moves up to its tag too, as the claim would move it (a tag is always above the clock).
-- Also returns whether the queue had a clock already: then its type is in {bb}:types (a
-- fair-share hash is only written for a type of a job enqueued before, whose enqueue added it).
local function fair_tag(tenant, ty, pq, cost, claimed)
  local key, last = fkey(ty), pq .. ':' .. tenant
  local f = redis.call('HMGET', key, pq, last)
  local clock, top = tonumber(f[1]), fair_level(pq)
  local opened = clock ~= nil
  local level = not opened or (clock < top and not queue_waits(ty, pq))
  if level then clock = top end
  local tag = math.max(clock, tonumber(f[2]) or 0) + cost
  local text = string.format('%d', tag)
  if claimed then
    redis.call('HSET', key, last, text, pq, text)
    if tag > top then redis.call('HSET', FAIRTOP, pq, text) end
  elseif level then
    redis.call('HSET', key, pq, string.format('%d', clock), last, text)
  else
    redis.call('HSET', key, last, text)
  end
  return tag, opened
end

-- A string held as JSON text (a hash field), or nil when absent or not a JSON string.
local function json_string(text)
  if not text then return nil end
  local ok, value = pcall(cjson.decode, text)
  if ok and type(value) == 'string' then return value end
  return nil
end

-- The parent id of a job (its hash's parent_id field, JSON text), or nil for none.
local function parent_of(text)
  local parent = json_string(text)
  if parent == '' then return nil end
  return parent
end

-- What a script that puts a job in a queue (or takes it out) needs from the job's hash, read
-- and checked before the script's first write, so that no missing or garbled field can fail
-- it half-way (a job queued in no queue, a count off by one). Missing fields get the values
-- every other script assumes: seq from the job's i:all entry, priority and its code from each
-- other (else 0), tenant 'default' (whose job the store upgrade makes it), fair cost
-- FAIR_SCALE. Takes the hash's _ty, _sq, priority, _pq, tenant, _fc (text or nil); returns
-- type, seq code (12 digits), seq, priority (text), priority code, tenant, cost (a number),
-- or nil if the job has no type: the caller refuses before writing.
local function job_line(id, ty, sq, priority, pq, tenant, cost)
  if not ty then return nil end
  local seq = tonumber(sq)
  if not seq then
    seq = tonumber(redis.call('ZSCORE', P .. 'i:all', id)) or 0
    sq = string.format('%012d', seq)
  end
  local code = tonumber(pq)
  if not code or #pq ~= 3 then
    priority = tonumber(priority) and priority or '0'
    pq = string.format('%03d', 100 - tonumber(priority))
  elseif not tonumber(priority) then
    priority = string.format('%d', 100 - code)
  end
  cost = tonumber(cost)
  if not cost or cost <= 0 then cost = FAIR_SCALE end
  return ty, sq, seq, priority, pq, json_string(tenant) or DEFAULT_TENANT, cost
end

-- How long a finished job is kept (ttl_s): its hash's _ttl, else its spec's, else a day (the
-- default of NewJob.ttl_s).
local function job_ttl(id, ttl)
  ttl = tonumber(ttl)
  if ttl then return ttl end
  local spec = redis.call('GET', skey(id)) or ''
  return tonumber(string.match(spec, '"ttl_s":([-+.%deE]+)')) or 86400
end

-- The member of a job in its type's ready queue: made again from the job's hash (_pq, _tg,
-- _sq, run_at) when it has to be found there.
local function ready_member(id, pq, tag, sq, run_at)
  return pq .. string.format('%019d', tonumber(tag)) .. sq .. run_code(run_at) .. id
end

-- Put a job in its type's ready queue with fair-share tag `tag` (a number, from fair_tag or
-- the one it had); run_at must be its hash's. _tg keeps the tag until the job is terminal,
-- so a Release puts it back in its place.
local function add_ready(id, ty, pq, tag, sq, run_at)
  redis.call('HSET', jkey(id), '_tg', string.format('%d', tag))
  redis.call('ZADD', rkey(ty), '0', ready_member(id, pq, tag, sq, run_at))
end

-- The same, and wake the waiters for its type.
local function enqueue_ready(id, ty, pq, tag, sq, run_at)
  add_ready(id, ty, pq, tag, sq, run_at)
  redis.call('PUBLISH', WAKE, ty)
end

-- A job not yet due waits in DELAYED, scored by run_at; members are <seq><id>, so jobs due at
-- the same instant join their lines in enqueue order. It gets its tag when a claim moves it.
local function enqueue_delayed(id, ty, sq, run_at)
  redis.call('ZADD', DELAYED, run_at, sq .. id)
  redis.call('PUBLISH', WAKE, ty)
end

-- One job of tenant more in flight (enqueued, replayed), and one more open child of its
-- parent (the job's parent id, or nil).
local function join_flight(tenant, parent)
  if parent then
    redis.call('HINCRBY', OPEN, parent, '1')
  else
    redis.call('HINCRBY', INFLIGHT, tenant, '1')
  end
end

-- One job of tenant fewer in flight (it became terminal), or for a child one open child fewer
-- of its parent: a pipeline's children are its own work, not submissions of its tenant, so
-- they count in {bb}:open, not in the tenant's quota. A tenant or parent with none has no field.
local function leave_flight(tenant, parent)
  if parent then
    tally(OPEN, parent, -1, true)
  else
    tally(INFLIGHT, tenant, -1, true)
  end
end

-- The _hist text once the attempt in progress (cur, its _cur) is closed; hist: _hist as read;
-- extra: more members of the record (the seqs of the events it stands for) or nil.
local function closed_history(hist, cur, now, outcome, error_json, extra)
  local record = cur .. ',"finished_at":' .. now .. ',"outcome":"' .. outcome .. '"'
  if error_json then record = record .. ',"error":' .. error_json end
  record = record .. (extra or '') .. '}'
  if hist and hist ~= '' then return hist .. ',' .. record end
  return record
end

local function close_history(id, cur, now, outcome, error_json)
  if not cur then return end
  local j = jkey(id)
  redis.call('HSET', j, '_hist',
    closed_history(redis.call('HGET', j, '_hist'), cur, now, outcome, error_json))
  redis.call('HDEL', j, '_cur')
end

-- The webhook outbox. A message is a hash whk(msg) whose fields hold JSON text, like a job's
-- (task_id, event, url, status, created_at, next_at while pending, body once sent, attempts:
-- a JSON array, claim: grows with every claim and redelivery, tries: attempts recorded since
-- it became pending by creation or redelivery; both absent, i.e. 0, in messages written before
-- they existed); WH_DUE holds pending msg ids by next_at, WH_DELIVERED and WH_FAILED settled
-- ones by the time of their last attempt; whjob(id) lists a job's msg ids, oldest first.
-- Messages live and die with their job.
local WH_DUE = P .. 'wh:due'
local WH_DELIVERED = P .. 'wh:delivered'
local WH_FAILED = P .. 'wh:failed'
local function whk(msg) return P .. 'wh:' .. msg end
local function whjob(id) return P .. 'wh:job:' .. id end

local function read_webhook(msg)
  local flat = redis.call('HGETALL', whk(msg))
  if #flat == 0 then return false end
  local parts = {'{"msg_id":"', msg, '"'}
  for i = 1, #flat, 2 do parts[#parts + 1] = ',"' .. flat[i] .. '":' .. flat[i + 1] end
  parts[#parts + 1] = '}'
  return table.concat(parts)
end

local function expire_webhooks(id, ttl) -- ttl: nil to PERSIST
  local list = whjob(id)
  local msgs = redis.call('LRANGE', list, 0, -1)
  if #msgs == 0 then return end
  for _, key in ipairs(msgs) do
    if ttl then redis.call('EXPIRE', whk(key), ttl) else redis.call('PERSIST', whk(key)) end
  end
  if ttl then redis.call('EXPIRE', list, ttl) else redis.call('PERSIST', list) end
end

local function forget_webhooks(id)
  local list = whjob(id)
  for _, msg in ipairs(redis.call('LRANGE', list, 0, -1)) do
    redis.call('DEL', whk(msg))
    redis.call('ZREM', WH_DUE, msg)
    redis.call('ZREM', WH_DELIVERED, msg)
    redis.call('ZREM', WH_FAILED, msg)
  end
  redis.call('DEL', list)
end

-- A new pending message of job id, due now (url: the job's webhook_url as JSON text), last in
-- the job's list. It gets no TTL: the job's terminal transition gives it the job's.
local function add_webhook(id, url, msg, event, now)
  redis.call('HSET', whk(msg), 'task_id', cjson.encode(id), 'event', cjson.encode(event),
    'url', url, 'status', '"pending"', 'created_at', now, 'next_at', now, 'attempts', '[]',
    'claim', 0, 'tries', 0)
  redis.call('ZADD', WH_DUE, now, msg)
  redis.call('RPUSH', whjob(id), msg)
end

-- The webhook_url (JSON text, or nil) of a job enqueued by a release that kept it only in the
-- spec s:<id> (JSON object members without their braces), for when its hash has none. A spec
-- without the member's name (every job without a webhook) is not decoded. Call it before the
-- first write: a spec that is not JSON reads as no url rather than failing the script halfway.
-- Returned the way the hash holds it ('/' unescaped, unlike cjson's).
local function spec_webhook_url(id)
  local spec = redis.call('GET', skey(id))
  if not spec or not string.find(spec, '"webhook_url":', 1, true) then return nil end
  local ok, doc = pcall(cjson.decode, '{' .. spec .. '}')
  if not ok or type(doc) ~= 'table' or type(doc.webhook_url) ~= 'string' then return nil end
  return (string.gsub(cjson.encode(doc.webhook_url), '\\/', '/'))
end

-- In the step that makes a job terminal: a pending message, due now, when the job has a
-- webhook_url (msg and event come from the caller); then all the job's messages (its
-- task.progress ones too) take the job's TTL. A job without a webhook_url has none.
local function write_webhook(id, url, msg, event, now, ttl)
  if not url then return end
  if msg ~= '' and event ~= '' then add_webhook(id, url, msg, event, now) end
  expire_webhooks(id, ttl)
end

-- Returns the TTL the job's keys got (its webhook messages get the same: write_webhook).
-- expires_at: expires as num() writes it, if the caller has it; now: a number, or its text.
local function make_terminal(id, ik, expires, now, expires_at)
  zwrite('ZADD', EXPIRING, expires_at or num(expires), id)
  local ttl = string.format('%d', math.max(1, math.ceil(expires - tonumber(now))) + GRACE)
  redis.call('EXPIRE', jkey(id), ttl)
  redis.call('EXPIRE', skey(id), ttl)
  -- (its stream too, if it has one: even with _es '0', a process of an earlier release may
  -- have written one)
  redis.call('EXPIRE', ekey(id), ttl)
  if ik and ik ~= '' then redis.call('EXPIRE', P .. 'k:' .. ik, ttl) end
  return ttl
end

-- Keep terminal job id (and its webhook messages) until keep (a number) at least: its expiry
-- moves later, never earlier. now: the caller's time, as text. A job not terminal has no
-- expiry yet: nothing to do.
local function keep_job_until(id, keep, now)
  local expires = tonumber(redis.call('HGET', jkey(id), 'expires_at'))
  if not keep or not expires or expires >= keep then return end
  local text = num(keep)
  redis.call('HSET', jkey(id), 'expires_at', text)
  local ik = redis.call('HGET', jkey(id), '_ik')
  expire_webhooks(id, make_terminal(id, ik, keep, now, text))
end

local FORGET_FIELDS = {'_ty', 'status', '_ik', 'worker_id', 'tenant', 'parent_id'}
local function forget(id, fields)
  -- fields: HMGET of FORGET_FIELDS
  local ty, status, ik = fields[1], fields[2], fields[3]
  redis.call('DEL', jkey(id), skey(id), ekey(id))
  forget_webhooks(id)
  redis.call('ZREM', P .. 'i:all', id)
  redis.call('ZREM', EXPIRING, id)
  if ty and status then reindex(id, ty, 0, raw(status), nil) end -- (no type: in no i:st)
  if ik and ik ~= '' and redis.call('GET', P .. 'k:' .. ik) == id then
    redis.call('DEL', P .. 'k:' .. ik)
  end
  -- A cancel signal waiting for its worker (fields[4]) stays: a job cancelled and at once
  -- deleted still runs there until the worker reads it (it was 10 s, till a heartbeat, when
  -- the delete took the signal). Its worker takes it at its next poll; c:<worker> expires.
  redis.call('ZREM', nkey(json_string(fields[5]) or DEFAULT_TENANT), id)
  local parent = parent_of(fields[6])
  if parent then redis.call('ZREM', pkey(parent), id) end
end

-- Concurrency slots: a sorted set of holder -> lease end. The key's PEXPIRE follows the
-- latest lease (plus a grace: the scores decide who holds a slot, the TTL only collects a key
-- whose holders all vanished).
local SLOT_GRACE_MS = 60000
local function slotkey(name) return P .. 'slot:' .. name end
local function slot_drop_ended(k, now) redis.call('ZREMRANGEBYSCORE', k, '-inf', now) end
local function slot_keep(k, now)
  local last = redis.call('ZRANGE', k, '-1', '-1', 'WITHSCORES')
  if last[2] then
    local ms = math.ceil((tonumber(last[2]) - tonumber(now)) * 1000) + SLOT_GRACE_MS
    redis.call('PEXPIRE', k, string.format('%d', ms))
  end
end
-- Claim up to limit due jobs of types (a list) for worker wid (wjson: its id as JSON text)
-- at now with leases until lease: each becomes processing under a new fence, with its
-- status event; their index entries move in one command per key. Returns their documents
-- (read_job), in claim order.
local function claim_jobs(types, limit, wid, wjson, now, lease)
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
  local leases, prios = {}, {}
  local score = lease_score(lease)
  for i = 1, math.min(limit, #candidates) do
    local m = candidates[i]
    local ty = type_of[m]
    local id = string.sub(m, M_ID)
    local j = jkey(id)
    local seq = string.sub(m, M_SEQ, M_RUN - 1) -- (a score as text: no number to write)
    if not ready_out[ty] then ready_out[ty], queued_out[ty], processing_in[ty] = {}, {}, {} end
    table.insert(ready_out[ty], m)
    table.insert(queued_out[ty], id)
    local f = redis.call('HMGET', j, 'attempts', 'fence', 'priority', '_ev', '_es')
    if not f[2] then
      -- Its hash is gone (evicted by an allkeys policy, or deleted by hand): it leaves the
      -- queue, rather than be written back as a job of a few fields that is processing for
      -- good (no reader can read it, so no sweep would ever end its lease).
      redis.log(redis.LOG_WARNING, 'backburner: queued job ' .. id .. ' has no hash; dropped')
      local priority = string.format('%d', 100 - tonumber(string.sub(m, 1, 3)))
      prios[priority] = (prios[priority] or 0) + 1
    else
      table.insert(processing_in[ty], seq)
      table.insert(processing_in[ty], id)
      table.insert(leases, score)
      table.insert(leases, id)
      local pq, tag = string.sub(m, 1, 3), tonumber(string.sub(m, M_TAG, M_SEQ - 1))
      local top = clocks[ty]
      if not top then top = {}; clocks[ty] = top end
      if not top[pq] or tag > top[pq] then top[pq] = tag end
      local attempt = string.format('%d', (tonumber(f[1]) or 0) + 1)
      local fence = string.format('%d', (tonumber(f[2]) or 0) + 1)
      local ev = string.format('%d', (tonumber(f[4]) or 0) + 1) -- the seq of its status event
      local cur = '{"attempt":' .. attempt .. ',"worker_id":' .. wjson .. ',"started_at":' .. now
      if f[5] == '0' then -- no stream: its record stands for its status event
        cur = cur .. ',"ev":' .. ev
      else
        event_at(id, ev, 'status',
          '{"status":"processing","attempt":' .. attempt .. ',"worker_id":' .. wjson .. '}', now)
      end
      redis.call('HSET', j, 'status', '"processing"', 'attempts', attempt, 'fence', fence,
        'worker_id', wjson, 'lease_expires_at', lease, 'started_at', now, '_cur', cur, '_ev', ev)
      local priority = f[3] or string.format('%d', 100 - tonumber(pq))
      prios[priority] = (prios[priority] or 0) + 1
      out[#out + 1] = read_job(id, {'"processing"', attempt, fence, wjson, lease, now, cur})
    end
  end
  in_chunks('ZADD', LEASES, leases)
  for ty, members in pairs(ready_out) do
    in_chunks('ZREM', rkey(ty), members)
    in_chunks('ZREM', stkey('queued', ty), queued_out[ty])
    in_chunks('ZADD', stkey('processing', ty), processing_in[ty])
  end
  for priority, count in pairs(prios) do
    redis.call('HINCRBY', QPRIO, priority, string.format('%d', -count))
  end
  -- Claiming moves each queue's clock up to the largest tag claimed from it (never down: a
  -- released job keeps an older tag). Only that queue's: another type's tenants keep their place.
  for ty, top in pairs(clocks) do
    local key = fkey(ty)
    for pq, tag in pairs(top) do
      local clock = tonumber(redis.call('HGET', key, pq))
      if tag > (clock or 0) then move_clock(ty, pq, tag) end
    end
  end
  return out
end

-- Hand-off to idle workers. A worker with nothing to do registers in {bb}:idle:<type> (worker
-- id -> when its registration lapses, in Redis's own time: the clocks of the machines do not
-- matter) for each type it runs, and in IDLEW (worker id -> {t: its types, j: its id as JSON
-- text, l: its lease_s}, as JSON). An enqueue that finds one claims the job for it (the claim
-- it would have made itself) and publishes the job on {bb}:hand:<worker id>, to which the
-- worker listens: it starts the job without a round trip of its own. A claim of the
-- worker's own (not a finish's), a hand-off to it or its leaving ends the registration; a
-- worker that dies stays registered until it lapses (a job handed to it then runs again when
-- its lease expires).
local IDLEW = P .. 'idlew'
local function idlekey(ty) return P .. 'idle:' .. ty end

-- Redis's clock, as text (seconds and six decimals) and as a number. Pass the text to
-- commands: a number handed to redis.call is printed as a double (%.17g), and printing the
-- seven numeric arguments of a hand-off was 4% of its instructions.
local function redis_clock()
  local t = redis.call('TIME')
  local text = t[1] .. '.' .. string.rep('0', 6 - #t[2]) .. t[2]
  return text, tonumber(text)
end

-- End wid's registration; its registration as a table, or nil if it had none. text: the
-- registration as read from IDLEW, if the caller has it (else it is read here); reg: it
-- decoded, if the caller has that too (idle_taker's checked one).
local function end_idle(wid, text, reg)
  text = text or redis.call('HGET', IDLEW, wid)
  if not text then return nil end
  redis.call('HDEL', IDLEW, wid)
  if not reg then
    local ok, decoded = pcall(cjson.decode, text)
    if not ok then return nil end
    reg = decoded
  end
  if type(reg) ~= 'table' or type(reg.t) ~= 'table' then return nil end
  for _, ty in ipairs(reg.t) do redis.call('ZREM', idlekey(ty), wid) end
  return reg
end

-- The idle worker an enqueue of type ty may hand its job to (now: the enqueuer's clock, which
-- the claim made for the worker uses like the worker's own): the one registered last, if it
-- is listening and its own claim would take nothing before this type's next job. Returns its
-- id, its registration (a table) and the registration's text, or nil. Registrations found
-- lapsed, not listening or unreadable on the way are ended.
local function idle_taker(ty, now)
  local key = idlekey(ty)
  -- The registration that lapses last (one command when nobody waits: every busy enqueue).
  local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if #newest == 0 then return nil end
  local clock_text, clock = redis_clock()
  for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', key, '-inf', clock_text, 'LIMIT', '0',
    '10')) do
    end_idle(lapsed) -- dead or gone
    redis.call('ZREM', key, lapsed)
  end
  if tonumber(newest[2]) <= clock then return nil end
  local wid = newest[1]
  -- Not listening (its connection dropped, it died): a job published to it would be lost.
  if tonumber(redis.call('PUBSUB', 'NUMSUB', P .. 'hand:' .. wid)[2]) == 0 then
    end_idle(wid)
    return nil
  end
  local text = redis.call('HGET', IDLEW, wid)
  local ok, reg = pcall(cjson.decode, text or '')
  if not ok or type(reg) ~= 'table' or type(reg.t) ~= 'table' or type(reg.j) ~= 'string'
    or not tonumber(reg.l) then
    end_idle(wid, text)
    return nil
  end
  -- Its own claim would take the head of all its types' queues, after moving due delayed jobs
  -- in: hand it this type's job only when nothing else could come first (else it is woken).
  if #redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', '0', '1') > 0 then return nil end
  for _, other in ipairs(reg.t) do
    if other ~= ty and redis.call('ZCARD', rkey(other)) > 0 then return nil end
  end
  return wid, reg, text
end

-- Hand the head of type ty's ready queue to the idle worker wid (idle_taker's three results)
-- as its claim would take it, and end its registration. True if it did.
local function hand_head(ty, now, wid, reg, text)
  end_idle(wid, text, reg)
  local jobs = claim_jobs({ty}, 1, wid, reg.j, now, num(tonumber(now) + tonumber(reg.l)))
  if #jobs == 0 then return false end
  redis.call('PUBLISH', P .. 'hand:' .. wid, jobs[1])
  return true
end

-- A finish's next-claim argument (JSON: redis.py _next_claim_arg) decoded, or nil if it is not
-- one: {w: worker id, j: it as JSON text, s: lease seconds (a number), t: types or nil, n}.
local function next_claim(text)
  local ok, ask = pcall(cjson.decode, text)
  if ok and type(ask) == 'table' and type(ask.w) == 'string' and type(ask.j) == 'string'
    and type(ask.s) == 'number' then
    return ask
  end
  return nil
end

-- The end of a lease of s seconds from now (text), as exact text (Python's float sum).
local function lease_until(now, s) return num(tonumber(now) + s) end

-- A worker's claim (claim.lua, and a finish that fills the slot it frees): moves the delayed
-- jobs that are due into their tenants' lines (by run_at, then enqueue order), then claims up
-- to limit jobs of types (a list) with leases until lease. Returns them as claim_jobs does.
-- It leaves the worker's idle registration alone: a finish's claim is for the slot the finish
-- frees, while the worker's own wait (and what it may be handed) is for its other free slots.
local function claim_for(wid, wjson, now, lease, types, limit)
  local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', '0', '1000')
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
  return claim_jobs(types, limit, wid, wjson, now, lease)
end
