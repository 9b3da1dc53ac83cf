package limiter

import (
	"context"
	"math"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// Usage is what a call cost, in tokens, as its response's usage said (or,
// without one, as estimated from what was streamed).
type Usage struct {
	Prompt     int64
	Completion int64
}

// Total returns Prompt plus Completion.
func (u Usage) Total() int64 { return u.Prompt + u.Completion }

// ProviderLimits is what a gateway's rate-limit headers said of a lane's
// budget at the provider, for RecordLimits.
type ProviderLimits struct {
	Tokens   ProviderBudget
	Requests ProviderBudget
	// RetryAfter, from a 429, holds the lane's grants for that long (at
	// most MaxRetryAfterHold).
	RetryAfter time.Duration
	// At is when the provider counted what remains: when the call whose
	// answer carried the headers was sent (zero: now). The lane's grants
	// since then are not in the count, and are taken from it.
	At time.Time
	// Slot is that call's slot, if known. With a Backend the report goes
	// to its lease (a LimitsLease), which knows when it was granted on
	// the store's clock; without one it is not needed.
	Slot Slot
}

// ProviderBudget is one budget the provider announced.
type ProviderBudget struct {
	// Known is set when the headers gave Remaining.
	Known bool
	// Limit is the whole budget, 0 when not said.
	Limit int64
	// Remaining is what is left now.
	Remaining int64
	// Reset is how long until the budget is whole again (OpenAI's
	// x-ratelimit-reset-*; for Anthropic, its reset time less now).
	Reset time.Duration
}

// MaxRetryAfterHold bounds how long one 429's Retry-After holds a lane's
// grants: a gateway's answer must not stop a lane for an hour. A later 429
// extends the hold.
const MaxRetryAfterHold = 60 * time.Second

// tokenEps absorbs float rounding in the budgets' comparisons, so that a
// timer armed for the moment a budget has room finds it there.
const tokenEps = 1e-6

// bucket is a lane's tokens_per_minute: a token bucket of capacity
// TokensPerMinute that refills continuously at TokensPerMinute per minute.
type bucket struct {
	on    bool
	cap   float64
	level float64 // at ns at
	at    int64
}

func (b *bucket) refill(now int64) {
	if now > b.at {
		b.level = min(b.cap, b.level+b.cap*float64(now-b.at)/float64(time.Minute))
		b.at = now
	}
}

// mirror is a budget as the provider last announced it: Remaining at at,
// refilling at rate (per ns) towards limit, so that it is whole at the
// reset the provider announced, less what the lane granted since. It binds
// until its reset, and past it until it has refilled to the limit: a lane
// that forgot the grants it made since the count would send a burst the
// provider has no room for. A budget with no limit stops binding at its
// reset.
//
// Whatever the headers say, it binds for at most two windows (see
// Config.ProviderWindow): the reset is at most a window away
// (BoundProviderLimits), the level never below minus the limit (0 with
// none), and it refills by at least the whole limit per window.
type mirror struct {
	on           bool
	level, limit float64
	rate         float64
	at, until    int64
}

// set makes b, as counted at at (ns), the budget, less since: what the lane
// granted after at. window is the provider's (Config.ProviderWindow).
func (m *mirror) set(b ProviderBudget, at int64, since float64, window time.Duration) {
	if !b.Known {
		return
	}
	*m = mirror{on: true, limit: float64(b.Limit), at: at, until: at + int64(b.Reset)}
	m.level = max(-m.limit, float64(b.Remaining)-since)
	if b.Limit > 0 {
		m.rate = m.limit / float64(window)
		if b.Limit > b.Remaining && b.Reset > 0 {
			m.rate = max(m.rate, float64(b.Limit-b.Remaining)/float64(b.Reset))
		}
	}
}

func (m *mirror) active(now int64) bool {
	return m.on && (now < m.until || (m.rate > 0 && m.levelAt(now)+tokenEps < m.limit))
}

// expire forgets the budget once it no longer binds, so that the lane
// reads no clock for it (see laneTokens.binds).
func (m *mirror) expire(now int64) {
	if m.on && !m.active(now) {
		m.on = false
	}
}

// binds reports whether anything may hold a grant back under cfg: a
// budget, the provider's word or a hold. A lane whose calls only carry
// estimates reads no clock for them.
func (tk *laneTokens) binds(cfg *Config) bool {
	return cfg.budgeted() || tk.provTokens.on || tk.provRequests.on || tk.hold != 0
}

func (m *mirror) levelAt(now int64) float64 {
	v := m.level + m.rate*float64(now-m.at)
	if m.limit > 0 {
		v = min(v, m.limit)
	}
	return v
}

// fits reports whether cost fits at now; if not, when it may.
func (m *mirror) fits(cost float64, now int64) (bool, int64) {
	if !m.active(now) {
		return true, 0
	}
	v := m.levelAt(now)
	if v+tokenEps >= cost {
		return true, 0
	}
	wake := int64(math.MaxInt64) // active: before the reset, or refilling
	if now < m.until {
		wake = m.until
	}
	if m.rate > 0 {
		wake = min(wake, now+int64(math.Ceil((cost-v)/m.rate)))
	}
	return false, max(wake, now+1)
}

func (m *mirror) take(cost float64, now int64) {
	if m.active(now) {
		m.level, m.at = max(-m.limit, m.levelAt(now)-cost), now
	}
}

// laneTokens is a lane's token accounting: what its calls in flight are
// estimated at, its budget, the provider's word, and the tokens used in
// the last 5 minutes. A lane makes it with its first call that carries an
// estimate, its first budget, or its first report from the provider.
// Guarded by the lane's lock.
type laneTokens struct {
	inflight int64 // the estimates of the calls holding slots
	bucket   bucket
	// provTokens and provRequests are the provider's budgets; hold is
	// when a 429's Retry-After ends (ns); said when its headers last
	// said anything (ns; 0: never).
	provTokens, provRequests mirror
	hold, said               int64
	// provLimit is the token limit the provider last announced (0: none):
	// a call estimated above it is refused, whether or not the provider's
	// budget is whole now. A reload forgets it.
	provLimit int64
	// at is when the budgets were last looked at (ns): a grant follows
	// that look at once, under the same lock, and is charged then.
	at int64
	// wake looks at the queue again when a budget will have room for the
	// call first in line.
	wake laneTimer
	// recent are the last grants (when, estimate), a ring, so that a
	// provider's count made at some moment can be brought up to now.
	recent [recentGrants]struct{ at, est int64 }
	next   int
}

// recentGrants is how many grants a lane remembers for the provider's
// counts: more than are granted while one answer's headers are on their
// way, at any rate a provider's budget allows.
const recentGrants = 64

// grantedSince returns the estimates and the number of the grants at or
// after at (ns) that the lane remembers. At, not only after: the calls of
// one dispatch share its time, and the call that carried the count was
// sent after its own grant.
func (tk *laneTokens) grantedSince(at int64) (tokens, calls float64) {
	for _, g := range tk.recent {
		if g.at >= at {
			tokens += float64(g.est)
			calls++
		}
	}
	return tokens, calls
}

// tokensLocked returns the lane's token accounting, made if need be.
func (l *lane) tokensLocked(cfg *Config) *laneTokens {
	if l.tok == nil {
		l.tok = &laneTokens{}
		l.rebudgetLocked(cfg)
	}
	return l.tok
}

// budgeted reports whether cfg sets a token budget.
func (c *Config) budgeted() bool { return c.TokensPerMinute > 0 || c.MaxInflightTokens > 0 }

// rebudgetLocked applies cfg's budgets to the lane's accounting. A bucket
// that is turned on starts full, less what the calls in flight are
// estimated at; one whose size changes keeps its tokens, up to the new
// size (and owes at most the new size). The calls that no longer fit a whole budget leave the queue with a
// *TokenBudgetError.
func (l *lane) rebudgetLocked(cfg *Config) {
	tk := l.tok
	if tk == nil {
		if !cfg.budgeted() {
			return
		}
		l.tok = &laneTokens{}
		tk = l.tok
	}
	now := l.nowNS()
	b := &tk.bucket
	switch c := float64(cfg.TokensPerMinute); {
	case c == 0:
		b.on = false
	case !b.on:
		*b = bucket{on: true, cap: c, level: max(0, c-float64(tk.inflight)), at: now}
	default:
		// Resized: it keeps its tokens up to the new size, and owes at
		// most the new size, as a bucket always does (settleTokens).
		b.refill(now)
		b.cap, b.level = c, max(-c, min(b.level, c))
	}
	for w := l.q.oldest; w != nil; {
		next := w.next
		// A raise (calibrateLocked) is at most the smallest budget: kept
		// so under the new ones. Too large is what the caller asked for.
		w.cost = min(w.cost, max(w.base, l.smallestBudgetLocked(cfg)))
		if err := l.tooLargeLocked(cfg, w.base); err != nil {
			t := l.lim.clock.Now()
			l.dequeueLocked(w, t)
			w.waited, w.err = t.Sub(w.enqueued), err
			w.end(refused)
		}
		w = next
	}
}

// tooLargeLocked returns a *TokenBudgetError if cost exceeds a whole
// budget of the lane, nil otherwise.
//
// It allocates only for the error: an allocation on the way to a wait can
// grow the waiting goroutine's stack (docs/DESIGN.md, "A queued call's
// stack").
func (l *lane) tooLargeLocked(cfg *Config, cost int64) error {
	var budget string
	var limit int64
	switch {
	case cost <= 0:
		return nil
	case cfg.TokensPerMinute > 0 && cost > cfg.TokensPerMinute:
		budget, limit = "tokens_per_minute", cfg.TokensPerMinute
	case cfg.MaxInflightTokens > 0 && cost > cfg.MaxInflightTokens:
		budget, limit = "max_inflight_tokens", cfg.MaxInflightTokens
	case cost > MaxCallTokens:
		budget, limit = "max_call_tokens", MaxCallTokens
	case l.tok != nil && l.tok.provLimit > 0 && cost > l.tok.provLimit:
		budget, limit = "provider", l.tok.provLimit
	default:
		return nil
	}
	return &TokenBudgetError{Lane: l.key, Tokens: cost, Budget: budget, Limit: limit}
}

// Why a call waits, as the snapshot says.
const (
	WaitSlot       = "slot"        // every slot it may take is held
	WaitTokens     = "tokens"      // the lane's token budget has no room for it yet
	WaitProvider   = "provider"    // the provider's rate-limit headers said its budget is spent
	WaitRetryAfter = "retry_after" // a 429's Retry-After holds the lane
)

// tokensFitLocked reports whether a call estimated at cost tokens may be
// granted at now (ns) by the lane's budgets and the provider's word. If
// not, it says which holds it back and when it may fit (0: not before a
// release).
func (l *lane) tokensFitLocked(cfg *Config, cost int64, now int64) (ok bool, why string, wake int64) {
	tk := l.tok
	tk.at = now
	if now < tk.hold {
		return false, WaitRetryAfter, tk.hold
	}
	tk.hold = 0
	c := float64(cost)
	if m := cfg.MaxInflightTokens; m > 0 && tk.inflight > 0 && tk.inflight+cost > m {
		return false, WaitTokens, 0
	}
	if b := &tk.bucket; b.on {
		b.refill(now)
		if b.level+tokenEps < c {
			return false, WaitTokens, max(now+1, now+int64(math.Ceil((c-b.level)*float64(time.Minute)/b.cap)))
		}
	}
	tk.provTokens.expire(now)
	tk.provRequests.expire(now)
	if ok, wake := tk.provTokens.fits(c, now); !ok {
		return false, WaitProvider, wake
	}
	if ok, wake := tk.provRequests.fits(1, now); !ok {
		return false, WaitProvider, wake
	}
	return true, "", 0
}

// takeTokensLocked charges a grant estimated at cost, held by h. It
// follows tokensFitLocked's look at the budgets under the same lock, and
// is charged at its time, so that a grant reads the clock once.
func (l *lane) takeTokensLocked(h *hold, cost int64) {
	tk := l.tok
	h.est, h.cost = cost, cost
	tk.inflight += cost
	if b := &tk.bucket; b.on {
		b.level = max(-b.cap, b.level-float64(cost))
	}
	tk.provTokens.take(float64(cost), tk.at)
	tk.provRequests.take(1, tk.at)
	if tk.provTokens.on || tk.provRequests.on {
		// Remembered only while the provider's word is kept, when at is
		// this grant's time (tokensFitLocked looked at the budgets).
		tk.recent[tk.next] = struct{ at, est int64 }{tk.at, cost}
		tk.next = (tk.next + 1) % recentGrants
	}
}

// settleTokens replaces what h's grant was charged with u, at once: a call
// that used less gives the rest back to the budget, one that used more
// takes the difference.
func (l *lane) settleTokens(h *hold, gen uint64, u Usage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.gen != gen || l.tok == nil {
		return
	}
	tk := l.tok
	if b, changed := BoundUsage(u, usageCeiling(l.lim.cfg.Load(), tk.provLimit)); changed {
		l.warnUsage(u, b)
		u = b
	}
	used := u.Total()
	if b := &tk.bucket; b.on {
		if used > h.cost {
			// Taking more must refill first: the bucket may have been
			// full since it was last looked at, and the refill capped.
			b.refill(l.nowNS())
		}
		// Giving back needs no clock: the refill is linear, and capping
		// before or after adding gives the same. A bucket owes at most
		// one budget: whatever a usage says, it is whole again within
		// two minutes.
		b.level = max(-b.cap, min(b.cap, b.level-float64(used-h.cost)))
	}
	if !h.settled {
		l.freshenLocked() // the statistics' step, without reading the clock every time
		l.stats.Settled(stats.Tokens{Prompt: u.Prompt, Completion: u.Completion, Estimate: h.est})
		l.learnLocked(h, used)
		if h.open {
			if l.outputs == nil {
				l.outputs = new(outputs)
			}
			l.outputs.add(u.Completion)
		}
	}
	h.cost, h.settled = used, true
	if l.q.n > 0 {
		l.dispatchLocked(l.lim.clock.Now())
	}
}

// releaseTokensLocked counts the end of h's call.
func (l *lane) releaseTokensLocked(h *hold) {
	l.tok.inflight -= h.est
	h.est, h.cost, h.settled = 0, 0, false
}

// RecordLimits reports what the rate-limit headers of an answer in lane key
// said (see ProviderLimits). The lane grants no more than they say
// remains, less what it has granted since, refilling towards the limit so
// as to be whole at the reset they announce (and past it, until it is
// whole), even with no budget configured; a RetryAfter holds its grants
// until it has passed (at most MaxRetryAfterHold). Like RecordExchange it
// never creates a lane. With a Backend it goes to pl.Slot's lease, if that
// is a LimitsLease (the provider's word then binds the lane in every
// process), and does nothing otherwise.
func (l *Limiter) RecordLimits(_ context.Context, key string, pl ProviderLimits) {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 || (!pl.Tokens.Known && !pl.Requests.Known && pl.RetryAfter <= 0) {
		return
	}
	pl = BoundProviderLimits(pl, cfg.providerWindow())
	if l.backend != nil {
		if ll, ok := pl.Slot.lease().(LimitsLease); ok {
			ll.RecordLimits(pl)
		}
		return
	}
	ln := l.lockedLane(key)
	if ln == nil {
		return
	}
	defer ln.mu.Unlock()
	ln.cold = false // warmed here: the dispatch below grants with the provider's word
	tk := ln.tokensLocked(cfg)
	now := l.clock.Now()
	ns := ln.ns(now)
	tk.said = max(ns, 1)
	at := ns
	if !pl.At.IsZero() && pl.At.Before(now) {
		at = ln.ns(pl.At)
	}
	tokens, calls := tk.grantedSince(at)
	tk.provTokens.set(pl.Tokens, at, tokens, cfg.providerWindow())
	tk.provRequests.set(pl.Requests, at, calls, cfg.providerWindow())
	if pl.Tokens.Known && pl.Tokens.Limit > 0 {
		tk.provLimit = pl.Tokens.Limit
	}
	if d := pl.RetryAfter; d > 0 {
		tk.hold = max(tk.hold, ns+int64(d))
	}
	ln.touchLocked(now)
	if ln.q.n > 0 {
		ln.dispatchLocked(now)
	}
}

// forgetProviderLocked forgets what the provider's headers said of the
// lane: its budgets, its last announced limit and a 429's hold. A reload
// does it, so that an operator who changed what the lane talks to (or
// sees a lane held by a gateway's mistake) starts from a clean slate; the
// next answer's headers say it again.
func (l *lane) forgetProviderLocked() {
	if tk := l.tok; tk != nil {
		tk.provTokens, tk.provRequests = mirror{}, mirror{}
		tk.hold, tk.said, tk.provLimit = 0, 0, 0
	}
}

// wakeTokensLocked makes sure the queue is looked at again at at (ns),
// when a budget will have room for the call first in line.
func (l *lane) wakeTokensLocked(at int64) {
	when := l.lim.origin.Add(time.Duration(at))
	if pending, ok := l.tok.wake.pendingLocked(); ok && !pending.After(when) {
		return // an earlier look is due anyway
	}
	l.tok.wake.armLocked(l, when, func(now time.Time) {
		if l.q.n > 0 {
			l.dispatchLocked(now)
		}
	})
}

// admitTokensLocked makes the lane's token accounting if need be, and
// refuses a call estimated at cost that no budget could ever grant.
func (l *lane) admitTokensLocked(cfg *Config, cost int64) error {
	l.tokensLocked(cfg)
	return l.tooLargeLocked(cfg, cost)
}

// tokensNowLocked reports whether the budgets let a call estimated at cost
// be granted now, making the lane's token accounting first if the call
// carries an estimate. A call that no budget could ever grant does not
// fit: waitLocked refuses it (tooLargeLocked). It is out of line, and the
// refusal is not made here, to keep Acquire's frame small (docs/DESIGN.md,
// "A queued call's stack").
//
//go:noinline
func (l *lane) tokensNowLocked(cfg *Config, cost int64) bool {
	if l.tok == nil {
		if cost <= 0 && !cfg.budgeted() {
			return true
		}
		l.tokensLocked(cfg)
	}
	if l.tooLargeLocked(cfg, cost) != nil {
		return false // refused, budget or none (a call above MaxCallTokens)
	}
	if !l.tok.binds(cfg) {
		return true
	}
	ok, _, _ := l.tokensFitLocked(cfg, cost, l.nowNS())
	return ok
}

// Settle replaces what the slot's call was estimated at (WithTokens) with
// what it used, u, in its lane's token budget at once: a call estimated at
// 1,000 tokens that used 200 gives 800 back, one that used 3,000 takes the
// difference (the budget may go below 0, and then grants wait until it
// has refilled). A second Settle replaces the first. It does nothing
// after Release, for the zero Slot, or in a lane without token accounting.
// Call it before Release; the estimate counts against
// Config.MaxInflightTokens until the release.
func (s *Slot) Settle(u Usage) {
	h := s.h
	if h == nil {
		return
	}
	if h.lane.lim.backend != nil {
		// A shared lane's budget is its Backend's.
		if lease, ok := s.lease().(SettlingLease); ok {
			if b, changed := BoundUsage(u, usageCeiling(h.lane.lim.cfg.Load(), 0)); changed {
				h.lane.warnUsage(u, b)
				u = b
			}
			lease.Settle(u)
		}
		return
	}
	h.lane.settleTokens(h, s.gen, u)
}

// lease returns the Backend's lease of the slot while it is held, nil
// otherwise.
func (s *Slot) lease() Lease {
	h := s.h
	if h == nil {
		return nil
	}
	h.lane.mu.Lock()
	defer h.lane.mu.Unlock()
	if h.gen != s.gen {
		return nil
	}
	return h.lease
}

// tooLarge returns a *TokenBudgetError if cost exceeds a whole budget of
// cfg, for a lane kept by a Backend (the provider's limit is not known
// there).
func tooLarge(cfg *Config, key string, cost int64) error {
	switch {
	case cost <= 0:
	case cost > MaxCallTokens:
		return &TokenBudgetError{Lane: key, Tokens: cost, Budget: "max_call_tokens", Limit: MaxCallTokens}
	case cfg.TokensPerMinute > 0 && cost > cfg.TokensPerMinute:
		return &TokenBudgetError{Lane: key, Tokens: cost, Budget: "tokens_per_minute", Limit: cfg.TokensPerMinute}
	case cfg.MaxInflightTokens > 0 && cost > cfg.MaxInflightTokens:
		return &TokenBudgetError{Lane: key, Tokens: cost, Budget: "max_inflight_tokens", Limit: cfg.MaxInflightTokens}
	}
	return nil
}
