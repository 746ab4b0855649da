-- ARGV: P, top ('+inf' or '(<seq>'), limit, budget, group, group, ... (one or more).
-- The jobs in every one of the groups given, newest first. A group is a set of listing
-- indexes (sorted sets of id by seq, no id in two of them), written as one argument:
-- '=<index>' one index (i:all, i:st:<status>:<type>, i:n:<tenant>, i:p:<parent id>),
-- 's<status>' the status's index of every task type, 't<type>' the type's index of every
-- status. Walks the smallest group, merging its indexes by seq, and keeps the ids every other
-- group holds. Returns {next cursor or '', document, ...}. At most `budget` entries are looked
-- at: a page cut short by it still has a cursor.
local top, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

-- A group's indexes that hold anything, and how many entries they hold together.
local function indexes_of(group)
  local kind, name, keys = string.sub(group, 1, 1), string.sub(group, 2), {}
  if kind == 's' then
    for _, ty in ipairs(redis.call('SMEMBERS', P .. 'types')) do
      keys[#keys + 1] = stkey(name, ty)
    end
  elseif kind == 't' then
    for _, status in ipairs(STATUSES) do keys[#keys + 1] = stkey(status, name) end
  else
    keys[1] = P .. name
  end
  local held, size = {}, 0
  for _, key in ipairs(keys) do
    local n = redis.call('ZCARD', key)
    if n > 0 then
      held[#held + 1] = key
      size = size + n
    end
  end
  return held, size
end

local walked, filters, smallest = nil, {}, nil
for i = 5, #ARGV do
  local keys, size = indexes_of(ARGV[i])
  if size == 0 then return {''} end
  if not smallest or size < smallest then
    if walked then filters[#filters + 1] = walked end
    walked, smallest = keys, size
  else
    filters[#filters + 1] = keys
  end
end

local function in_all(id)
  for _, keys in ipairs(filters) do
    local found = false
    for _, key in ipairs(keys) do
      if redis.call('ZSCORE', key, id) then
        found = true
        break
      end
    end
    if not found then return false end
  end
  return true
end

-- Up to n entries of the walked group below top, newest first: {id, seq, id, seq, ...}, as
-- ZREVRANGEBYSCORE gives them. Fewer than n: there are no more.
local function entries_below(top, n)
  if #walked == 1 then
    return redis.call('ZREVRANGEBYSCORE', walked[1], top, '-inf', 'WITHSCORES', 'LIMIT', 0, n)
  end
  local rows = {}
  for _, key in ipairs(walked) do
    local found = redis.call('ZREVRANGEBYSCORE', key, top, '-inf', 'WITHSCORES', 'LIMIT', 0, n)
    for i = 1, #found, 2 do rows[#rows + 1] = {found[i], found[i + 1], tonumber(found[i + 1])} end
  end
  table.sort(rows, function(a, b) return a[3] > b[3] end)
  local out = {}
  for i = 1, math.min(n, #rows) do
    out[#out + 1] = rows[i][1]
    out[#out + 1] = rows[i][2]
  end
  return out
end

local out, seqs = {''}, {}
local looked, batch = 0, math.min(budget, math.max(limit + 1, 100))
while true do
  local found = entries_below(top, batch)
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
