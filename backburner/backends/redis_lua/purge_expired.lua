-- ARGV: P, now, limit, forget_before (workers last seen before it are forgotten), child_keep_s
-- A child whose parent is stored is kept until its parent's expiry (child_keep_s more while
-- its parent runs): a batch's results and a pipeline's replay need it (base.CHILD_KEEP_S).
local ids = redis.call('ZRANGEBYSCORE', EXPIRING, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local now, purged = tonumber(ARGV[2]), 0
for _, id in ipairs(ids) do
  local fields = redis.call('HMGET', jkey(id), unpack(FORGET_FIELDS))
  local parent = parent_of(fields[6])
  local keep = nil
  if parent and redis.call('EXISTS', jkey(parent)) == 1 then
    keep = tonumber(redis.call('HGET', jkey(parent), 'expires_at')) or now + tonumber(ARGV[5])
  end
  if keep and keep > now then
    keep_job_until(id, keep, ARGV[2])
  else
    forget(id, fields)
    purged = purged + 1
  end
end
-- A worker's record is "<started> <last seen> <running>" (heartbeat.lua).
local workers, before, gone = redis.call('HGETALL', P .. 'workers'), tonumber(ARGV[4]), {}
for i = 1, #workers, 2 do
  local seen = tonumber(string.match(workers[i + 1], '^[^ ]+ ([^ ]+)'))
  if not seen or seen < before then gone[#gone + 1] = workers[i] end
end
in_chunks('HDEL', P .. 'workers', gone)
return purged
