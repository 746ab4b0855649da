-- ARGV: P, id, ... Returns each job's last event seq as text, or false if it does not exist.
-- A job about to be waited for gets its stream (XREAD BLOCK watches streams): an empty one if
-- it has none (with the job's TTL, if it has one), and _es '1', so that its next events go to
-- the stream. Making it twice changes nothing, so a repeated call is harmless.
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local j = jkey(id)
  local f = redis.call('HMGET', j, '_ev', '_es')
  out[#out + 1] = f[1] or false
  if f[1] and f[2] ~= '1' then
    local e = ekey(id)
    if redis.call('EXISTS', e) == 0 then
      redis.call('XADD', e, 'MAXLEN', '0', '0-1', 't', '') -- empty: no 4 KB node
      local ttl = redis.call('PTTL', j)
      if ttl > 0 then redis.call('PEXPIRE', e, ttl) end
    end
    if f[2] then redis.call('HSET', j, '_es', '1') end -- (none: an earlier release's job)
  end
end
return out
