-- ARGV: P, id, type, spec, fingerprint, idempotency_key|'', max_queue|'', priority_code,
--       run_code, run_at, delayed 0|1, created_at, priority, field, value, ...
local id, ty, spec, fp, ik = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('EXISTS', jkey(id)) == 1 or redis.call('EXISTS', skey(id)) == 1 then
  return {'exists'}
end
if ik ~= '' then
  local other = redis.call('GET', P .. 'k:' .. ik)
  if other then
    local other_fp = redis.call('HGET', jkey(other), '_fp')
    if other_fp then
      if other_fp ~= fp then return {'conflict', other} end
      return {'duplicate', read_job(other)}
    end
  end
end
if ARGV[7] ~= '' then
  local queued = redis.call('ZCARD', P .. 'i:s:queued')
  if queued >= tonumber(ARGV[7]) then return {'full', queued} end
end
local seq = redis.call('INCR', P .. 'seq')
local sq = string.format('%012d', seq)
local j = jkey(id)
local fields = {}
for i = 14, #ARGV do fields[#fields + 1] = ARGV[i] end
-- The first event ("queued", seq 1) is not stored: read_events makes it from _ca. A Redis
-- Stream costs about 4 KB from its first entry (Redis 7 preallocates a node), so a job gets
-- its stream when it starts running, not while it waits.
redis.call('HSET', j, '_sq', sq, '_fp', fp, '_ev', 1, '_ca', ARGV[12], unpack(fields))
redis.call('SET', skey(id), spec)
if ik ~= '' then redis.call('SET', P .. 'k:' .. ik, id) end
redis.call('ZADD', P .. 'i:all', seq, id)
redis.call('ZADD', P .. 'i:t:' .. ty, seq, id)
reindex(id, ty, seq, nil, 'queued')
redis.call('SADD', P .. 'types', ty)
redis.call('HINCRBY', QPRIO, ARGV[13], 1)
enqueue_ready(id, ty, ARGV[8], ARGV[9], sq, ARGV[10], ARGV[11] == '1')
return {'ok'}
