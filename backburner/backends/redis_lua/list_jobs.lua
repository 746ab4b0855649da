-- ARGV: P, top ('+inf' or '(<seq>'), limit, budget, index, index, ... (two or more).
-- The jobs in every one of the listing indexes given (sorted sets of id by seq), newest
-- first: walks the smallest and keeps the ids all the others hold. Returns {next cursor or
-- '', document, ...}. At most `budget` entries are looked at: a page cut short by it still
-- has a cursor.
local top, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local indexes, smallest, size = {}, nil, nil
for i = 5, #ARGV do
  local key = P .. ARGV[i]
  local n = redis.call('ZCARD', key)
  if n == 0 then return {''} end
  if not size or n < size then
    if smallest then indexes[#indexes + 1] = smallest end
    smallest, size = key, n
  else
    indexes[#indexes + 1] = key
  end
end
local function in_all(id)
  for _, key in ipairs(indexes) do
    if not redis.call('ZSCORE', key, id) then return false end
  end
  return true
end
local out, seqs = {''}, {}
local looked, batch = 0, math.min(budget, math.max(limit + 1, 100))
while true do
  local found = redis.call('ZREVRANGEBYSCORE', smallest, top, '-inf', 'WITHSCORES', 'LIMIT', 0,
    batch)
  for i = 1, #found, 2 do
    local id, seq = found[i], found[i + 1]
    looked = looked + 1
    if in_all(id) then
      if #seqs == limit then
        out[1] = seqs[limit]
        return out
      end
      local doc = read_job(id)
      if doc then
        out[#out + 1] = doc
        seqs[#seqs + 1] = seq
      end
    end
    if looked >= budget then
      out[1] = seq
      return out
    end
    top = '(' .. seq
  end
  if #found < 2 * batch then return out end
end
