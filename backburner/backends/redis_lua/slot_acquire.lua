-- ARGV: P, slot key, holder, limit, now, lease end. Returns 1 if holder holds a slot now.
local k, holder, limit, now = slotkey(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
slot_drop_ended(k, now)
if not redis.call('ZSCORE', k, holder) and redis.call('ZCARD', k) >= limit then return 0 end
redis.call('ZADD', k, ARGV[6], holder)
slot_keep(k, now)
return 1
