-- ARGV: P, limit, cursor score|'', cursor msg_id|''. Failed messages, latest failure first
-- (equal times: msg_id descending, as ZREVRANGEBYSCORE orders them), from just after the
-- cursor's (score, msg_id). Returns {score, msg_id} of the page's last message when more
-- follow (else {'', ''}), then the page's JSON documents. An id whose message is gone (Redis
-- expired it with its job before a purge removed it) is skipped.
local limit, score, after = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local docs, last, more = {}, {'', ''}, false

local function below(a, b) -- a < b byte by byte (Lua's < compares by the server's locale)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function take(msg, at) -- false once the page is full and another message exists
  local doc = read_webhook(msg)
  if not doc then return true end
  if #docs == limit then
    more = true
    return false
  end
  docs[#docs + 1] = doc
  last = {at, msg}
  return true
end

local top = '+inf'
if score ~= '' then
  top = '(' .. score
  for _, msg in ipairs(redis.call('ZREVRANGEBYSCORE', WH_FAILED, score, score)) do
    if below(msg, after) and not take(msg, score) then break end
  end
end
local offset = 0
while not more do
  local batch = redis.call('ZREVRANGEBYSCORE', WH_FAILED, top, '-inf', 'WITHSCORES', 'LIMIT',
    offset, limit + 1)
  for i = 1, #batch, 2 do
    if not take(batch[i], batch[i + 1]) then break end
  end
  if #batch < 2 * (limit + 1) then break end
  offset = offset + limit + 1
end
if not more then last = {'', ''} end
return {last[1], last[2], unpack(docs)}
