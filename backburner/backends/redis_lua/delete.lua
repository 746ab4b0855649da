-- ARGV: P, id
local id = ARGV[2]
local f = redis.call('HMGET', jkey(id), unpack(FORGET_FIELDS))
if not f[2] then return {'missing'} end
if not TERMINAL[raw(f[2])] then return {'invalid', raw(f[2])} end
forget(id, f)
return {'ok'}
