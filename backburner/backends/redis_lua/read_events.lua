-- ARGV: P, id, after, limit. Returns the job's events with seq > after, oldest first, at most
-- limit, as XRANGE entries: {"<seq>-0", {"t", type, "d", data, "a", at}}. Those that are not in
-- its stream are made here (prelude: event): the first ("queued") from _ca, and those its
-- attempts' records stand for ("ev": its claim's, "ee": the first of its Complete's, Fail's or
-- RetryAt's, "ra": a RetryAt's run_at) from the records and the job's result.
local id, after, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local f = redis.call('HMGET', jkey(id), '_ca', '_hist', '_cur', 'result')
if not f[1] then return {} end
local made = {} -- {seq, entry}, by seq
local function add(seq, type, data, at)
  if seq > after then
    made[#made + 1] = {seq, {string.format('%d-0', seq), {'t', type, 'd', data, 'a', at}}}
  end
end
add(1, 'status', '{"status":"queued"}', f[1])
local records = {}
if f[2] or f[3] then
  local parts = {}
  if f[2] then parts[1] = f[2] end
  if f[3] then parts[#parts + 1] = f[3] .. '}' end
  local ok, decoded = pcall(cjson.decode, '[' .. table.concat(parts, ',') .. ']')
  if ok and type(decoded) == 'table' then records = decoded end
end
for _, r in ipairs(records) do
  local attempt = string.format('%d', tonumber(r.attempt) or 0)
  if tonumber(r.ev) then
    add(tonumber(r.ev), 'status', '{"status":"processing","attempt":' .. attempt ..
      ',"worker_id":' .. cjson.encode(r.worker_id) .. '}', num(r.started_at))
  end
  local first = tonumber(r.ee)
  if first and tonumber(r.finished_at) then
    local at = num(r.finished_at)
    if r.outcome == 'completed' then
      add(first, 'status', '{"status":"completed","result":' .. (f[4] or 'null') .. '}', at)
    elseif r.outcome == 'failed' or r.outcome == 'retry' then
      local err = cjson.encode(r.error)
      if r.outcome == 'failed' then
        add(first, 'attempt_failed', '{"error":' .. err .. ',"attempt":' .. attempt .. '}', at)
        add(first + 1, 'status', '{"status":"failed","error":' .. err .. '}', at)
      else
        add(first, 'attempt_failed', '{"error":' .. err .. ',"retry_at":' .. num(r.ra) ..
          ',"attempt":' .. attempt .. '}', at)
        add(first + 1, 'status', '{"status":"queued"}', at)
      end
    end
  end
end
table.sort(made, function(a, b) return a[1] < b[1] end)
-- (An id as '%d': Lua writes a number of 15 digits or more as 1e+14, which no id is.)
local streamed = redis.call('XRANGE', ekey(id), string.format('%d-0', math.max(after, 1) + 1),
  '+', 'COUNT', limit)
local out, m, s = {}, 1, 1
while #out < limit and (m <= #made or s <= #streamed) do
  local here = streamed[s] and tonumber(string.match(streamed[s][1], '^(%d+)'))
  if here and (m > #made or here <= made[m][1]) then
    if m <= #made and here == made[m][1] then m = m + 1 end -- (in both: once)
    out[#out + 1] = streamed[s]
    s = s + 1
  else
    out[#out + 1] = made[m][2]
    m = m + 1
  end
end
return out
