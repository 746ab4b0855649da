-- The batch form of finish (its body is the function `one`, of its own ARGV): ARGV is P, n,
-- then n groups of (their length, finish's ARGV after P). Returns the n replies, in order.
-- The next claims the finishes ask for are made after all of them, one claim per worker for
-- all its finishes that applied: one claim of many jobs costs Redis a fraction of as many
-- claims of one. Each asker's reply gets its share as finish alone would have given it.
local out, at = {}, 3
local askers, asks, order = {}, {}, {} -- worker id -> replies waiting; -> its latest ask
local decoded = {} -- a next-claim argument -> it decoded (false: not one): a worker's finishes
-- send the same text, decoded once
LATER = {} -- the groups' index and counter writes, made after the last group (write_later)
for k = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[at])
  local args = {ARGV[1], unpack(ARGV, at + 1, at + n)}
  local ask_json = args[9]
  args[9] = ''
  local ok, reply = pcall(one, args) -- a Lua error fails its own group only
  if not ok then
    reply = type(reply) == 'table' and reply.err and reply or redis.error_reply(tostring(reply))
  end
  reply = reply or false
  out[k] = reply
  if ask_json ~= '' and type(reply) == 'table' and reply[1] == 'ok' then
    local ask = decoded[ask_json]
    if ask == nil then
      ask = next_claim(ask_json) or false
      decoded[ask_json] = ask
    end
    if ask then
      ask.now = args[4] -- the latest: its lease ends lease seconds after the batch's last now
      if not askers[ask.w] then
        askers[ask.w] = {}
        order[#order + 1] = ask.w
      end
      asks[ask.w] = ask
      local claimed = reply[#reply] -- (the reply's last slot: the list finish fills)
      for _ = 1, tonumber(ask.n) or 1 do table.insert(askers[ask.w], claimed) end
    end
  end
  at = at + n + 1
end
write_later() -- before the claims, which read the queues and move index entries
for _, wid in ipairs(order) do
  local ask, waiting = asks[wid], askers[wid]
  local types = ask.t
  if type(types) ~= 'table' then types = redis.call('SMEMBERS', P .. 'types') end
  -- An error here fails no finish (they are applied): that worker just gets no jobs.
  local ok, jobs = pcall(claim_for, wid, ask.j, ask.now, lease_until(ask.now, ask.s), types,
    #waiting)
  if not ok then jobs = {} end
  for i, doc in ipairs(jobs) do
    local claimed = waiting[i]
    claimed[#claimed + 1] = doc
  end
end
return out
