-- ARGV: P, type, ... (no types: any). Returns '0' if a job is ready now, else the earliest
-- delayed run_at as text, else false.
local types = types_from(2)
for _, ty in ipairs(types) do
  if redis.call('ZCARD', rkey(ty)) > 0 then return '0' end
end
local first = redis.call('ZRANGE', DELAYED, '0', '0', 'WITHSCORES')
if #first == 0 then return false end
return first[2]
