-- ARGV: P, now, limit, lease end. Leases up to limit due pending messages (oldest due first):
-- next_at moves to the lease end and claim grows by one (an attempt is recorded only under
-- the claim it was sent under). Returns their JSON documents. A due id whose message expired
-- with its job (no sweeper purged it first) is dropped and the next one taken instead.
local now, limit, lease_end = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local out, seen = {}, {}
while #out < limit do
  local ids = redis.call('ZRANGEBYSCORE', WH_DUE, '-inf', now, 'LIMIT', 0, limit - #out)
  local dropped = false
  for _, msg in ipairs(ids) do
    if not seen[msg] then
      seen[msg] = true
      if redis.call('EXISTS', whk(msg)) == 1 then
        redis.call('HSET', whk(msg), 'next_at', lease_end)
        redis.call('HINCRBY', whk(msg), 'claim', 1)
        redis.call('ZADD', WH_DUE, lease_end, msg)
        out[#out + 1] = read_webhook(msg)
      else
        redis.call('ZREM', WH_DUE, msg)
        dropped = true
      end
    end
  end
  if not dropped then break end
end
return out
