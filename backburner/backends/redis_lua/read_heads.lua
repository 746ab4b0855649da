-- ARGV: P, id, ... Returns each job's last event seq as text, or false if it does not exist.
local out = {}
for i = 2, #ARGV do out[#out + 1] = redis.call('HGET', jkey(ARGV[i]), '_ev') end
return out
