"""The Lua scripts of the step record (`step_record.py` explains the protocol they implement).

Each runs atomically on Redis; every key a script touches shares the batch queue's hash tag. The
queue's own keys (pending, processing lists, heartbeats, known, acked, closed) follow
`gyre.store.workqueue`; the record's are `join` (state, step, final, cells, version), `participants`,
`evicted`, `ready`, `metrics` and `done:<cell>`.
"""

OPEN = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'open', 'step', ARGV[1], 'final', ARGV[2])
end
return 1
"""

# KEYS: join, evicted; ARGV: cell
STATUS = """
local v = redis.call('HMGET', KEYS[1], 'state', 'step', 'final', 'cells', 'version')
v[6] = redis.call('SISMEMBER', KEYS[2], ARGV[1])
return v
"""

# KEYS: join, participants, evicted, heartbeats; ARGV: cell, consumer, step
REGISTER = """
local st = redis.call('HMGET', KEYS[1], 'state', 'step')
if not st[1] then return 'not_open' end
if st[1] ~= 'open' then return 'closed' end
if st[2] ~= ARGV[3] then return 'wrong_step' end
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 'evicted' end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[4], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return 'registered'
"""

# KEYS: processing:<consumer>, done:<cell>, evicted, metrics, join; ARGV: item, cell, metrics json
# (a satellite that finishes an item twice is evicted; the core never is: it resets, see RESET)
MARK_DONE = """
local state = redis.call('HGET', KEYS[5], 'state')
if state ~= 'open' and state ~= 'closing' then return 0 end
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 1 then return 0 end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  if ARGV[2] ~= '0' then redis.call('SADD', KEYS[3], ARGV[2]) end
  return 0
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
return 1
"""

# KEYS: join, evicted, processing:<consumer>, pending; ARGV: cell
EVICT_SELF = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'open' and state ~= 'closing' then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
local ids = redis.call('LRANGE', KEYS[3], 0, -1)
for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[4], ids[i]) end
redis.call('DEL', KEYS[3])
return 1
"""

# KEYS: processing:<consumer>, pending, done:<cell>, metrics; ARGV: cell
RESET = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[2], ids[i]) end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('HDEL', KEYS[4], ARGV[1])
return #ids
"""

# KEYS: processing:<consumer>, pending
RELEASE = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[2], ids[i]) end
redis.call('DEL', KEYS[1])
return #ids
"""

# KEYS: processing:<consumer>, acked
# (payloads stay: a core that restarts before its next checkpoint replays the step from them, and drops
# them once a checkpoint covers the step: services/cell_agent/replay.py)
ACK_ALL = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  redis.call('SADD', KEYS[2], id)
end
redis.call('DEL', KEYS[1])
return #ids
"""

# KEYS: join, participants, evicted, ready, metrics, pending
# ARGV: processing-list prefix, done-set prefix, consumer prefix, number of cells
# A core process that (re)joins a step an earlier core process had begun: whatever that step had gathered
# (claims, finished micro-steps, gradients in the memory of the dead core, a closing window) is void.
# Every claim goes back to the head of the queue, every finished mark is forgotten, the window reopens.
# The satellites that had registered with the earlier core are evicted: each is still inside the step
# (claiming, computing, marking done) without being a participant any more, so the window could never
# close on the items it holds; evicted, it finds out at its next mark or status check, gives its claims
# back and leaves the step (a later JoinBatch finds the window of the next step).
RESTART = """
local earlier = redis.call('SMEMBERS', KEYS[2])
for c = tonumber(ARGV[4]) - 1, 0, -1 do
  local plist = ARGV[1] .. ARGV[3] .. c
  local ids = redis.call('LRANGE', plist, 0, -1)
  for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[6], ids[i]) end
  redis.call('DEL', plist, ARGV[2] .. c)
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
for _, cell in ipairs(earlier) do
  if cell ~= '0' then redis.call('SADD', KEYS[3], cell) end
end
redis.call('HSET', KEYS[1], 'state', 'open')
redis.call('HDEL', KEYS[1], 'cells', 'version')
return 1
"""

# KEYS: join, acked; ARGV: processing-list prefix, consumer prefix, number of cells, version
# A step a restarted core took again from its stored micro-steps: every item is acknowledged, it is done.
FINISH_REPLAYED = """
for c = 0, tonumber(ARGV[3]) - 1 do
  local plist = ARGV[1] .. ARGV[2] .. c
  for _, id in ipairs(redis.call('LRANGE', plist, 0, -1)) do redis.call('SADD', KEYS[2], id) end
  redis.call('DEL', plist)
end
redis.call('HSET', KEYS[1], 'state', 'done', 'version', ARGV[4])
return 1
"""

# KEYS: join, participants, evicted, heartbeats, pending, known, acked, closed, ready
# ARGV: heartbeat timeout s, processing-list prefix, done-set prefix, consumer prefix
TRY_CLOSE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'open' and state ~= 'closing' then
  return {state or '', redis.call('HGET', KEYS[1], 'cells') or '', 'not_open'}
end
local function plist(c) return ARGV[2] .. ARGV[4] .. c end
local function evict(c)
  redis.call('SADD', KEYS[3], c)
  local ids = redis.call('LRANGE', plist(c), 0, -1)
  for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[5], ids[i]) end
  redis.call('DEL', plist(c))
end
local function wait(reason)
  if state == 'closing' then
    redis.call('HSET', KEYS[1], 'state', 'open')
    redis.call('HDEL', KEYS[1], 'cells')
    redis.call('DEL', KEYS[9])
  end
  return {'open', '', reason}
end
if redis.call('EXISTS', KEYS[8]) == 0 then return wait('stream_open') end
if redis.call('LLEN', KEYS[5]) > 0 then return wait('pending') end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local cells = {}
for _, c in ipairs(redis.call('SMEMBERS', KEYS[2])) do table.insert(cells, tonumber(c)) end
table.sort(cells)
local held = {}
for _, c in ipairs(cells) do
  local cs = tostring(c)
  if redis.call('SISMEMBER', KEYS[3], cs) == 0 then
    local n = redis.call('LLEN', plist(cs))
    local score = redis.call('ZSCORE', KEYS[4], ARGV[4] .. cs)
    local fresh = score and tonumber(score) >= now - tonumber(ARGV[1])
    local clean = true
    for _, id in ipairs(redis.call('SMEMBERS', ARGV[3] .. cs)) do
      if not redis.call('LPOS', plist(cs), id) then clean = false break end
    end
    if fresh and not clean and cs == '0' then
      return wait('core_reset')
    elseif fresh and not clean then
      evict(cs)
      return wait('evicted')
    elseif fresh then
      if redis.call('SCARD', ARGV[3] .. cs) < n then return wait('computing') end
      held[c] = n
    elseif n > 0 then
      return wait('stale')
    end
  end
end
local m = 0
while held[m] ~= nil do m = m + 1 end
if m == 0 then return wait('no_core') end
local total, gap = 0, false
for c, n in pairs(held) do
  if c < m then total = total + n else evict(tostring(c)); gap = true end
end
if gap then return wait('evicted') end
if total ~= redis.call('SCARD', KEYS[6]) - redis.call('SCARD', KEYS[7]) then return wait('unaccounted') end
local list = {}
for c = 0, m - 1 do table.insert(list, tostring(c)) end
local csv = table.concat(list, ',')
if state ~= 'closing' or redis.call('HGET', KEYS[1], 'cells') ~= csv then
  redis.call('HSET', KEYS[1], 'state', 'closing', 'cells', csv)
  redis.call('DEL', KEYS[9])
end
redis.call('SADD', KEYS[9], '0')
for _, c in ipairs(list) do
  if redis.call('SISMEMBER', KEYS[9], c) == 0 then return {'closing', csv, 'confirming'} end
end
redis.call('HSET', KEYS[1], 'state', 'closed')
redis.call('DEL', KEYS[9])
return {'closed', csv, 'closed'}
"""

# KEYS: join, ready; ARGV: cell
CONFIRM = """
if redis.call('HGET', KEYS[1], 'state') ~= 'closing' then return 0 end
for c in string.gmatch(redis.call('HGET', KEYS[1], 'cells') or '', '[^,]+') do
  if c == ARGV[1] then
    redis.call('SADD', KEYS[2], ARGV[1])
    return 1
  end
end
return 0
"""
