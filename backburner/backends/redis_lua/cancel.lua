-- ARGV: P, id, now, msg_id, webhook event
-- Everything is read and checked before the first write, so no input makes the script fail
-- half-way (a job left in a queue, a count off by one).
local id, now = ARGV[2], ARGV[3]
local j = jkey(id)
local f = redis.call('HMGET', j, 'status', '_ty', '_sq', '_tg', 'worker_id', 'fence', '_cur',
  '_ttl', '_ik', 'priority', 'webhook_url', 'tenant', '_pq', 'run_at', 'parent_id', '_es', '_fc')
if not f[1] then return {'missing'} end
local status = raw(f[1])
if TERMINAL[status] then return {'unchanged', read_job(id)} end
local ty, sq, seq, priority, pq, tenant, cost = job_line(id, f[2], f[3], f[10], f[13], f[12],
  f[17])
if not ty then return redis.error_reply('job ' .. id .. ' has no task type') end
-- The newest queued job of its tenant's line (tagged: prelude fair_tag) takes itself back
-- out: the line ends where it began. A backlog cancelled newest first (a batch's cancel)
-- leaves nothing to wait behind; an older job's cancel changes nothing, so the tenant's next
-- job still goes after its newer ones (FIFO).
local line, last = pq .. ':' .. tenant, nil
if status == 'queued' and tonumber(f[4]) then
  last = tonumber(redis.call('HGET', fkey(ty), line))
end
local url = f[11]
if not url then url = spec_webhook_url(id) end -- a job of the previous release
local ttl = job_ttl(id, f[8])
local worker = json_string(f[5])

-- A queued job's member in its ready queue, when its hash cannot name it (no _tg): a walk of
-- the queue, so that no member is left for a claim to take (it would run a cancelled job).
local function drop_ready(key)
  local pattern = '*' .. (string.gsub(id, '[%*%?%[%]\\]', '\\%0'))
  local cursor = '0'
  repeat
    local page = redis.call('ZSCAN', key, cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = page[1]
    for i = 1, #page[2], 2 do
      if string.sub(page[2][i], M_ID) == id then redis.call('ZREM', key, page[2][i]) end
    end
  until cursor == '0'
end

if status == 'queued' then
  local gone = redis.call('ZREM', DELAYED, sq .. id)
  local lined = 0
  if tonumber(f[4]) and tonumber(f[14]) then -- tagged (a delayed job's stale tag: no member)
    lined = redis.call('ZREM', rkey(ty), ready_member(id, pq, f[4], sq, f[14]))
    gone = gone + lined
  end
  if gone == 0 then drop_ready(rkey(ty)) end
  if lined > 0 and last == tonumber(f[4]) then
    redis.call('HSET', fkey(ty), line, string.format('%d', last - cost))
  end
  redis.call('HINCRBY', QPRIO, priority, -1)
elseif status == 'processing' then
  close_history(id, f[7], now, 'cancelled', nil)
  redis.call('ZREM', LEASES, id)
  if worker then
    local signals = P .. 'c:' .. worker
    redis.call('HSET', signals, id, f[6])
    redis.call('EXPIRE', signals, 86400)
  end
end
local expires = tonumber(now) + ttl
redis.call('HSET', j, 'status', '"cancelled"', 'finished_at', now, 'expires_at', num(expires))
redis.call('HDEL', j, 'lease_expires_at', '_tg')
reindex(id, ty, seq, status, 'cancelled')
leave_flight(tenant, parent_of(f[15]))
event(id, 'status', '{"status":"cancelled"}', now, f[16]) -- (it makes the stream: '1')
write_webhook(id, url, ARGV[4], ARGV[5], now, make_terminal(id, f[9], expires, now))
return {'ok', read_job(id)}
