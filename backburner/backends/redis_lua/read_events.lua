-- ARGV: P, id, after, limit. Returns the job's events with seq > after as XRANGE entries:
-- {id "<seq>-0", {"t", type, "d", data, "a", at}}; the first ("queued") is made, not stored.
local id, after, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
if after < 1 then
  local created = redis.call('HGET', jkey(id), '_ca')
  if not created then return out end
  out[1] = {'1-0', {'t', 'status', 'd', '{"status":"queued"}', 'a', created}}
  limit = limit - 1
  if limit <= 0 then return out end
end
local entries = redis.call('XRANGE', ekey(id), math.max(after, 1) + 1 .. '-0', '+', 'COUNT', limit)
for _, entry in ipairs(entries) do out[#out + 1] = entry end
return out
