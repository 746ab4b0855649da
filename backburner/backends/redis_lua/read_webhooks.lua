-- ARGV: P, id. Returns {'missing'} without the job, else {'ok', document, ...}: the JSON
-- documents of its webhook messages, oldest first.
local id = ARGV[2]
if redis.call('EXISTS', jkey(id)) == 0 then return {'missing'} end
local out = {'ok'}
for _, msg in ipairs(redis.call('LRANGE', whjob(id), 0, -1)) do
  local doc = read_webhook(msg)
  if doc then out[#out + 1] = doc end
end
return out
