-- ARGV: P, id, now, keep_until|''. The job's latest message becomes pending, due now (id, body
-- and log kept); its claim grows, so an attempt still in flight is not recorded, and its tries
-- start again. A terminal job that would expire before keep_until (its new schedule's end) is
-- kept until then, and its messages with it.
local id, now, keep = ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', jkey(id)) == 0 then return {'missing'} end
local msg = redis.call('LINDEX', whjob(id), -1)
if not msg or redis.call('EXISTS', whk(msg)) == 0 then return {'none'} end
redis.call('HSET', whk(msg), 'status', '"pending"', 'next_at', now, 'tries', 0)
redis.call('HINCRBY', whk(msg), 'claim', 1)
redis.call('ZADD', WH_DUE, now, msg)
redis.call('ZREM', WH_DELIVERED, msg)
redis.call('ZREM', WH_FAILED, msg)
keep_job_until(id, keep, now)
return {'ok', read_webhook(msg)}
