-- ARGV: P, worker_id, worker_id as JSON, lease_s, registration ttl_s, type, ... (no types: any)
-- A worker about to wait for work. If a job of its types is ready, returns '0' (it should
-- claim). Else it registers as idle for hand-off (prelude: hand_off) and returns the earliest
-- delayed run_at as text, or false: when it should look again at the latest.
local wid, wjson, lease_s, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local types = types_from(6)
for _, ty in ipairs(types) do
  if redis.call('ZCARD', rkey(ty)) > 0 then return '0' end
end
end_idle(wid)
if #types > 0 then
  local _, now = redis_clock()
  local lapses = now + ttl
  for _, ty in ipairs(types) do redis.call('ZADD', idlekey(ty), lapses, wid) end
  redis.call('HSET', IDLEW, wid, cjson.encode({t = types, j = wjson, l = lease_s}))
end
local first = redis.call('ZRANGE', DELAYED, '0', '0', 'WITHSCORES')
if #first == 0 then return false end
return first[2]
