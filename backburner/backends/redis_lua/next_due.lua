-- ARGV: P, type, ... (no types: any). Returns '0' if a job is ready now, else the earliest
-- delayed run_at as text, else false.
local types = {}
if #ARGV > 1 then
  for i = 2, #ARGV do types[#types + 1] = ARGV[i] end
else
  types = redis.call('SMEMBERS', P .. 'types')
end
for _, ty in ipairs(types) do
  if redis.call('ZCARD', rkey(ty)) > 0 then return '0' end
end
local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
if #first == 0 then return false end
return first[2]
