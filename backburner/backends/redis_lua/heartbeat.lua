-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, task_id, fence, ...
local wid, wjson, now, lease = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local renewed = {}
local held, score = 0, lease_score(lease)
for i = 6, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  held = held + 1
  local j = jkey(id)
  local f = redis.call('HMGET', j, 'status', 'fence', 'worker_id')
  if f[1] == '"processing"' and f[2] == fence and f[3] == wjson then
    redis.call('HSET', j, 'lease_expires_at', lease)
    redis.call('ZADD', LEASES, score, id)
    renewed[#renewed + 1] = id
    renewed[#renewed + 1] = fence
  end
end
local previous = redis.call('HGET', P .. 'workers', wid)
local started = now
if previous then started = string.match(previous, '^([^ ]+)') end
redis.call('HSET', P .. 'workers', wid, started .. ' ' .. now .. ' ' .. held)
return renewed
