-- ARGV: P, layout version, batch size, tenant, tenant as JSON, fair cost
-- One batch of the upgrade of a store written before tenants (layout 1), or the one step from
-- layout 2 (below), to this layout (redis_upgrade.py runs batches until this returns 'done').
-- Returns {'done' | 'more', the layout now recorded (or ''), jobs scanned, ready jobs tagged}.
--
-- Layout 1: a ready job's member was <priority 3><run code 17><seq 12><id> (the hash's _qm
-- held the first 32 characters), a delayed job's was its bare id; hashes had no tenant, _fc,
-- _tg; there was no {bb}:inflight nor {bb}:i:n:<tenant>.
--
-- Two passes, with their progress in {bb}:upgrade (cursor: the seq of the last job of
-- {bb}:i:all looked at; scanned: set when the walk is over), so a batch that never ran (a
-- crash, a lost connection) is simply run again by whichever process connects next, and
-- several processes connecting at once take turns without doing anything twice:
--   1. Walk {bb}:i:all by seq. A job that has a tenant is of this layout: left alone (but
--      see 8319ca4 below). A terminal job gets its tenant and cost; a processing one also
--      counts in flight and gets its queue's clock as its tag (a Release puts it first
--      again; 0 if the queue has no clock yet); a delayed one also
--      gets its <seq><id> member in place of its id (and a queued one found in no queue
--      becomes a delayed one, due at its run_at). A ready one only gets an entry in
--      {bb}:upgrade:ready (its old member, all scores 0): it stays in the old layout for now.
--   2. Take {bb}:upgrade:ready in order (its members sort as the old ready queues did:
--      priority, run_at, seq) and make each job a member of this layout with the tag fair_tag
--      gives it now, so in each queue (a type and priority) tags rise in the old claim order.
-- A store of the first tenants release (commit 8319ca4, which recorded no layout either) has
-- jobs with a tenant, left as they are, but kept its fair-share state in one hash, {bb}:fair
-- (<pq> -> a clock per priority, <pq>:<tenant> -> a last tag per priority): the walk carries
-- it over to this layout's hash per type, {bb}:fair:<type>, from the jobs it meets (carry_over
-- below), and the batch that records the layout deletes {bb}:fair.
-- Each job is converted by one batch, whole: in a store mid-upgrade every job is in one layout
-- or the other, never both and never neither. The walk's check (no tenant yet) is what makes
-- a repeated batch change nothing.
local LAYOUT = P .. 'layout'
local STATE = P .. 'upgrade'
local STAGE = P .. 'upgrade:ready'
local version, budget = ARGV[2], tonumber(ARGV[3])
local tenant, tenant_json, cost = ARGV[4], ARGV[5], ARGV[6]
local OLD_ID = 33 -- where the id starts in a member of layout 1
local OLD_FAIR = P .. 'fair' -- 8319ca4's fair-share state, one hash for every type

-- Layout 2 kept three listing indexes a job moved between at every transition: by status
-- ({bb}:i:s:<status>), by type ({bb}:i:t:<type>) and by both ({bb}:i:st:<status>:<type>).
-- Only the last is kept (listings merge it: redis_reads.py); the others go, freed in the
-- background (UNLINK), as the layout is recorded. A store of layout 1 had them too.
local function drop_layout_2_indexes()
  for _, status in ipairs(STATUSES) do redis.call('UNLINK', P .. 'i:s:' .. status) end
  for _, ty in ipairs(redis.call('SMEMBERS', P .. 'types')) do
    redis.call('UNLINK', P .. 'i:t:' .. ty)
  end
end

local recorded = redis.call('GET', LAYOUT)
if recorded == '2' then
  drop_layout_2_indexes()
  redis.call('SET', LAYOUT, version)
  return {'done', version, 0, 0}
end
if recorded then return {'done', recorded, 0, 0} end

-- The job joins the tenant: its fields, its listing index, and (not terminal) its count.
local function adopt(id, seq, in_flight)
  redis.call('HSET', jkey(id), 'tenant', tenant_json, '_fc', cost)
  redis.call('HDEL', jkey(id), '_qm')
  redis.call('ZADD', nkey(tenant), seq, id)
  if in_flight then redis.call('HINCRBY', INFLIGHT, tenant, 1) end
end

local JOB_FIELDS = {'status', 'tenant', '_ty', '_pq', '_sq', 'run_at', '_qm', '_tg'}

-- A job written by 8319ca4 (f: JOB_FIELDS; it has a tenant) and tagged (queued in a ready
-- queue, or processing): its queue's clock opens at that release's clock of its priority, and
-- its tenant's last tag in its queue is at least its tag, so a job enqueued next goes behind
-- it. Both only ever rise (a repeated batch changes nothing). A tenant with nothing tagged
-- loses its last tag, which was at most the clock anyway unless its last jobs were cancelled.
local function carry_over(f)
  local tag = tonumber(f[8])
  local ty, pq = f[3], f[4]
  if not tag or not ty or not pq or (f[1] ~= '"queued"' and f[1] ~= '"processing"') then
    return
  end
  local key, last = fkey(ty), pq .. ':' .. (json_string(f[2]) or tenant)
  local g = redis.call('HMGET', key, pq, last)
  if not g[1] then
    local clock = tonumber(redis.call('HGET', OLD_FAIR, pq))
    if clock then
      redis.call('HSET', key, pq, string.format('%.0f', clock))
      redis.call('HDEL', FAIRTOP, pq) -- (fair_level finds the level again)
    end
  end
  if not tonumber(g[2]) or tonumber(g[2]) < tag then
    redis.call('HSET', key, last, string.format('%.0f', tag))
  end
end

local scanned, tagged = 0, 0
local state = redis.call('HMGET', STATE, 'cursor', 'scanned')
local walked = state[2] == '1'
if not walked then
  local from = '-inf'
  if state[1] then from = '(' .. state[1] end
  local found = redis.call('ZRANGEBYSCORE', P .. 'i:all', from, '+inf', 'WITHSCORES',
    'LIMIT', 0, budget)
  for i = 1, #found, 2 do
    local id, seq = found[i], tonumber(found[i + 1])
    local f = redis.call('HMGET', jkey(id), unpack(JOB_FIELDS))
    -- No hash: a finished job whose keys Redis expired before a purge; nothing to convert.
    if f[1] and f[2] then
      carry_over(f)
    elseif f[1] then
      local status = raw(f[1])
      if status == 'queued' then
        local ty, pq, sq, run_at = f[3], f[4], f[5], f[6]
        local code = f[7] or (pq .. run_code(run_at) .. sq)
        local due = redis.call('ZSCORE', DELAYED, id)
        if due then
          redis.call('ZREM', DELAYED, id)
          redis.call('ZREM', rkey(ty), code .. id) -- never there in layout 1; one queue only
          redis.call('ZADD', DELAYED, due, sq .. id)
          adopt(id, seq, true)
        elseif redis.call('ZSCORE', rkey(ty), code .. id) then
          redis.call('ZADD', STAGE, 0, code .. id)
        else
          -- Queued in no queue (never so in layout 1, but the tenants release before this
          -- one took old members apart): delayed until its run_at, so a claim puts it back.
          redis.call('ZADD', DELAYED, run_at, sq .. id)
          adopt(id, seq, true)
        end
      elseif status == 'processing' then
        local clock = tonumber(redis.call('HGET', fkey(f[3]), f[4])) or 0 -- its queue's
        redis.call('HSET', jkey(id), '_tg', string.format('%.0f', clock))
        adopt(id, seq, true)
      else
        adopt(id, seq, false)
      end
    end
    scanned = scanned + 1
  end
  if #found > 0 then redis.call('HSET', STATE, 'cursor', found[#found]) end
  if scanned < budget then
    redis.call('HSET', STATE, 'scanned', '1')
    walked = true
  end
end

if walked then
  local left = budget - scanned
  if left > 0 then
    for _, m in ipairs(redis.call('ZRANGE', STAGE, 0, left - 1)) do
      redis.call('ZREM', STAGE, m)
      local id = string.sub(m, OLD_ID)
      local f = redis.call('HMGET', jkey(id), unpack(JOB_FIELDS))
      if f[1] == '"queued"' and not f[2] then
        local ty, pq, sq, run_at = f[3], f[4], f[5], f[6]
        redis.call('ZREM', rkey(ty), m)
        if f[7] and f[7] .. id ~= m then redis.call('ZREM', rkey(ty), f[7] .. id) end
        add_ready(id, ty, pq, fair_tag(tenant, ty, pq, tonumber(cost)), sq, run_at)
        adopt(id, tonumber(sq), true)
        tagged = tagged + 1
      end
    end
  end
  if redis.call('EXISTS', STAGE) == 0 then
    drop_layout_2_indexes()
    redis.call('SET', LAYOUT, version)
    redis.call('DEL', STATE, OLD_FAIR)
    return {'done', version, scanned, tagged}
  end
end
return {'more', '', scanned, tagged}
