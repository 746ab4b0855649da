-- ARGV: P, slot key, holder, now, lease end. Returns 1 if holder's live lease was extended.
local k, holder, now = slotkey(ARGV[2]), ARGV[3], ARGV[4]
slot_drop_ended(k, now)
if not redis.call('ZSCORE', k, holder) then return 0 end
redis.call('ZADD', k, 'XX', ARGV[5], holder)
slot_keep(k, now)
return 1
