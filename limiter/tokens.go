package limiter

import (
	"context"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/budget"
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
	// Concurrency is set for a 429 that refused the call for the number
	// of calls at work at the gateway, not for a rate: a gateway's
	// parallel-request limit (LiteLLM's max_parallel_requests), which has
	// room again as soon as one of its calls ends. Such a 429 holds the
	// lane's grants only until a call in flight on the lane (other than
	// Slot's) ends, or its RetryAfter passes, whichever is first; with no
	// Retry-After, or no other call in flight, for ConcurrencyHold at most.
	Concurrency bool
	// RefuseAbove is set when the headers are the provider's own (its
	// API refuses a call larger than its per-window token limit): a call
	// estimated above the announced token limit is then refused, for one
	// provider window after the limit was last heard. A gateway's own
	// accounting (LiteLLM's tpm) announces a limit it does not refuse a
	// call for: there the call waits until the budget is whole instead.
	RefuseAbove bool
	// At is when the provider counted what remains: when the call whose
	// answer carried the headers was sent (zero: now). The budget refills
	// from then, and is whole at At plus the reset.
	At time.Time
	// Slot is that call's slot, if known: the count holds that call, and
	// the calls answered before it was granted (see RecordLimits); without
	// it, every call holding a slot is taken as missing from the count.
	// With a Backend the report goes to its lease (a LimitsLease), which
	// judges the same on the store's grants.
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

// ConcurrencyHold is how long a concurrency 429 holds the lane's grants at
// most when it has no Retry-After, or when the lane has no call in flight
// but the refused one, whose end would end the hold (see
// ProviderLimits.Concurrency).
const ConcurrencyHold = time.Second

// binds reports whether anything may hold a grant back under cfg: a
// budget, the provider's word or a hold. A lane whose calls only carry
// estimates reads no clock for them.
func (tk *laneTokens) binds(cfg *Config) bool { return tk.Binds(cfg.budgeted()) }

// laneTokens is a lane's token accounting: what its calls in flight are
// estimated at, its budget, the provider's word, and the tokens used in
// the last 5 minutes. A lane makes it with its first call that carries an
// estimate, its first budget, or its first report from the provider.
// Guarded by the lane's lock.
type laneTokens struct {
	// Budgets are the estimates in flight, the bucket, the provider's
	// budgets and a 429's hold.
	budget.Budgets
	// said is when the provider's headers last said anything (ns; 0:
	// never).
	said int64
	// provLimit is the token limit the provider last announced as its own
	// (ProviderLimits.RefuseAbove; 0: none): until provUntil (ns), one
	// provider window after it was last heard, a call estimated above it
	// is refused, whether or not the provider's budget is whole now. A
	// reload forgets it.
	provLimit, provUntil int64
	// conc is the gateway's last concurrency refusal (see
	// ProviderLimits.Concurrency).
	conc concRefusal
	// wake looks at the queue again when a budget will have room for the
	// call first in line.
	wake laneTimer
	// outputs is what the lane's calls with no output bound wrote lately;
	// nil until one has (a pointer: the ring would make every lane larger).
	outputs *outputs
}

// concRefusal is what the lane knows of a gateway's concurrency 429s: the
// hold (budget.Budgets.ConcHold) ends when a call in flight other than by's
// (at generation gen) ends.
type concRefusal struct {
	by       *hold
	gen      uint64
	inflight int   // calls in flight on the lane at the last one, its own included
	at       int64 // when the last one was heard (ns; 0: never)
	count    int64 // how many were heard
}

// announcedLimitLocked returns the token limit the provider announced as
// its own while it binds at now (ns), 0 otherwise.
func (tk *laneTokens) announcedLimitLocked(now int64) int64 {
	if tk.provLimit > 0 && now < tk.provUntil {
		return tk.provLimit
	}
	return 0
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
	b := &tk.Bucket
	switch c := float64(cfg.TokensPerMinute); {
	case c == 0:
		b.On = false
	case !b.On:
		*b = budget.Bucket{On: true, Cap: c, Level: max(0, c-float64(tk.Inflight)), At: now}
	default:
		// Resized: it keeps its tokens up to the new size, and owes at
		// most the new size, as a bucket always does (settleTokens).
		b.Refill(now)
		b.Cap, b.Level = c, max(-c, min(b.Level, c))
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
	case l.tok != nil && l.tok.provLimit > 0 && cost > l.tok.provLimit && l.tok.announcedLimitLocked(l.nowNS()) > 0:
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
	// WaitGatewayConcurrency: a gateway's concurrency 429 holds the lane
	// until one of its calls in flight ends.
	WaitGatewayConcurrency = "gateway_concurrency"
)

// tokensFitLocked reports whether a call estimated at cost tokens may be
// granted at now (ns) by the lane's budgets and the provider's word. If
// not, it says which holds it back and when it may fit (0: not before a
// release).
func (l *lane) tokensFitLocked(cfg *Config, cost int64, now int64) (ok bool, why string, wake int64) {
	ok, why, wake = l.tokensFitAtLocked(cfg, cost, now)
	l.tok.Advance(now) // a grant that follows is charged at now
	return ok, why, wake
}

// tokensFitAtLocked is tokensFitLocked for a reading (the snapshot's): it
// changes nothing.
func (l *lane) tokensFitAtLocked(cfg *Config, cost int64, now int64) (ok bool, why string, wake int64) {
	r, wake := l.tok.Fits(now, cost, cfg.MaxInflightTokens)
	return r == budget.Fit, waitReasons[r], wake
}

// waitReasons are the snapshot's words for the budgets' reasons.
var waitReasons = [...]string{budget.Fit: "", budget.Tokens: WaitTokens, budget.Provider: WaitProvider, budget.RetryAfter: WaitRetryAfter, budget.Concurrency: WaitGatewayConcurrency}

// takeTokensLocked charges a grant estimated at cost, held by h. It
// follows tokensFitLocked's look at the budgets under the same lock, and
// is charged at its time, so that a grant reads the clock once.
func (l *lane) takeTokensLocked(h *hold, cost int64) {
	h.est, h.cost = cost, cost
	l.tok.Take(cost)
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
	if b, changed := BoundUsage(u, usageCeiling(l.lim.cfg.Load(), tk.announcedLimitLocked(l.nowNS()))); changed {
		l.warnUsage(u, b)
		u = b
	}
	used := u.Total()
	if b := &tk.Bucket; b.On {
		if used > h.cost {
			// Taking more must refill first: the bucket may have been
			// full since it was last looked at, and the refill capped.
			b.Refill(l.nowNS())
		}
		// Giving back needs no clock: the refill is linear, and capping
		// before or after adding gives the same. A bucket owes at most
		// one budget: whatever a usage says, it is whole again within
		// two minutes.
		b.Level = max(-b.Cap, min(b.Cap, b.Level-float64(used-h.cost)))
	}
	if !h.settled {
		l.freshenLocked() // the statistics' step, without reading the clock every time
		l.stats.Settled(stats.Tokens{Prompt: u.Prompt, Completion: u.Completion, Estimate: h.est})
		l.learnLocked(h, used)
		if h.open {
			if l.tok.outputs == nil {
				l.tok.outputs = new(outputs)
			}
			l.tok.outputs.add(u.Completion)
		}
	}
	h.cost, h.settled = used, true
	if l.q.n > 0 {
		l.dispatchLocked(l.lim.clock.Now())
	}
}

// releaseTokensLocked counts the end of h's call, which held its slot at
// generation gen. Its end gives a gateway that refused a call for
// concurrency room again, unless the call was the refused one.
func (l *lane) releaseTokensLocked(h *hold, gen uint64) {
	if c := &l.tok.conc; l.tok.ConcHold != 0 && (h != c.by || gen != c.gen) {
		l.tok.ConcHold, c.by = 0, nil
	}
	l.tok.Inflight -= h.est
	h.est, h.cost, h.settled = 0, 0, false
}

// RecordLimits reports what the rate-limit headers of an answer in lane key
// said (see ProviderLimits). The lane grants no more than they say
// remains, less what its calls that the count may not hold are charged
// (the calls holding slots, but pl.Slot's and those answered before it was
// granted) and what it grants from then on, refilling towards the limit so
// as to be whole at the reset they announce (and past it, until it is
// whole), even with no budget configured; a RetryAfter holds its grants
// until it has passed (at most MaxRetryAfterHold). Like RecordExchange it
// never creates a lane. With a Backend it goes to pl.Slot's lease, if that
// is a LimitsLease (the provider's word then binds the lane in every
// process), and does nothing otherwise.
func (l *Limiter) RecordLimits(_ context.Context, key string, pl ProviderLimits) {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 || (!pl.Tokens.Known && !pl.Requests.Known && pl.RetryAfter <= 0 && !pl.Concurrency) {
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
	ln.limit = ln.limit.answered() // warmed here: the dispatch below grants with the provider's word
	tk := ln.tokensLocked(cfg)
	now := l.clock.Now()
	ns := ln.ns(now)
	tk.said = max(ns, 1)
	at := ns
	if !pl.At.IsZero() && pl.At.Before(now) {
		at = ln.ns(pl.At)
	}
	tokens, calls := ln.missedLocked(pl.Slot)
	if b := pl.Tokens; b.Known {
		tk.Tokens = budget.Said(b.Limit, b.Remaining, b.Reset, at, tokens, cfg.providerWindow())
	}
	if b := pl.Requests; b.Known {
		tk.Requests = budget.Said(b.Limit, b.Remaining, b.Reset, at, calls, cfg.providerWindow())
	}
	if pl.RefuseAbove && pl.Tokens.Known && pl.Tokens.Limit > 0 {
		tk.provLimit, tk.provUntil = pl.Tokens.Limit, ns+int64(cfg.providerWindow())
	}
	switch d := pl.RetryAfter; {
	case pl.Concurrency:
		ln.concurrencyLocked(pl.Slot, ns, d)
	case d > 0:
		tk.Hold = max(tk.Hold, ns+int64(d))
	}
	ln.touchLocked(now)
	if ln.q.n > 0 {
		ln.dispatchLocked(now)
	}
}

// concurrencyLocked records a gateway's concurrency 429 to the call of s,
// heard at now (ns), with Retry-After d (0: none): the lane's grants wait
// until a call in flight other than s's ends, or d passes.
func (l *lane) concurrencyLocked(s Slot, now int64, d time.Duration) {
	if d <= 0 || l.slots.inflight <= 1 {
		// With no call of the lane in flight but the refused one, the
		// gateway's room is taken by calls the lane cannot see end (other
		// lanes', other clients'): it looks again soon.
		d = ConcurrencyHold
	}
	tk, c := l.tok, &l.tok.conc
	tk.ConcHold = max(tk.ConcHold, now+int64(d))
	c.by, c.gen = nil, 0
	if h := s.h; h != nil && h.lane == l && h.gen == s.gen {
		c.by, c.gen = h, h.gen
	}
	c.inflight, c.at = l.slots.inflight, max(now, 1)
	c.count++
}

// missedLocked returns what the calls that a provider's count, carried by
// the answer of s's call, may not hold are charged (their estimates, or
// their use once settled), and how many they are; it marks s's call
// answered. The count holds s's call, and every call whose own answer
// reported the provider's headers before s's call was granted: that call
// reached the provider before s's was even sent. Any other call holding a
// slot may have reached it after s's (its process, the network or the
// gateway slower for it), so it is counted again; erring that way costs
// concurrency at the provider's edge until the next answers, where the
// other way sends a call the provider has no room for, and its 429 holds
// the whole lane. A call that has ended is taken as counted. Without s
// (or once it is released), every holder is counted again.
func (l *lane) missedLocked(s Slot) (tokens, calls float64) {
	self := s.h
	if self == nil || self.lane != l || self.gen != s.gen {
		self = nil
	}
	mine := uint64(0)
	if self != nil {
		if self.idx < 0 {
			// Granted before the lane kept its list, so before every
			// call listed: none of them answered before its grant.
			l.listLocked(self)
			self.grant = 0
		}
		mine = self.grant
		l.slots.seq++
		self.answered = l.slots.seq
	}
	for _, h := range l.slots.held {
		if h == self || (h.answered != 0 && h.answered < mine) {
			continue
		}
		tokens += float64(h.cost)
		calls++
	}
	// The holders not listed were granted before the lane kept its list,
	// and have not reported since: they were charged no tokens.
	calls += float64(l.slots.inflight - len(l.slots.held))
	return tokens, calls
}

// forgetProviderLocked forgets what the provider's headers said of the
// lane: its budgets, its last announced limit and a 429's hold. A reload
// does it, so that an operator who changed what the lane talks to (or
// sees a lane held by a gateway's mistake) starts from a clean slate; the
// next answer's headers say it again.
func (l *lane) forgetProviderLocked() {
	if tk := l.tok; tk != nil {
		tk.Tokens, tk.Requests = budget.Mirror{}, budget.Mirror{}
		tk.Hold, tk.ConcHold, tk.said, tk.provLimit, tk.provUntil = 0, 0, 0, 0, 0
		tk.conc = concRefusal{}
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
