-- ARGV: P, index, other index, top ('+inf' or '(<seq>'), limit, budget.
-- The jobs in both listing indexes (sorted sets of id by seq), newest first: walks the
-- smaller one and keeps the ids the other holds. Returns {next cursor or '', document, ...}.
-- At most `budget` entries are looked at: a page cut short by it still has a cursor.
local a, b = P .. ARGV[2], P .. ARGV[3]
if redis.call('ZCARD', a) > redis.call('ZCARD', b) then a, b = b, a end
local top, limit, budget = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local out, seqs = {''}, {}
local looked, batch = 0, math.min(budget, math.max(limit + 1, 100))
while true do
  local found = redis.call('ZREVRANGEBYSCORE', a, top, '-inf', 'WITHSCORES', 'LIMIT', 0, batch)
  for i = 1, #found, 2 do
    local id, seq = found[i], found[i + 1]
    looked = looked + 1
    if redis.call('ZSCORE', b, id) then
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
