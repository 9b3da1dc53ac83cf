-- One shared lane's grant decisions, atomically, on Redis' clock.
--
-- KEYS (one hash slot: every key carries the lane's {tag}):
--   1 h   ZSET  holder id -> lease expiry (ms)
--   2 hc  HASH  holder id -> "class|tenant|granted (ms)|charge|weight|estimate|cost|call|
--               grant|process|base|fresh|answered": charge is its tenant's ('-': none; 't' first:
--               in tokens); estimate and cost are what the token budget was charged
--               at the grant and now (0 without a budget); call is the call's
--               estimate, its use once settled ('' if it carried none); grant is
--               m's seq at its grant, so grants order as granted (see op limits); base is the
--               estimate as its caller gave it, before a raise (see calibrate); fresh
--               is '1' if the grant was its tenant's first (see newcomer); answered
--               is m's seq when its answer reported the provider's headers (see op
--               limits; '' until then)
--   3 qx  ZSET  waiter id -> lease expiry (ms)
--   4 qc  HASH  waiter id -> "class|arrival|enqueued|tenant|weight|estimate|process|base"
--   5-7 q0 q1 q2  ZSET  waiter id -> logical arrival (ms), one per class
--   8 g   HASH  granted waiter id, not yet claimed -> grant time (ms), or a waiter
--               refused as too large -> "x|budget|its size" (see refuse)
--   9 m   HASH  seq (the counter of ids and grants), since (queue non-empty since, ms), lane (its key),
--               boot and run (the server's start, ms, and its run id: see serverStart), tl and ta (the token budget's level and
--               when it was, ms), ti (the estimates of the calls holding slots), tb
--               (a budget is on: see adopt), pl (the token limit the provider last
--               announced as its own: a call estimated above it is refused until px,
--               one provider window after it was last heard; op reload clears
--               it), ms (a call has named a tenant: grants are charged from then
--               on), ex (when every key's expiry was last renewed, ms) and cp (the
--               cap whose counts i: keeps: see recount), sw (a bound on the earliest
--               lease in h and qx: see sweep), pu (until when pv may bind, ms),
--               pr (when idle tenants were last looked for, ms: see forget) and rc
--               (a reclaim emptied the bucket after a restart: see op reclaim)
--   10 t  HASH  the tenants' shares: v:NAME service (slot-seconds, or tokens, per
--               unit of weight), p:NAME the part of it charged to calls in flight,
--               e:NAME the mean slot-time of its calls (s), i:NAME its slots held
--               (kept while there is a cap), est (the lane's mean slot-time), last
--               (the tenant granted last, once charged), tok (a call carried a
--               token estimate: service is counted in tokens from then on, as in
--               package limiter), pc (the mean tokens of a call), o:NAME
--               "ratio|at (ms)" (how far its calls' use ran past their estimates:
--               see calibrate; o:+ the newcomers'), j:NAME (its last grant or
--               release, ms: set from its first grant, see newcomer) and nm (the
--               newcomers' mark: see lift)
--   11 pv  STRING  the provider's word (op limits: see provider), which expires
--               when it stops binding: at most two provider windows after it was said
-- Keys made from these (the same {tag}, so the same slot): q<c>@ SET of the tenants
-- waiting in class c; q<c>@@ ZSET of the same tenants by their service (v:), so that
-- the least served is found in O(log tenants) (see firstIn); q<c>@@@ ZSET of the same
-- tenants by their first waiter's arrival, so that tied tenants are ordered in one
-- call (see firstTied); q<c>@NAME ZSET of tenant NAME's waiters of class c, as q<c>.
-- Tenant names never hold '@'.
-- ARGV: op, channel, tag, ttl (ms), limit, reserve, aging step (ms), cap per tenant
-- (0: none), the time (ms; '' for Redis' own, always but in tests), tokens per
-- minute (0: no budget), the most tokens in flight (0: no bound), then the op's.
--
-- Token budgets (package limiter's Config.TokensPerMinute and MaxInflightTokens),
-- decided with the slot: the budget is a token bucket of tokens_per_minute that
-- refills continuously, kept in m. The first in line is granted only when the
-- bucket holds its estimate and the estimates in flight leave room for it; a
-- grant takes the estimate, a settlement (op settle) replaces it with the use.
-- A waiter larger than a whole budget (a reload made it so) is refused (op
-- reload, and dispatch). The provider's word (op limits, see provider) binds
-- with the budget, with or without one.
--
-- Order: package limiter's three steps, on Redis' clock (see its documentation
-- for the charges and the lift, and "The order" below). Each class keeps its
-- waiting tenants by service (q<c>@@): the least served is found in O(log
-- tenants) per grant, and only the tenants tied with it are read for their
-- heads.
--
-- For one lease TTL after Redis starts (or restarts, empty or from a
-- file: see serverStart), nothing is
-- granted: the processes whose calls were running re-register them first
-- (a renewal finds its lease gone and takes it again, by force), so a
-- restart cannot hand out slots that running calls still use.
--
-- Ids are a 16-digit hex sequence, the server's run and the caller's
-- random suffix (see newid), so that their string order is their enqueue
-- order (FIFO among equal arrivals) and an id can never be mistaken for
-- another after the lane's counter expires with the lane or a restart.
-- A call's state, set afresh by begin (below) at the start of every call:
-- the library is loaded once and its functions made once (making them on
-- every call, as a script's body does, cost more than the rest of an
-- uncontended acquire), so nothing here may outlive a call.
local KEYS, ARGV
local H, HC, QX, QC, G, M, T, PV, Q
local op, channel, tag, ttl, limit, reserve, step, cap, tpm, maxtok, now
local A = 11 -- the op's arguments are ARGV[A + 1] on
-- written: the keys the call wrote (see wr); meta: what it read of m (see
-- begin); the rest are read once, when first needed, and kept for the call.
local written, lasting, mw, meta, quietness, nq, pl, inTokens, tokenLevel, prov, provRead, budgeted, skip, measuredNow, swept, ti, shared, seq
local metaFields = {'boot', 'pl', 'tb', 'lane', 'ms', 'ex', 'cp', 'sw', 'pu', 'pr', 'since', 'ti', 'tl', 'ta', 'seq', 'px'}

-- begin sets the call's state from its keys and arguments (see the top).
local function begin(keys, args)
  KEYS, ARGV = keys, args
  H, HC, QX, QC, G, M, T, PV = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
  Q = {KEYS[5], KEYS[6], KEYS[7]}
  op, channel, tag = ARGV[1], ARGV[2], ARGV[3]
  ttl, limit, reserve, step = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  cap = tonumber(ARGV[8])
  tpm, maxtok = tonumber(ARGV[10]), tonumber(ARGV[11])
  if reserve > limit - 1 then reserve = limit - 1 end
  if reserve < 0 then reserve = 0 end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if ARGV[9] ~= '' then now = tonumber(ARGV[9]) end -- a test's clock (sharedlane.Config.Clock)
  written, lasting, mw, skip = {}, {}, {}, {}
  -- What the call reads of the meta hash, read once, by name (false when
  -- unset): boot, pl, tb, lane, ms (measured: a call has named a tenant),
  -- ex (the keys' last full refresh, ms), cp (the cap whose counts the
  -- tenants' i: fields keep), sw, pu, pr, since, the token budget's ti, tl
  -- and ta, and seq: one read for what an uncontended call needs of m.
  local r = redis.call('HMGET', M, unpack(metaFields))
  meta = {boot = r[1], pl = r[2], tb = r[3], lane = r[4], ms = r[5], ex = r[6], cp = r[7], sw = r[8], pu = r[9], pr = r[10],
    since = r[11], tl = r[13], ta = r[14]}
  ti = tonumber(r[12] or '') or 0 -- see inflightTokens
  seq = tonumber(r[15] or '') or 0 -- see nextSeq
  pl = tonumber(meta.pl or '') or 0 -- the provider's last announced token limit (0: none)
  meta.px = tonumber(r[16] or '') or 0 -- until when pl binds (ms): a window after it was last heard
  if pl > 0 and now >= meta.px then pl = 0 end
  budgeted = tpm > 0 or maxtok > 0 -- see adopt
  measuredNow = meta.ms ~= false -- see hold
  swept = meta.sw == 'n' and math.huge or tonumber(meta.sw or '') -- see sweep
  quietness, nq, inTokens, tokenLevel, prov, provRead, shared = nil, nil, nil, nil, nil, nil, nil
end

-- wr makes a write to key k (a command that may make the key), and notes k
-- for its expiry at the end of the script (see the end), unless the call
-- knows k was there before with its expiry and cannot have been emptied
-- since (lasting: see tenantFields).
local function wr(cmd, k, ...)
  written[k] = true
  if k == T then shared = nil end -- see tenantFields
  return redis.call(cmd, k, ...)
end

-- The server's start, from its uptime (whole seconds, so the estimate is
-- never earlier than the truth), kept in the lane's meta key beside the
-- server's run id, so that INFO runs once per lane rather than once per
-- call. The mark is checked against INFO once per lane in each life of
-- this library (checked, the one state kept between calls outside the
-- keyspace, on purpose: a restart and a load start it empty), and made
-- again when the run id it notes differs: after a restart the meta key is
-- gone or, restored from a file, names the run that wrote it. Either way the lane
-- gets its quiet time, and ids carry the new run (see newid).
local checked, nchecked, run = {}, 0, nil
local function serverStart()
  local boot = tonumber(meta.boot or '')
  if boot and checked[M] then return boot end
  local info = redis.call('INFO', 'server')
  run = string.sub(string.match(info, 'run_id:(%x+)') or '', 1, 12)
  local marked = redis.call('HGET', M, 'run')
  if not boot or (marked and marked ~= run) then
    local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
    boot = now - up * 1000
    wr('HSET', M, 'boot', boot, 'run', run)
    meta.boot = boot
  elseif not marked then
    wr('HSET', M, 'run', run) -- a mark made without its run (a test's): this run's
  end
  if nchecked >= 100000 then checked, nchecked = {}, 0 end -- bounded: a lane forgotten is checked again
  checked[M], nchecked = true, nchecked + 1
  return boot
end
local function quiet()
  if quietness == nil then quietness = now < serverStart() + ttl end
  return quietness
end

-- queued is how many wait (every waiter has a place's lease in qx), read
-- once and kept up to date by enqueue and unqueue. m's since is set while
-- any wait (enqueue sets it on an empty queue, unqueue deletes it as the
-- queue empties), so that a call on a lane where none waits counts no
-- queue: only a meta hash that existed before this call (its ex) is
-- trusted so, and a count that finds waiters where since is missing (m
-- went before qx) sets it again.
local function queued()
  if nq == nil then
    if meta.since == false and meta.ex ~= false then
      nq = 0
    else
      nq = redis.call('ZCARD', QX)
      if nq > 0 and meta.since == false then
        wr('HSET', M, 'since', now)
        meta.since = now
      end
    end
  end
  return nq
end

-- fields splits a "a|b|...|rest" value into n fields, the last taking the rest.
-- A value with fewer (an older version's, in a rolling upgrade) leaves the
-- fields past its own empty. The records' widths have a pattern each, made
-- at the load (concatenation only: the string library is not there yet),
-- because one match costs a third of splitting field by field in Lua.
local patterns = {}
do
  local one = '([^|]*)|'
  local widths = {2, 3, 8, 12, 13}
  for i = 1, #widths do -- no ipairs at the load either
    local n = widths[i]
    local p = '^'
    for _ = 1, n - 1 do p = p .. one end
    patterns[n] = p .. '(.*)$'
  end
end
local function fields(v, n)
  local p = patterns[n]
  if p then
    local out = {string.match(v, p)}
    if out[1] ~= nil then return out end
  end
  local out, from = {}, 1
  for i = 1, n - 1 do
    local j = string.find(v, '|', from, true)
    if not j then
      out[i] = string.sub(v, from)
      for k = i + 1, n do out[k] = '' end
      return out
    end
    out[i] = string.sub(v, from, j - 1)
    from = j + 1
  end
  out[n] = string.sub(v, from)
  return out
end

-- exact writes a number so that it reads back the same: Lua's own
-- tostring keeps 14 digits, and a service rounded so could order two
-- tenants apart from what they received.
local function exact(x)
  if x == math.floor(x) and x > -1e14 and x < 1e14 then return tostring(x) end -- whole: the same, cheaper
  return string.format('%.17g', x)
end

-- m's counter and token fields are written once, at the end of the call
-- (mw, see flush): a grant moves the counter, the bucket and the estimates
-- in flight, one HSET rather than three. They are read with the rest of m
-- (begin) and kept in seq, tokenLevel and ti meanwhile; nothing reads them
-- from m again within the call.
local function mset(k, v) mw[k] = v end
local function flush()
  if next(mw) == nil then return end
  local sets = {}
  for k, v in pairs(mw) do sets[#sets + 1], sets[#sets + 2] = k, v end
  wr('HSET', M, unpack(sets))
end
-- nextSeq moves m's counter of ids and grants on, and returns it.
local function nextSeq()
  seq = seq + 1
  mset('seq', exact(seq))
  return seq
end

local function num(k, default)
  return tonumber(redis.call('HGET', T, k) or '') or default
end

-- share reads tenant's service, its pending charges, its mean slot-time
-- and the lane's, whether it is a newcomer, the mean tokens of a call (pc)
-- and the newcomers' mark (nm), in one call (a missing mean is the lane's;
-- the lane's, 1 s); and, once per call, whether service is in tokens (see
-- tokens).
--
-- tenantFields is that read (and the tenant's o:, see calibrate), kept
-- until t is next written (wr), so that an acquire reads its tenant once.
local function tenantFields(tenant)
  if shared == nil or shared.tenant ~= tenant then
    shared = redis.call('HMGET', T, 'v:' .. tenant, 'p:' .. tenant, 'e:' .. tenant, 'est', 'j:' .. tenant, 'tok', 'pc', 'nm', 'o:' .. tenant)
    shared.tenant = tenant
    -- est and tok are never deleted (forget and recount delete only a
    -- tenant's fields): t, there with either before this call wrote it, was
    -- there at the call's start, so it has its expiry (every key has one at
    -- the end of a call, of at least three lease TTLs: see expire) and stays
    -- there through the call.
    if (shared[4] or shared[6]) and not written[T] then lasting[T] = true end
  end
  return shared
end
local function share(tenant)
  local r = tenantFields(tenant)
  local est = tonumber(r[4] or '') or 1
  if inTokens == nil then inTokens = r[6] ~= false end
  return tonumber(r[1] or '') or 0, tonumber(r[2] or '') or 0, tonumber(r[3] or '') or est, est,
    tenant ~= 'default' and not r[5], tonumber(r[7] or '') or 0, tonumber(r[8] or '') or 0
end

-- newcomer reports whether tenant has not been granted a call on the lane
-- (since it was forgotten): 'default' never is.
local function newcomer(tenant)
  return tenant ~= 'default' and redis.call('HEXISTS', T, 'j:' .. tenant) == 0
end

local function tq(c, tenant) return Q[c + 1] .. '@' .. tenant end
local function byService(c) return Q[c + 1] .. '@@' end -- see firstIn
local function byHead(c) return Q[c + 1] .. '@@@' end -- see firstTied

-- reorder moves tenant to its new service vs (a string, as written to v:)
-- in the classes it waits in.
local function reorder(tenant, vs)
  if queued() == 0 then return end -- no tenant waits anywhere
  for c = 0, 2 do redis.call('ZADD', byService(c), 'XX', vs, tenant) end
end

-- tokens reports whether the lane's service is counted in tokens (see t's
-- tok); toTokens turns it so at the first grant with an estimate, of call:
-- every tenant's service starts again from 0 (slot-time and tokens do not
-- compare), and a call with no estimate is charged the mean (pc).
local function tokens()
  if inTokens == nil then inTokens = redis.call('HEXISTS', T, 'tok') == 1 end
  return inTokens
end
local function toTokens(call)
  inTokens = true
  local sets = {'tok', 1, 'pc', call, 'nm', 0}
  for _, k in ipairs(redis.call('HKEYS', T)) do
    local p = string.sub(k, 1, 2)
    if p == 'v:' or p == 'p:' then sets[#sets + 1], sets[#sets + 2] = k, 0 end
  end
  wr('HSET', T, unpack(sets))
  for c = 0, 2 do
    for _, tenant in ipairs(redis.call('SMEMBERS', Q[c + 1] .. '@')) do reorder(tenant, 0) end
  end
end

-- The token budget. level returns the bucket's tokens refilled to now, or
-- nil without a budget; a bucket turned on starts full, less what the calls
-- in flight were estimated at.
-- inflightTokens is m's ti, read with the rest of m (begin); addInflight
-- moves it (an HSET: the sum of whole estimates is exact in Lua's numbers,
-- and HINCRBYFLOAT's long double costs more).
local function inflightTokens() return ti end
local function addInflight(d)
  ti = ti + d
  mset('ti', exact(ti))
end
local function level()
  if tpm <= 0 then return nil end
  if tokenLevel == nil then
    local l, at = tonumber(meta.tl or ''), tonumber(meta.ta or '')
    if l == nil then l, at = math.max(0, tpm - inflightTokens()), now end
    tokenLevel = math.min(tpm, l + tpm * math.max(0, now - at) / 60000)
  end
  return tokenLevel
end
local function setLevel(l)
  tokenLevel = l
  mset('tl', exact(l))
  mset('ta', now)
end
-- The provider's word (op limits): what the rate-limit headers of an answer
-- said of the lane's budgets at the provider, whichever process's call it
-- was, kept in key pv as "tokens|requests|hold|said|ch|cb|cn". ch is when a
-- gateway's concurrency 429 stops holding grants at the latest: it stops
-- at the end of any call in flight but the refused one, cb (see unhold);
-- cn is how many calls were in flight at it. Each budget is a
-- mirror, "level|at|limit|rate|until" (tokens, ms, tokens per ms; all empty
-- when not said): the level as of at, refilling at rate towards the limit,
-- so as to be whole at the reset (until), less what the lane granted since.
-- It binds until the reset, and past it until it has refilled to the limit
-- (package limiter's rules). hold is when a 429's Retry-After ends. As in
-- package limiter, whatever the headers said, it binds for at most two
-- provider windows: the reset is at most a window away (the caller bounds
-- it), the level never below minus the limit, and the rate at least the
-- limit per window; the key expires when it stops binding. A lane whose
-- answers carry no headers never reads it (see provider).
local function mirrorOf(f, i)
  if f[i] == '' then return nil end
  return {l = tonumber(f[i]), a = tonumber(f[i + 1]), m = tonumber(f[i + 2]), r = tonumber(f[i + 3]), u = tonumber(f[i + 4])}
end
local function mlevel(x)
  local v = x.l + x.r * (now - x.a)
  if x.m > 0 and v > x.m then v = x.m end
  return v
end
local function mactive(x)
  return x ~= nil and (now < x.u or (x.r > 0 and mlevel(x) + 1e-6 < x.m))
end
local function mirrorStr(x)
  if x == nil then return '||||' end
  return exact(x.l) .. '|' .. x.a .. '|' .. x.m .. '|' .. exact(x.r) .. '|' .. x.u
end
-- mbinds returns how long mirror x binds from now (ms, 0 if it does not).
local function mbinds(x)
  if not mactive(x) then return 0 end
  local d = x.u - now
  if x.r > 0 then d = math.max(d, (x.m - mlevel(x)) / x.r) end
  return math.max(0, d)
end
local function saveProvider()
  local p = prov
  if not mactive(p.t) then p.t = nil end
  if not mactive(p.q) then p.q = nil end
  if now >= p.ch then p.ch, p.cb, p.cn = 0, '', 0 end
  if p.t == nil and p.q == nil and now >= p.hold and p.ch == 0 then
    redis.call('DEL', PV)
    redis.call('HDEL', M, 'pu')
    prov = nil
  else
    local life = math.max(1, math.ceil(math.max(mbinds(p.t), mbinds(p.q), p.hold - now, p.ch - now)))
    redis.call('SET', PV, mirrorStr(p.t) .. '|' .. mirrorStr(p.q) .. '|' .. p.hold .. '|' .. p.said .. '|' .. p.ch .. '|' .. p.cb .. '|' .. p.cn, 'PX', life)
    wr('HSET', M, 'pu', now + life)
  end
end
-- provider returns the provider's word, or nil when nothing of it binds.
-- m's pu says until when pv may bind, so that a lane whose answers carry
-- no headers reads no pv (its meta hash gone, it reads pv: pv outlives m).
local function provider()
  if not provRead then
    provRead = true
    local pu = tonumber(meta.pu or '')
    if pu ~= nil and now >= pu then -- over (on a test's clock, pv may still be there)
      redis.call('DEL', PV)
      redis.call('HDEL', M, 'pu')
      return nil
    end
    if pu == nil and meta.ex ~= false then return nil end
    local v = redis.call('GET', PV)
    if v then
      local f = fields(v, 15)
      prov = {t = mirrorOf(f, 1), q = mirrorOf(f, 6), hold = tonumber(f[11]), said = tonumber(f[12]),
        ch = tonumber(f[13]) or 0, cb = f[14] or '', cn = tonumber(f[15]) or 0}
      if not mactive(prov.t) and not mactive(prov.q) and now >= prov.hold and now >= prov.ch then
        saveProvider() -- it binds nothing any more: forget it
      end
    end
  end
  return prov
end
-- provFits reports whether the provider's word lets a call of cost be
-- granted now; one larger than the provider's whole limit fits once the
-- budget is whole.
local function provFits(cost)
  local p = provider()
  if p == nil then return true end
  if now < p.hold or now < p.ch then return false end
  if mactive(p.t) and mlevel(p.t) + 1e-6 < (p.t.m > 0 and math.min(cost, p.t.m) or cost) then return false end
  if mactive(p.q) and mlevel(p.q) + 1e-6 < 1 then return false end
  return true
end
local function provTake(cost)
  local p = provider()
  if p == nil then return end
  for _, x in ipairs({{p.t, cost}, {p.q, 1}}) do
    if mactive(x[1]) then x[1].l, x[1].a = math.max(-x[1].m, mlevel(x[1]) - x[2]), now end
  end
  saveProvider()
end

-- budgeted: a lane with no budget keeps no bucket and no estimates in
-- flight (a holder's estimate and cost are kept as 0; its call field keeps
-- the estimate, for the provider's word and the tenants' shares); a budget
-- a reload turns on counts the calls granted from then on.
--
-- adopt, as a budget is turned on (m's tb is set while one is), counts the
-- estimates of the calls holding slots, granted while none was, in the
-- estimates in flight, as package limiter does: a budget starts full, less
-- them. As one is turned off, the bucket goes with it.
local function adopt()
  local on = meta.tb ~= false
  if budgeted == on then return end
  if not budgeted then
    redis.call('HDEL', M, 'tb', 'tl', 'ta', 'ti')
    ti, mw.tl, mw.ta, mw.ti = 0, nil, nil, nil
    return
  end
  ti = 0
  local all = redis.call('HGETALL', HC)
  for i = 1, #all, 2 do
    local f = fields(all[i + 1], 13)
    local e = tonumber(f[8]) or 0
    f[6], f[7] = e, e
    ti = ti + e
    wr('HSET', HC, all[i], table.concat(f, '|'))
  end
  wr('HSET', M, 'tb', 1)
  mset('ti', exact(ti))
  if tpm > 0 then setLevel(math.max(0, tpm - ti)) end
end
local function tokensFit(cost)
  if not provFits(cost) then return false end
  if not budgeted then return true end
  local i = inflightTokens()
  if maxtok > 0 and i > 0 and i + cost > maxtok then return false end
  local l = level()
  return l == nil or l + 1e-6 >= math.min(cost, tpm)
end
local function takeTokens(call, cost)
  provTake(call)
  local l = level()
  if l ~= nil then setLevel(math.max(-tpm, l - cost)) end
  if cost ~= 0 then addInflight(cost) end
end

local function unqueue(id)
  local v = redis.call('HGET', QC, id)
  if not v then return false end
  -- Counted before id leaves qx: a first count after it (a sweep's
  -- unqueue is a call's first) would take id off twice, and the queue
  -- read as empty with a waiter in it.
  local n = queued()
  local f = fields(v, 8)
  local c, tenant = tonumber(f[1]), f[4]
  redis.call('ZREM', Q[c + 1], id)
  redis.call('ZREM', tq(c, tenant), id)
  local h = redis.call('ZRANGE', tq(c, tenant), 0, 0, 'WITHSCORES')
  if #h == 0 then
    redis.call('SREM', Q[c + 1] .. '@', tenant)
    redis.call('ZREM', byService(c), tenant)
    redis.call('ZREM', byHead(c), tenant)
  else
    wr('ZADD', byHead(c), h[2], tenant)
  end
  redis.call('ZREM', QX, id)
  redis.call('HDEL', QC, id)
  nq = n - 1
  if nq == 0 then redis.call('HDEL', M, 'since') end
  return true
end

-- unhold gives back holder id's slot, and settles its tenant's service:
-- its slot-time, less what its grant was charged.
local function unhold(id)
  -- A call's end gives a gateway that refused one for concurrency room
  -- again, unless it is the refused call's.
  local p = provider()
  if p ~= nil and now < p.ch and p.cb ~= id then
    p.ch = 0
    saveProvider()
  end
  local v = redis.call('HGET', HC, id)
  local n = redis.call('ZREM', H, id)
  if v then
    redis.call('HDEL', HC, id)
    local f = fields(v, 13)
    -- Only a waiter's grant (dispatch) is ever in g: a slot granted at its
    -- acquire has its id's place in the counter as its grant's.
    if tonumber(f[9]) ~= tonumber(string.sub(id, 1, 16), 16) then redis.call('HDEL', G, id) end
    local tenant, at, cf, w = f[2], tonumber(f[3]), f[4], tonumber(f[5])
    local est = tonumber(f[6]) or 0
    if est ~= 0 then addInflight(-est) end
    if cf ~= '-' then -- charged: settle
      local d = math.max(0, now - at) / 1000
      local vs, pending, e, le, _, pc, nm = share(tenant)
      local inTok = string.sub(cf, 1, 1) == 't'
      local charge = tonumber(inTok and string.sub(cf, 2) or cf)
      local sets = {'e:' .. tenant, exact(e + (d - e) / 4), 'est', exact(le + (d - le) / 8), 'j:' .. tenant, now}
      if inTok ~= tokens() then
        -- Charged in slot-time before the lane turned to tokens, which
        -- started every tenant's service again: nothing to settle.
      else
        local used = d
        if inTok then
          used = tonumber(f[8]) -- what it used, else its estimate
          if used then
            sets[#sets + 1], sets[#sets + 2] = 'pc', exact(pc + (used - pc) / 8)
          else
            used = pc -- a call with no estimate: the mean
          end
        end
        sets[#sets + 1], sets[#sets + 2] = 'v:' .. tenant, exact(vs + used / w - charge)
        reorder(tenant, sets[#sets])
        sets[#sets + 1], sets[#sets + 2] = 'p:' .. tenant, exact(pending - charge)
        if f[12] == '1' then
          -- A newcomer's first call: the mark is settled as its service is.
          sets[#sets + 1], sets[#sets + 2] = 'nm', exact(nm + (used / w - charge))
        end
      end
      wr('HSET', T, unpack(sets))
    end
    if cap > 0 then wr('HINCRBY', T, 'i:' .. tenant, -1) end
  else
    redis.call('HDEL', G, id)
  end
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

-- capped reports whether tenant is at its cap, or set aside for the
-- dispatch under way (skip: see dispatch).
local function capped(tenant)
  return skip[tenant] or (cap > 0 and num('i:' .. tenant, 0) >= cap)
end

-- The order, in three steps (package limiter's queue; docs/DESIGN.md,
-- "Tenants and fair shares"): which class (each class is represented by
-- its oldest waiter whose tenant is not at its cap: the highest effective
-- class first, then the earliest arrival, then id), whose call within it
-- (the tenant with the least service), which of that tenant's calls (FIFO).

-- head returns the first waiter of tenant's calls of class c, or nil.
local function head(c, tenant)
  local r = redis.call('ZRANGE', tq(c, tenant), 0, 0, 'WITHSCORES')
  if #r == 0 then return nil end
  return {id = r[1], c = c, at = tonumber(r[2]), tenant = tenant}
end

-- rank is a waiter's effective class: its own, raised one step per aging
-- step since its logical arrival, at most to interactive (0).
local function rank(w)
  return w.c - math.min(w.c, math.max(0, math.floor((now - w.at) / step)))
end

local function older(a, b)
  if a.at ~= b.at then return a.at < b.at end
  return a.id < b.id
end

-- classFirst orders two classes by their oldest waiters a and b.
local function classFirst(a, b)
  local ra, rb = rank(a), rank(b)
  if ra ~= rb then return ra < rb end
  return older(a, b)
end

-- oldestIn returns the oldest waiter of class c, among those whose tenant
-- is not at its cap unless all is set (for a place in line). Without a cap
-- it is the class's first member.
local function oldestIn(c, all)
  if all or (cap == 0 and next(skip) == nil) then
    local r = redis.call('ZRANGE', Q[c + 1], 0, 0, 'WITHSCORES')
    if #r == 0 then return nil end
    return {id = r[1], c = c, at = tonumber(r[2])}
  end
  local best
  for _, tenant in ipairs(redis.call('SMEMBERS', Q[c + 1] .. '@')) do
    if not capped(tenant) then
      local h = head(c, tenant)
      if h and (best == nil or older(h, best)) then best = h end
    end
  end
  return best
end

-- served orders two waiters of one class: the tenant with the least
-- service first, then arrival, then id (enqueue order).
local function served(a, b)
  if a.vs ~= b.vs then return a.vs < b.vs end
  return older(a, b)
end

-- firstTied returns the oldest head of the tenants tied (at least two),
-- by arrival, then id (older). Their heads' arrivals are read in one call
-- from q<c>@@@, and only the heads that arrived first are read: equal
-- charges leave many tenants tied, and reading each head would cost a call
-- a tenant. A tenant missing there (a lane kept from before q<c>@@@) has
-- every head read.
local function firstTied(c, tied)
  local at, first = redis.call('ZMSCORE', byHead(c), unpack(tied)), {}
  local least
  for i, a in ipairs(at) do
    if not a then
      first = tied
      break
    end
    a = tonumber(a)
    if least == nil or a < least then least, first = a, {} end
    if a == least then first[#first + 1] = tied[i] end
  end
  local best
  for _, tenant in ipairs(first) do
    local h = head(c, tenant)
    if h and (not best or older(h, best)) then best = h end
  end
  return best
end

-- firstIn returns the waiter served first in class c (steps 2 and 3),
-- with its tenant's service and pending charges, or nil. The class's
-- tenants are read in order of service from q<c>@@, a few at a time: the
-- first not at its cap (nor set aside) has the least service, and those
-- tied with it have their heads read, to break the tie by arrival.
-- O(log tenants) per grant but for tenants at their cap, and ties: the
-- tied have their heads' arrivals read at once (firstTied).
local function firstIn(c)
  local key = byService(c)
  local least, tied = nil, {}
  local from = 0
  while true do
    local r = redis.call('ZRANGE', key, from, from + 15, 'WITHSCORES')
    if #r == 0 then break end
    local done = false
    for i = 1, #r, 2 do
      local tenant, vs = r[i], tonumber(r[i + 1])
      if least ~= nil and vs > least then
        done = true
        break
      end
      if not capped(tenant) then
        least = vs
        tied[#tied + 1] = tenant
      end
    end
    if done then break end
    from = from + 16
  end
  local best
  if #tied == 1 then best = head(c, tied[1]) elseif #tied > 1 then best = firstTied(c, tied) end
  if best then
    best.vs = least
    best.pending = num('p:' .. best.tenant, 0)
  end
  return best
end

-- lift raises the service of tenant, which starts waiting in class c with
-- a call estimated at cost (of weight w), to the settled service (less what
-- its calls in flight were charged) of the tenant served next in that
-- class, or with none waiting there, of the tenant granted last: being idle
-- banks no credit. A newcomer is lifted to at least the newcomers' mark
-- (nm), and moves it on by what its grant will be charged, so that the
-- newcomers are served as one more tenant would be (package limiter's
-- liftLocked).
local function lift(tenant, c, w, cost)
  local floor
  local h = firstIn(c)
  if h then
    floor = h.vs - h.pending
  else
    local last = redis.call('HGET', T, 'last')
    if last then floor = num('v:' .. last, 0) - num('p:' .. last, 0) end
  end
  local vs, _, e, _, new, pc, nm = share(tenant)
  if new then floor = math.max(floor or 0, nm) end
  if floor and vs < floor then
    vs = floor
    wr('HSET', T, 'v:' .. tenant, exact(floor))
    reorder(tenant, exact(floor))
  end
  if new then
    local charge = e
    if tokens() then charge = cost > 0 and cost or pc end
    wr('HSET', T, 'nm', exact(vs + charge / w))
  end
  return vs
end

-- hold gives id a slot for tenant's call of class c, charged the
-- tenant's mean slot-time over its weight w.
-- A lane whose calls have named no tenant (only 'default' so far) has no
-- one to be fair to: its grants are not charged (the charge field is '-'),
-- as an in-process lane reads no clock for them.
local function measured() return measuredNow end

-- The sweep's bound (m's sw): no lease in h or qx lapses before it ('n':
-- there is none), so that a call before it reads neither to sweep. A lease
-- written lowers it to its own expiry (leased); a renewal only moves a
-- lease later, and a lease removed leaves it a bound; a sweep sets it to
-- the earliest lease left.
local function leased(expiry)
  if expiry < swept then
    swept = expiry
    wr('HSET', M, 'sw', expiry)
  end
end

-- grant is the grant's place in the lane's counter (seq): a fresh id's
-- own, or the counter's next.
local function hold(id, c, tenant, w, proc, expiry, cost, base, grant)
  expiry = expiry or (now + ttl)
  wr('ZADD', H, expiry, id)
  leased(expiry)
  local call = tonumber(cost) or 0
  cost = budgeted and call or 0
  takeTokens(call, cost)
  grant = grant or nextSeq()
  local rest = '|' .. exact(w) .. '|' .. cost .. '|' .. cost .. '|' .. (call > 0 and call or '') .. '|' .. grant .. '|' .. proc ..
    '|' .. (base or call)
  if measured() then
    local vs, pending, e, _, new, pc = share(tenant)
    if call > 0 and not tokens() then
      toTokens(call) -- every service starts again: read it again
      vs, pending, e, _, new, pc = share(tenant)
    end
    rest = rest .. (new and '|1' or '|')
    local charge, cf = e / w, nil
    if tokens() then
      charge = (call > 0 and call or pc) / w
      cf = 't' .. exact(charge)
    else
      cf = exact(charge)
    end
    wr('HSET', HC, id, c .. '|' .. tenant .. '|' .. now .. '|' .. cf .. rest .. '|') -- answered: ''
    wr('HSET', T, 'v:' .. tenant, exact(vs + charge), 'p:' .. tenant, exact(pending + charge), 'last', tenant, 'j:' .. tenant, now)
    reorder(tenant, exact(vs + charge))
  else
    -- No one to be fair to: last is not kept (a lift reads service, 0
    -- for every tenant until a call names one).
    wr('HSET', HC, id, c .. '|' .. tenant .. '|' .. now .. '|-' .. rest .. '||') -- fresh and answered: ''
  end
  if cap > 0 then wr('HINCRBY', T, 'i:' .. tenant, 1) end
end

-- Estimates that learn (package limiter's calibrate.go): a tenant whose calls
-- used more than their estimates has its next estimates raised by its ratio,
-- fading back to 1 with a half-life of a minute, at most the lane's smallest
-- budget; a raised call does not hold the line (dispatch).
local halfLife = 60000
local function smallest()
  local s = 0
  for _, b in ipairs({tpm, maxtok, pl}) do
    if b > 0 and (s == 0 or b < s) then s = b end
  end
  return s
end
-- ratio returns tenant's ratio (o:), faded to now; v is the field's value
-- if the caller has read it already (false: there is none).
local function ratio(tenant, v)
  if v == nil then v = redis.call('HGET', T, 'o:' .. tenant) end
  if not v then return 1 end
  local f = fields(v, 2)
  local r, at = tonumber(f[1]), tonumber(f[2])
  if r <= 1 then return 1 end
  return 1 + (r - 1) * 2 ^ (-(now - at) / halfLife)
end
local function calibrate(tenant, cost, new, own)
  if cost <= 0 then return cost end
  local f = ratio(tenant, own)
  if new then f = math.max(f, ratio('+')) end -- a newcomer: the newcomers' record
  if f <= 1 then return cost end -- none of its calls ran past its estimate
  local ceiling = smallest()
  if ceiling == 0 or cost >= ceiling then return cost end
  return math.min(ceiling, math.ceil(cost * f))
end
local function learn(tenant, base, used)
  if base <= 0 then return end
  wr('HSET', T, 'o:' .. tenant, exact(math.max(used / base, ratio(tenant))) .. '|' .. now)
end

-- tooLarge returns the budget a call estimated at base (as its caller gave
-- it) exceeds whole, and its size, or nil.
local function tooLarge(base)
  if base <= 0 then return nil end
  if tpm > 0 and base > tpm then return 'tokens_per_minute', tpm end
  if maxtok > 0 and base > maxtok then return 'max_inflight_tokens', maxtok end
  return nil
end

-- refuse takes waiter id out of the queue, too large for budget (of
-- size): its process is told as of a grant (g), and its take says so.
local function refuse(id, budget, size)
  unqueue(id)
  wr('HSET', G, id, 'x|' .. budget .. '|' .. size)
end

-- dispatch grants slots to waiters while any may have one, and tells the
-- waiting processes.
local function dispatch()
  local granted = {}
  if limit == 0 or queued() == 0 or quiet() then return granted end
  local n, others = counts()
  local told = {} -- grants and refusals, for the waiting processes
  local newcomersOut = false -- a newcomer's raised call was set aside
  while n < limit do
    local c
    if fits(1, n, others) then
      for k = 0, 2 do
        local o = oldestIn(k)
        if o and (c == nil or classFirst(o, c)) then c = o end
      end
      c = c and c.c
    else
      c = 0 -- only an interactive call may take a reserved slot
    end
    local best = c and firstIn(c)
    if best == nil then break end
    local f = fields(redis.call('HGET', QC, best.id), 8)
    local cost = tonumber(f[6])
    local base = tonumber(f[8]) or cost
    local budget, size = tooLarge(base)
    if budget then
      refuse(best.id, budget, size)
      told[#told + 1] = best.id
    elseif newcomersOut and newcomer(f[4]) then
      -- The newcomers' calls are one line for the budgets: behind a
      -- raised one that did not fit, a later one raised less waits too.
      skip[f[4]] = true
    elseif not tokensFit(cost) then
      -- The first in line holds it while the budget has no room for it,
      -- but not a call raised for its tenant's under-estimates: that
      -- tenant's calls are set aside for this dispatch.
      if cost <= base then break end
      skip[f[4]] = true
      newcomersOut = newcomersOut or newcomer(f[4])
    else
      -- The slot keeps the place's lease: a dead process's place granted
      -- just before it lapses lapses as a slot just as soon.
      local expiry = tonumber(redis.call('ZSCORE', QX, best.id))
      unqueue(best.id)
      hold(best.id, best.c, f[4], tonumber(f[5]), f[7], expiry, cost, base)
      wr('HSET', G, best.id, now)
      n = n + 1
      if best.c ~= 0 then others = others + 1 end
      granted[#granted + 1] = best.id
      told[#told + 1] = best.id
    end
  end
  skip = {}
  if #told > 0 then
    redis.call('PUBLISH', channel, tag .. ' ' .. table.concat(told, ','))
  end
  return granted
end

-- sweep drops the leases that lapsed (their process stopped renewing
-- them) and grants what they held.
local function sweep()
  if swept == nil or now >= swept then -- see leased
    local before, first = swept, math.huge
    for _, k in ipairs({H, QX}) do
      local r = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      if #r > 0 and tonumber(r[2]) <= now then
        local drop = k == H and unhold or unqueue
        for _, id in ipairs(redis.call('ZRANGEBYSCORE', k, '-inf', now)) do drop(id) end
        r = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      end
      if #r > 0 then first = math.min(first, tonumber(r[2])) end
    end
    swept = first
    -- A lane with no keys left (a read of a lane gone) gets no meta hash
    -- for its bound: that would make it again, a field alone, and the
    -- reads that follow would keep it.
    if first ~= before and (before ~= nil or first ~= math.huge or redis.call('EXISTS', M) == 1) then
      wr('HSET', M, 'sw', first == math.huge and 'n' or first)
    end
  end
  -- Whatever freed a slot (a lapsed lease, the end of the quiet time),
  -- the waiters get it now.
  dispatch()
end

-- newid returns a new id, and its place in the lane's counter.
-- newid is a new holder's or waiter's id: the lane's counter, the server's
-- run and the process's suffix. The counter orders grants; the run keeps
-- ids apart across restarts, when the counter starts again (empty) or goes
-- back (restored from a file), so that a slot registered again never takes
-- the id of another call still running.
local function newid(suffix)
  local n = nextSeq()
  serverStart()
  return string.format('%016x', n) .. ':' .. run .. ':' .. suffix, n
end

-- recount makes the tenants' i: fields count their slots held when the cap
-- in force changes: they are kept only while there is a cap (a grant and a
-- release then count them), and counted afresh from the holders when one
-- is set.
local function recount()
  if cap == (tonumber(meta.cp or '') or 0) then return end
  local del = {}
  for _, k in ipairs(redis.call('HKEYS', T)) do
    if string.sub(k, 1, 2) == 'i:' then del[#del + 1] = k end
  end
  if #del > 0 then
    redis.call('HDEL', T, unpack(del))
    shared = nil
  end
  if cap > 0 then
    local n, sets = {}, {}
    for _, v in ipairs(redis.call('HVALS', HC)) do
      local tenant = fields(v, 3)[2]
      n[tenant] = (n[tenant] or 0) + 1
    end
    for tenant, k in pairs(n) do sets[#sets + 1], sets[#sets + 2] = 'i:' .. tenant, k end
    if #sets > 0 then wr('HSET', T, unpack(sets)) end
  end
  wr('HSET', M, 'cp', cap)
end

-- forget drops the tenants gone idle but keep, at a newcomer's acquire, at
-- most once a minute (package limiter's forgetLocked): those with nothing
-- queued or in flight that were never granted a call, or had none granted
-- or ended (j:) for five minutes. O(tenants + holders), once a minute.
local tenantIdle, sweepEvery = 300000, 60000
local function forget(keep)
  local pr = tonumber(meta.pr or '')
  if pr and now - pr < sweepEvery then return end
  wr('HSET', M, 'pr', now)
  local active = {default = true, ['+'] = true}
  active[keep] = true
  for _, v in ipairs(redis.call('HVALS', HC)) do active[fields(v, 3)[2]] = true end
  for c = 0, 2 do
    for _, tenant in ipairs(redis.call('SMEMBERS', Q[c + 1] .. '@')) do active[tenant] = true end
  end
  local seen, names = {}, {}
  local ts = redis.call('HGETALL', T)
  for i = 1, #ts, 2 do
    local k = ts[i]
    if string.sub(k, 2, 2) == ':' then
      local name = string.sub(k, 3)
      if not active[name] then
        if names[name] == nil then names[name] = {} end
        table.insert(names[name], k)
        if string.sub(k, 1, 1) == 'j' then seen[name] = tonumber(ts[i + 1]) end
      end
    end
  end
  local del, last = {}, redis.call('HGET', T, 'last')
  for name, ks in pairs(names) do
    if not seen[name] or now - seen[name] >= tenantIdle then
      for _, k in ipairs(ks) do del[#del + 1] = k end
      if name == last then del[#del + 1] = 'last' end
    end
  end
  if #del > 0 then
    redis.call('HDEL', T, unpack(del))
    shared = nil
  end
end

local ops = {} -- the ops, by name

function ops.acquire()
  local out
  -- ARGV A+1 class, +2 age of the logical arrival (ms), +3 process, +4 lane key,
  -- +5 id suffix, +6 tenant, +7 its weight, +8 its estimate (tokens)
  local c, age, proc = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), ARGV[A + 3]
  local tenant, w, base = ARGV[A + 6], tonumber(ARGV[A + 7]), tonumber(ARGV[A + 8])
  if pl > 0 and base > pl then
    -- Larger than the provider's whole limit: it could never be served.
    return {'too_large', '', pl}
  end
  -- Whether it is a newcomer, and its record of under-estimates, in one
  -- read (the default tenant is never a newcomer).
  local new, own = false, nil
  if tenant ~= 'default' then
    local r = tenantFields(tenant)
    new, own = not r[5], r[9]
  end
  if new then forget(tenant) end
  local cost = calibrate(tenant, base, new, own)
  if meta.lane ~= ARGV[A + 4] then wr('HSET', M, 'lane', ARGV[A + 4]) end
  if tenant ~= 'default' and not measuredNow then
    wr('HSET', M, 'ms', 1)
    measuredNow = true
  end
  local n, others = counts()
  local id, seq = newid(ARGV[A + 5])
  if queued() == 0 and fits(c, n, others) and not quiet() and not capped(tenant) and tokensFit(cost) then
    hold(id, c, tenant, w, proc, nil, cost, base, seq)
    out = {'granted', id, 0}
  else
    local at = now - age
    if queued() == 0 then wr('HSET', M, 'since', now) end
    if redis.call('EXISTS', tq(c, tenant)) == 0 then
      -- It starts waiting in class c: lifted, and ordered there by its
      -- service (a tenant already waiting there is in place).
      wr('ZADD', byService(c), exact(lift(tenant, c, w, cost)), tenant)
      wr('SADD', Q[c + 1] .. '@', tenant)
    end
    wr('ZADD', Q[c + 1], at, id)
    wr('ZADD', tq(c, tenant), at, id)
    wr('ZADD', byHead(c), 'LT', at, tenant)
    nq = queued() + 1
    wr('ZADD', QX, now + ttl, id)
    leased(now + ttl)
    wr('HSET', QC, id, c .. '|' .. at .. '|' .. now .. '|' .. tenant .. '|' .. exact(w) .. '|' .. cost .. '|' .. proc .. '|' .. base)
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
  return out
end

function ops.release()
  -- ARGV A+1 id
  local ok = unhold(ARGV[A + 1])
  dispatch()
  return ok and 1 or 0
end

-- aged counts the waiters of class k that have aged at least j steps at
-- now (rank's steps): those that arrived at or before now - j steps, or
-- with no aging step (0 ms), before now. A ZCOUNT: O(log n).
local function aged(k, j)
  local upto = now - j * step
  if step <= 0 then upto = '(' .. now end
  return redis.call('ZCOUNT', Q[k + 1], '-inf', upto)
end

-- before counts the waiters of tenant's calls of class c that a waiter
-- of that class with service vs, arrival at and id is served after
-- (served): all of them if the tenant's service is less, those that
-- arrived earlier (or at once, with a smaller id) if it is the same,
-- none if it is more. O(log n) but for the ties at one arrival.
local function before(c, tenant, vs, at, id)
  local k = tq(c, tenant)
  local tvs = num('v:' .. tenant, 0)
  if tvs < vs then return redis.call('ZCARD', k) end
  if tvs > vs then return 0 end
  local n = redis.call('ZCOUNT', k, '-inf', '(' .. at)
  for _, o in ipairs(redis.call('ZRANGEBYSCORE', k, at, at)) do
    if o < id then n = n + 1 end
  end
  return n
end

function ops.cancel()
  local out
  -- ARGV A+1 id: leave the queue; A+2 '1' to be told where it stood. A
  -- grant that came first is claimed. A waiter that leaves and asked is
  -- told {'removed', its place in the serving order, the waiters then
  -- (itself included), and for a newcomer of each class the waiters that
  -- would be served before it once it has gone}, so that a queue timeout
  -- reports the lane's global figures. The figures are counted by tenant
  -- and by class, not by waiter: O(tenants of its class x log n), so that
  -- many callers giving up at once cost Redis little (a caller that
  -- gives up does not ask; its leave is O(log n)).
  local id = ARGV[A + 1]
  local v = redis.call('HGET', QC, id)
  if v and ARGV[A + 2] ~= '1' then
    unqueue(id)
    out = {'removed'}
  elseif v then
    local f = fields(v, 8)
    local c, tenant = tonumber(f[1]), f[4]
    local at = tonumber(redis.call('ZSCORE', Q[c + 1], id))
    local vs = num('v:' .. tenant, 0)
    local me = {id = id, c = c, at = at}
    -- Its place: classes in the order of their oldest waiters (cap or
    -- not), all of a class served first counted; within its class by
    -- service, then arrival (package limiter's queue.position).
    local pos, n, size = 1, 0, {}
    local mine = oldestIn(c, true)
    for k = 0, 2 do
      size[k] = redis.call('ZCARD', Q[k + 1])
      n = n + size[k]
      if k ~= c and size[k] > 0 and classFirst(oldestIn(k, true), mine) then pos = pos + size[k] end
    end
    for _, t in ipairs(redis.call('SMEMBERS', Q[c + 1] .. '@')) do
      pos = pos + before(c, t, vs, at, id)
    end
    -- The others by effective class (rank): a class k waiter that has
    -- aged j steps ranks k - j, at most interactive.
    local by = {0, 0, 0}
    for k = 0, 2 do
      local prev = size[k]
      for j = 1, k do
        local a = aged(k, j)
        by[k - j + 2] = by[k - j + 2] + prev - a
        prev = a
      end
      by[1] = by[1] + prev
    end
    local r = rank(me) + 1
    by[r] = by[r] - 1
    unqueue(id)
    out = {'removed', pos, n, by[1], by[1] + by[2], by[1] + by[2] + by[3]}
  else
    local g = redis.call('HGET', G, id)
    if g then redis.call('HDEL', G, id) end
    if g and string.sub(g, 1, 1) ~= 'x' or redis.call('ZSCORE', H, id) then
      out = 'granted'
    else
      out = 'gone' -- or refused as too large: the caller's own end stands
    end
  end
  -- Leaving frees no slot, but the first in line may have held the line
  -- because the budgets had no room for it: the calls behind it may fit
  -- now (package limiter's leftLocked).
  if type(out) == 'table' and (budgeted or provider() ~= nil) then dispatch() end
  return out
end

function ops.settle()
  -- ARGV A+1 id, +2 the tokens its call used: replaces what its grant was
  -- charged in the budget, at once (what it did not use comes back).
  local id, used = ARGV[A + 1], tonumber(ARGV[A + 2])
  local v = redis.call('HGET', HC, id)
  if not v then return 0 end
  local f = fields(v, 13)
  -- No call costs more than a whole budget (the caller bounds the rest).
  local ceil = math.max(tpm, maxtok, pl)
  if ceil > 0 then used = math.min(used, ceil) end
  local l = level()
  if l ~= nil then setLevel(math.max(-tpm, math.min(tpm, l - (used - (tonumber(f[7]) or 0))))) end
  local base = tonumber(f[11]) or tonumber(f[8]) or 0
  learn(f[2], base, used)
  if f[12] == '1' then learn('+', base, used) end -- its tenant's first: the newcomers' record
  f[7], f[8] = used, used
  wr('HSET', HC, id, table.concat(f, '|'))
  dispatch()
  return 1
end

function ops.limits()
  -- ARGV A+1 the id of the slot whose answer carried the headers, then for
  -- tokens (+2..+5) and requests (+6..+9): known (1 or 0), limit, remaining,
  -- reset (ms, at most the window); +10 a 429's Retry-After (ms, at most
  -- 60 s; 0: none); +11 the provider's window (ms); +12 '1' for a
  -- concurrency 429 (its hold ends at the end of a call in flight other
  -- than id's, or at its Retry-After: 1 s with none or with no other call
  -- in flight); +13 '1' when the
  -- headers are the provider's own (its token limit refuses larger calls
  -- for a window). The provider counted
  -- when that call arrived, as of its grant here. Its count holds that
  -- call, and every call whose own answer was reported here before that
  -- call was granted (it reached the provider before that one was sent);
  -- every other holder may have reached it later, and is counted again at
  -- its estimate (its use once settled), as in package limiter
  -- (Limiter.RecordLimits says why). A call that has ended is taken as
  -- counted. A slot not held any more is not known: every holder is
  -- counted again.
  local id = ARGV[A + 1]
  local at, mine = now, 0
  local v = redis.call('HGET', HC, id)
  if v then
    local f = fields(v, 13)
    at, mine = math.min(now, tonumber(f[3])), tonumber(f[9]) or 0
    f[13] = nextSeq()
    wr('HSET', HC, id, table.concat(f, '|'))
  end
  local toks, calls = 0, 0
  local all = redis.call('HGETALL', HC)
  for i = 1, #all, 2 do
    local f = fields(all[i + 1], 13)
    local answered = tonumber(f[13])
    if all[i] ~= id and not (answered and answered < mine) then
      toks = toks + (tonumber(f[8]) or 0)
      calls = calls + 1
    end
  end
  provider()
  local p = prov or {hold = 0, ch = 0, cb = '', cn = 0}
  local window = tonumber(ARGV[A + 11])
  local function set(i, since, old)
    if ARGV[A + i] ~= '1' then return old end
    local limit, remaining, reset = tonumber(ARGV[A + i + 1]), tonumber(ARGV[A + i + 2]), tonumber(ARGV[A + i + 3])
    local x = {l = math.max(-limit, remaining - since), a = at, m = limit, r = 0, u = at + reset}
    if limit > 0 then
      x.r = limit / window
      if limit > remaining and reset > 0 then x.r = math.max(x.r, (limit - remaining) / reset) end
    end
    return x
  end
  p.t, p.q = set(2, toks, p.t), set(6, calls, p.q)
  if ARGV[A + 13] == '1' and ARGV[A + 2] == '1' and tonumber(ARGV[A + 3]) > 0 then
    pl = tonumber(ARGV[A + 3])
    wr('HSET', M, 'pl', ARGV[A + 3], 'px', now + window)
  end
  local ra = tonumber(ARGV[A + 10])
  if ARGV[A + 12] == '1' then
    local n = redis.call('ZCARD', H)
    -- With no Retry-After, or no call of the lane in flight but the
    -- refused one (the gateway's room is taken by calls the lane cannot
    -- see end), it looks again after a second.
    if ra <= 0 or n <= 1 then ra = 1000 end
    p.ch, p.cb, p.cn = math.max(p.ch, now + ra), id, n
  elseif ra > 0 then
    p.hold = math.max(p.hold, now + ra)
  end
  p.said = now
  prov = p
  saveProvider()
  dispatch()
  return 1
end

function ops.reload()
  -- A reload (forget: an older version's name): forget what the provider
  -- said of the lane; a waiter's raise is at most the new smallest budget,
  -- and a waiter now larger than a whole budget is refused; then grant
  -- what the new settings allow. It scans the queue, as an in-process
  -- lane's reload does.
  redis.call('DEL', PV)
  redis.call('HDEL', M, 'pl', 'pu', 'px')
  pl = 0
  prov, provRead = nil, true
  -- A bucket made smaller owes at most its new size, as always.
  local l = level()
  if l ~= nil and l < -tpm then setLevel(-tpm) end
  local ceiling = smallest()
  local told = {}
  for _, id in ipairs(redis.call('HKEYS', QC)) do
    local f = fields(redis.call('HGET', QC, id), 8)
    local cost = tonumber(f[6])
    local base = tonumber(f[8]) or cost
    local budget, size = tooLarge(base)
    if budget then
      refuse(id, budget, size)
      told[#told + 1] = id
    elseif cost > math.max(base, ceiling) then
      f[6] = math.max(base, ceiling)
      wr('HSET', QC, id, table.concat(f, '|'))
    end
  end
  if #told > 0 then
    redis.call('PUBLISH', channel, tag .. ' ' .. table.concat(told, ','))
  end
  dispatch()
  return 1
end
ops.forget = ops.reload -- an older version's name

function ops.take()
  local out
  -- ARGV A+1 id: claim a grant, or learn of a refusal: {'too_large', the
  -- budget, its size}.
  local g = redis.call('HGET', G, ARGV[A + 1])
  if g then redis.call('HDEL', G, ARGV[A + 1]) end
  if g and string.sub(g, 1, 1) == 'x' then
    local f = fields(g, 3)
    out = {'too_large', f[2], tonumber(f[3])}
  elseif g then
    out = 'granted'
  elseif redis.call('HEXISTS', QC, ARGV[A + 1]) == 1 then
    out = 'queued'
  elseif redis.call('ZSCORE', H, ARGV[A + 1]) then
    out = 'granted'
  else
    out = 'gone'
  end
  return out
end

function ops.renew()
  local out
  -- ARGV A+1.. ids: h (held), q (queued) or - (gone), in order.
  out = {}
  for i = A + 1, #ARGV do
    local id = ARGV[i]
    if redis.call('ZSCORE', H, id) then
      wr('ZADD', H, 'XX', now + ttl, id)
      leased(now + ttl) -- later than before, unless the lease was written by a longer one
      out[#out + 1] = 'h'
    elseif redis.call('ZSCORE', QX, id) then
      wr('ZADD', QX, 'XX', now + ttl, id)
      leased(now + ttl)
      out[#out + 1] = 'q'
    else
      out[#out + 1] = '-'
    end
  end
  return out
end

function ops.reclaim()
  local out
  -- ARGV A+1 class, +2 process, +3 force (1 or 0), +4 id suffix, +5 tenant,
  -- +6 its weight, +7 its estimate (tokens; '' or 0: none): a slot for a
  -- call already running (its lease was lost with a restarted store, or it
  -- ran on local lanes while the store was down). Its estimate is taken
  -- from the budget again. Within a minute of the server's start (a
  -- restart: the store forgot the calls running, and what the minute
  -- before took), the first reclaim empties the bucket before: a store
  -- back empty grants at most one bucket in its first minute, where a
  -- full one on top of the minute before let two in.
  local c = tonumber(ARGV[A + 1])
  local call = tonumber(ARGV[A + 7] or '') or 0
  local n, others = counts()
  if ARGV[A + 3] == '1' or quiet() or (queued() == 0 and fits(c, n, others)) then
    local id, seq = newid(ARGV[A + 4])
    local l = level()
    if l ~= nil and now - serverStart() < 60000 and redis.call('HEXISTS', M, 'rc') == 0 then
      setLevel(math.min(l, 0))
      wr('HSET', M, 'rc', now)
    end
    hold(id, c, ARGV[A + 5], tonumber(ARGV[A + 6]), ARGV[A + 2], nil, call, call, seq)
    out = id
  else
    out = false
  end
  return out
end

function ops.state()
  local out
  -- now, queued by class, queue non-empty since, oldest enqueue, the token
  -- budget's level and the estimates in flight...
  local oldest = ''
  for _, v in ipairs(redis.call('HVALS', QC)) do
    local enq = tonumber(string.match(v, '^[^|]*|[^|]*|([^|]*)|'))
    if oldest == '' or enq < oldest then oldest = enq end
  end
  local l = level()
  out = {tostring(now), redis.call('ZCARD', Q[1]), redis.call('ZCARD', Q[2]), redis.call('ZCARD', Q[3]),
    redis.call('HGET', M, 'since') or '', tostring(oldest), l and tostring(math.floor(l)) or '', tostring(inflightTokens())}
  -- then the provider's word: for tokens and requests, remaining, limit and
  -- reset (ms), '' when it binds nothing; the hold left (ms); its age (ms,
  -- '' if never said). The holders' values follow.
  local p = provider()
  for _, k in ipairs({'t', 'q'}) do
    local x = p and p[k]
    if mactive(x) then
      out[#out + 1], out[#out + 2], out[#out + 3] = tostring(math.floor(mlevel(x))), tostring(x.m), tostring(math.max(0, x.u - now))
    else
      out[#out + 1], out[#out + 2], out[#out + 3] = '', '', ''
    end
  end
  out[#out + 1] = tostring(p and math.max(0, p.hold - now) or 0)
  out[#out + 1] = p and tostring(now - p.said) or ''
  -- then a concurrency 429's hold left (ms) and the calls in flight at it;
  -- the provider's own token limit and how long it binds (ms), '' for none.
  out[#out + 1] = tostring(p and math.max(0, p.ch - now) or 0)
  out[#out + 1] = tostring(p and p.cn or 0)
  out[#out + 1] = pl > 0 and tostring(pl) or ''
  out[#out + 1] = pl > 0 and tostring(meta.px - now) or ''
  -- then how long the tokens' and requests' budgets bind (ms).
  out[#out + 1] = tostring(math.ceil(p and mbinds(p.t) or 0))
  out[#out + 1] = tostring(math.ceil(p and mbinds(p.q) or 0))
  for _, v in ipairs(redis.call('HVALS', HC)) do out[#out + 1] = v end
  return out
end
-- Every key of the lane outlives its last op by four leases, then goes: a
-- lane whose holders died (SIGKILL) and that nobody calls again leaves
-- nothing behind. A key this op wrote gets its four leases now (a key it
-- made has no expiry until then); every key gets them at most a lease
-- after it last did (ex), which any live holder or waiter renews well
-- within, every third of a lease. A read (state: every scrape, and
-- lanes-exporter's history every 2 s) keeps no lane alive; it only gives
-- a key it made (a grant its sweep dispatched) the same life.
local function expire()
  if op == 'state' then
    for k in pairs(written) do
      if k ~= PV and redis.call('PTTL', k) == -1 then redis.call('PEXPIRE', k, ttl * 4) end
    end
  elseif now - (tonumber(meta.ex or '') or 0) >= ttl or now < (tonumber(meta.ex or '') or 0) then
    redis.call('HSET', M, 'ex', now)
    for i = 1, #KEYS - 1 do redis.call('PEXPIRE', KEYS[i], ttl * 4) end -- pv has a life of its own
    -- The keys made from the lane's exist only while calls wait.
    if queued() > 0 then
      for c = 0, 2 do
        redis.call('PEXPIRE', Q[c + 1] .. '@', ttl * 4)
        redis.call('PEXPIRE', byService(c), ttl * 4)
        redis.call('PEXPIRE', byHead(c), ttl * 4)
        for _, tenant in ipairs(redis.call('SMEMBERS', Q[c + 1] .. '@')) do redis.call('PEXPIRE', tq(c, tenant), ttl * 4) end
      end
    end
  else
    -- m, read with its ex, has its leases from then: it needs none now.
    written[M] = nil
    for k in pairs(written) do
      if k ~= PV and not lasting[k] then redis.call('PEXPIRE', k, ttl * 4) end
    end
  end
end

-- lane runs one op (ARGV[1]) of the lane whose keys are keys.
local function lane(keys, args)
  begin(keys, args)
  local run = ops[op]
  if run == nil then return redis.error_reply('unknown op ' .. tostring(op)) end
  adopt()
  recount()
  sweep()
  local out = run()
  flush()
  expire()
  return out
end

-- Package sharedlane loads this file as a Redis function library (Redis 7
-- and later): it wraps the file in a function, which runs once, at the
-- load, and registers the lane it returns. On a Redis without functions it
-- runs the file as a script, whose functions are then made on every call.
return lane
