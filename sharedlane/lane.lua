-- One shared lane's grant decisions, atomically, on Redis' clock.
--
-- KEYS (one hash slot: every key carries the lane's {tag}):
--   1 h   ZSET  holder id -> lease expiry (ms)
--   2 hc  HASH  holder id -> "class|process"
--   3 qx  ZSET  waiter id -> lease expiry (ms)
--   4 qc  HASH  waiter id -> "class|arrival|enqueued|process"
--   5-7 q0 q1 q2  ZSET  waiter id -> logical arrival (ms), one per class
--   8 g   HASH  granted waiter id, not yet claimed -> grant time (ms)
--   9 m   HASH  seq (id counter), since (queue non-empty since, ms), lane (its key),
--               boot (the server's start, ms)
-- ARGV: op, channel, tag, ttl (ms), limit, reserve, aging step (ms), then the op's.
--
-- For one lease TTL after Redis starts (or restarts, empty), nothing is
-- granted: the processes whose calls were running re-register them first
-- (a renewal finds its lease gone and takes it again, by force), so a
-- restart cannot hand out slots that running calls still use.
--
-- Ids are a 16-digit hex sequence and the caller's random suffix, so that
-- their string order is their enqueue order (FIFO among equal arrivals)
-- and an id can never be mistaken for another after the lane's counter
-- expires with the lane.
local H, HC, QX, QC, G, M = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[8], KEYS[9]
local Q = {KEYS[5], KEYS[6], KEYS[7]}
local op, channel, tag = ARGV[1], ARGV[2], ARGV[3]
local ttl, limit, reserve, step = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if reserve > limit - 1 then reserve = limit - 1 end
if reserve < 0 then reserve = 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The server's start, from its uptime (whole seconds, so the estimate is
-- never earlier than the truth), kept in the lane's meta key so that INFO
-- runs once per lane rather than once per call; the key goes with a
-- restart, and the estimate is made again.
local quietness
local function quiet()
  if quietness == nil then
    local boot = tonumber(redis.call('HGET', M, 'boot') or '')
    if not boot then
      local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
      boot = now - up * 1000
      redis.call('HSET', M, 'boot', boot)
    end
    quietness = now < boot + ttl
  end
  return quietness
end

local function queued()
  return redis.call('ZCARD', Q[1]) + redis.call('ZCARD', Q[2]) + redis.call('ZCARD', Q[3])
end

local function unqueue(id)
  local v = redis.call('HGET', QC, id)
  if not v then return false end
  redis.call('ZREM', Q[tonumber(string.sub(v, 1, 1)) + 1], id)
  redis.call('ZREM', QX, id)
  redis.call('HDEL', QC, id)
  if queued() == 0 then redis.call('HDEL', M, 'since') end
  return true
end

local function unhold(id)
  local n = redis.call('ZREM', H, id)
  redis.call('HDEL', HC, id)
  redis.call('HDEL', G, id)
  return n == 1
end

local function counts()
  local n, others = 0, 0
  for _, v in ipairs(redis.call('HVALS', HC)) do
    n = n + 1
    if string.sub(v, 1, 1) ~= '0' then others = others + 1 end
  end
  return n, others
end

-- The reserve caps the holders whose own class is not interactive.
local function fits(c, n, others)
  return n < limit and (c == 0 or others < limit - reserve)
end

-- head is the first waiter of class c, with its effective class (rank):
-- its own, raised one step per aging step since its logical arrival.
-- Within a class the earliest arrival has aged the most, so the heads are
-- the only candidates.
local function head(c)
  local r = redis.call('ZRANGE', Q[c + 1], 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  local at = tonumber(r[2])
  local rank = c - math.max(0, math.floor((now - at) / step))
  return {id = r[1], c = c, at = at, rank = math.max(0, rank)}
end

local function before(a, b)
  if a.rank ~= b.rank then return a.rank < b.rank end
  if a.at ~= b.at then return a.at < b.at end
  return a.id < b.id
end

local function hold(id, c, proc, expiry)
  redis.call('ZADD', H, expiry or (now + ttl), id)
  redis.call('HSET', HC, id, c .. '|' .. proc)
end

-- dispatch grants slots to waiters while any may have one, and tells the
-- waiting processes.
local function dispatch()
  local granted = {}
  if limit == 0 or queued() == 0 or quiet() then return granted end
  local n, others = counts()
  while n < limit do
    local best
    for c = 0, 2 do
      local h = head(c)
      if h and (best == nil or before(h, best)) then best = h end
    end
    if best == nil then break end
    if not fits(best.c, n, others) then
      best = head(0) -- only an interactive call may take a reserved slot
      if best == nil then break end
    end
    local v = redis.call('HGET', QC, best.id)
    local proc = string.match(v, '^[^|]*|[^|]*|[^|]*|(.*)$')
    -- The slot keeps the place's lease: a dead process's place granted
    -- just before it lapses lapses as a slot just as soon.
    local expiry = tonumber(redis.call('ZSCORE', QX, best.id))
    unqueue(best.id)
    hold(best.id, best.c, proc, expiry)
    redis.call('HSET', G, best.id, now)
    n = n + 1
    if best.c ~= 0 then others = others + 1 end
    granted[#granted + 1] = best.id
  end
  if #granted > 0 then
    redis.call('PUBLISH', channel, tag .. ' ' .. table.concat(granted, ','))
  end
  return granted
end

-- sweep drops the leases that lapsed (their process stopped renewing
-- them) and grants what they held.
local function sweep()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', H, '-inf', now)) do unhold(id) end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', QX, '-inf', now)) do unqueue(id) end
  -- Whatever freed a slot (a lapsed lease, the end of the quiet time),
  -- the waiters get it now.
  dispatch()
end

local function newid(suffix)
  return string.format('%016x', redis.call('HINCRBY', M, 'seq', 1)) .. ':' .. suffix
end

sweep()
local out
if op == 'acquire' then
  -- ARGV 8 class, 9 age of the logical arrival (ms), 10 process, 11 lane key, 12 id suffix
  local c, age, proc = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
  redis.call('HSET', M, 'lane', ARGV[11])
  local n, others = counts()
  local id = newid(ARGV[12])
  if queued() == 0 and fits(c, n, others) and not quiet() then
    hold(id, c, proc)
    out = {'granted', id, 0}
  else
    local at = now - age
    if queued() == 0 then redis.call('HSET', M, 'since', now) end
    redis.call('ZADD', Q[c + 1], at, id)
    redis.call('ZADD', QX, now + ttl, id)
    redis.call('HSET', QC, id, c .. '|' .. at .. '|' .. now .. '|' .. proc)
    -- A newcomer can be served at once: an interactive call may take a
    -- slot the queued work may not, and an early arrival may rank first.
    for _, g in ipairs(dispatch()) do
      if g == id then
        redis.call('HDEL', G, id)
        out = {'granted', id, 0}
      end
    end
    if not out then
      local pos = 0
      for k = 0, c do pos = pos + redis.call('ZCARD', Q[k + 1]) end
      out = {'queued', id, pos}
    end
  end
elseif op == 'release' then
  -- ARGV 8 id
  local ok = unhold(ARGV[8])
  dispatch()
  out = ok and 1 or 0
elseif op == 'cancel' then
  -- ARGV 8 id: leave the queue. A grant that came first is claimed. A
  -- waiter that leaves is told where it stood: {'removed', its place in
  -- the serving order, the waiters then (itself included), and for a
  -- newcomer of each class the waiters that would be served before it
  -- once it has gone}, so that a queue timeout reports the lane's global
  -- figures. It scans the queue, as an in-process lane's timeout does.
  local id = ARGV[8]
  local v = redis.call('HGET', QC, id)
  if v then
    local c = tonumber(string.sub(v, 1, 1))
    local me = {id = id, c = c, at = tonumber(redis.call('ZSCORE', Q[c + 1], id))}
    me.rank = math.max(0, c - math.max(0, math.floor((now - me.at) / step)))
    local pos, n, by = 1, 0, {0, 0, 0}
    for k = 0, 2 do
      local r = redis.call('ZRANGE', Q[k + 1], 0, -1, 'WITHSCORES')
      for i = 1, #r, 2 do
        n = n + 1
        if r[i] ~= id then
          local at = tonumber(r[i + 1])
          local o = {id = r[i], c = k, at = at, rank = math.max(0, k - math.max(0, math.floor((now - at) / step)))}
          if before(o, me) then pos = pos + 1 end
          by[o.rank + 1] = by[o.rank + 1] + 1
        end
      end
    end
    unqueue(id)
    out = {'removed', pos, n, by[1], by[1] + by[2], by[1] + by[2] + by[3]}
  elseif redis.call('HDEL', G, ARGV[8]) == 1 or redis.call('ZSCORE', H, ARGV[8]) then
    out = 'granted'
  else
    out = 'gone'
  end
elseif op == 'take' then
  -- ARGV 8 id: claim a grant.
  if redis.call('HDEL', G, ARGV[8]) == 1 then
    out = 'granted'
  elseif redis.call('HEXISTS', QC, ARGV[8]) == 1 then
    out = 'queued'
  elseif redis.call('ZSCORE', H, ARGV[8]) then
    out = 'granted'
  else
    out = 'gone'
  end
elseif op == 'renew' then
  -- ARGV 8.. ids: h (held), q (queued) or - (gone), in order.
  out = {}
  for i = 8, #ARGV do
    local id = ARGV[i]
    if redis.call('ZSCORE', H, id) then
      redis.call('ZADD', H, 'XX', now + ttl, id)
      out[#out + 1] = 'h'
    elseif redis.call('ZSCORE', QX, id) then
      redis.call('ZADD', QX, 'XX', now + ttl, id)
      out[#out + 1] = 'q'
    else
      out[#out + 1] = '-'
    end
  end
elseif op == 'reclaim' then
  -- ARGV 8 class, 9 process, 10 force (1 or 0), 11 id suffix: a slot for
  -- a call already running (its lease was lost with a restarted store, or
  -- it ran on local lanes while the store was down).
  local c = tonumber(ARGV[8])
  local n, others = counts()
  if ARGV[10] == '1' or quiet() or (queued() == 0 and fits(c, n, others)) then
    local id = newid(ARGV[11])
    hold(id, c, ARGV[9])
    out = id
  else
    out = false
  end
elseif op == 'state' then
  -- now, queued by class, queue non-empty since, oldest enqueue, holders' "class|process"...
  local oldest = ''
  for _, v in ipairs(redis.call('HVALS', QC)) do
    local enq = tonumber(string.match(v, '^[^|]*|[^|]*|([^|]*)|'))
    if oldest == '' or enq < oldest then oldest = enq end
  end
  out = {tostring(now), redis.call('ZCARD', Q[1]), redis.call('ZCARD', Q[2]), redis.call('ZCARD', Q[3]),
    redis.call('HGET', M, 'since') or '', tostring(oldest)}
  for _, v in ipairs(redis.call('HVALS', HC)) do out[#out + 1] = v end
else
  return redis.error_reply('unknown op ' .. tostring(op))
end
-- Every key of the lane outlives its last op by four leases, then goes: a
-- lane whose holders died (SIGKILL) and that nobody calls again leaves
-- nothing behind. Any live holder or waiter renews it well before. A read
-- (state: every scrape, and lanes-exporter's history every 2 s) keeps no
-- lane alive; it only gives a key it made (a grant its sweep dispatched)
-- the same life.
for i = 1, #KEYS do
  if op ~= 'state' or redis.call('PTTL', KEYS[i]) == -1 then redis.call('PEXPIRE', KEYS[i], ttl * 4) end
end
return out
