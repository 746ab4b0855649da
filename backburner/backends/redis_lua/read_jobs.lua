-- ARGV: P, id, ... Returns for each id its JSON document, or false.
local out = {}
for i = 2, #ARGV do out[#out + 1] = read_job(ARGV[i]) end
return out
