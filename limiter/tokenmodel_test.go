package limiter_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmlanes/llmlanes/limiter"
)

// TestRandomizedTokens is TestRandomizedTenants with token budgets: every
// call carries an estimate, reconfigurations draw a tokens_per_minute and a
// max_inflight_tokens, calls are settled below, at and above their
// estimates, and the model keeps the budgets as docs/DESIGN.md ("Token
// budgets") states them, the plain way: the bucket, the estimates in
// flight, the first in line holding the line, a call too large refused,
// estimates raised by a tenant's (or the newcomers') record of use over
// estimate, a raised call set aside, service counted in tokens. After every
// step the calls ended and the snapshot (tokens remaining, in flight, and
// what each queued class waits for) must be the model's.
//
// Every figure stays a whole number of tokens at whole or half seconds (a
// bucket of 60 or 120 tokens a minute, estimates in whole tokens), so that
// the model's arithmetic and the lane's agree to the bit.
func TestRandomizedTokens(t *testing.T) { randomizedWith(t, true, true) }

// mTok is a lane's token accounting in the model.
type mTok struct {
	inflight int64   // the estimates of the calls holding slots
	on       bool    // the bucket
	cap      float64 // tokens_per_minute
	level    float64 // at at
	at       time.Time
	timerAt  time.Time // the look the budgets asked for (zero: none)
}

// mOver is a record of use over estimate, at least 1, fading to 1 with a
// half-life of a minute.
type mOver struct {
	r  float64
	at time.Time
}

func (o mOver) now(now time.Time) float64 {
	if o.r <= 1 {
		return 1
	}
	return 1 + (o.r-1)*math.Exp2(-float64(now.Sub(o.at))/float64(time.Minute))
}

func (o *mOver) note(r float64, now time.Time) { o.r, o.at = max(r, o.now(now)), now }

func (tk *mTok) refill(now time.Time) {
	if now.After(tk.at) {
		tk.level = min(tk.cap, tk.level+tk.cap*float64(now.Sub(tk.at))/float64(time.Minute))
		tk.at = now
	}
}

// budgeted reports whether the config sets a budget: only then may a
// budget hold a grant back (the model has no provider's word).
func (m *model) budgeted() bool { return m.cfg.TokensPerMinute > 0 || m.cfg.MaxInflightTokens > 0 }

// tooLarge reports whether a call of cost exceeds a whole budget.
func (m *model) tooLarge(cost int64) bool {
	return (m.cfg.TokensPerMinute > 0 && cost > m.cfg.TokensPerMinute) || (m.cfg.MaxInflightTokens > 0 && cost > m.cfg.MaxInflightTokens)
}

// smallest returns the smallest budget, or 0 with none: the most a raise
// makes a call.
func (m *model) smallest() int64 {
	s := int64(0)
	for _, b := range []int64{m.cfg.TokensPerMinute, m.cfg.MaxInflightTokens} {
		if b > 0 && (s == 0 || b < s) {
			s = b
		}
	}
	return s
}

// calibrate returns the estimate of t's call given as base, raised by its
// record (a newcomer's by the newcomers' too), at most the smallest budget.
func (m *model) calibrate(ln *mLane, t *mTenant, base int64) int64 {
	ceiling := m.smallest()
	if ceiling == 0 || base >= ceiling {
		return base
	}
	f := t.over.now(m.now())
	if !t.joined {
		f = max(f, ln.fresh.now(m.now()))
	}
	if f <= 1 {
		return base
	}
	return min(ceiling, int64(math.Ceil(float64(base)*f)))
}

// fits reports whether the budgets let a call of cost be granted now, and
// if not, when the bucket will have room (zero: not before a release).
func (m *model) fits(tk *mTok, cost int64) (bool, time.Time) {
	now := m.now()
	if mx := m.cfg.MaxInflightTokens; mx > 0 && tk.inflight > 0 && tk.inflight+cost > mx {
		return false, time.Time{}
	}
	if tk.on {
		tk.refill(now)
		if c := float64(cost); tk.level+1e-6 < c {
			return false, now.Add(max(1, time.Duration(math.Ceil((c-tk.level)*float64(time.Minute)/tk.cap))))
		}
	}
	return true, time.Time{}
}

// wake asks for a look at the queue at at, unless one is due earlier.
func (tk *mTok) wake(at time.Time) {
	if tk.timerAt.IsZero() || at.Before(tk.timerAt) {
		tk.timerAt = at
	}
}

// rebudget applies the config's budgets to lane ln: a bucket turned on
// starts full less the estimates in flight, one resized keeps its tokens;
// waiters' raises are kept under the smallest budget, and the waiters now
// too large are refused (returned).
func (m *model) rebudget(ln *mLane, k string) []string {
	if ln.tok == nil {
		return nil
	}
	tk, now := ln.tok, m.now()
	switch c := float64(m.cfg.TokensPerMinute); {
	case c == 0:
		tk.on = false
	case !tk.on:
		tk.on, tk.cap, tk.level, tk.at = true, c, max(0, c-float64(tk.inflight)), now
	default:
		tk.refill(now)
		tk.cap, tk.level = c, max(-c, min(tk.level, c))
	}
	var refused []string
	for _, w := range append([]*mWaiter(nil), m.waiters...) {
		if w.lane != k {
			continue
		}
		w.cost = min(w.cost, max(w.base, m.smallest()))
		if m.tooLarge(w.base) {
			m.removeWaiter(w)
			refused = append(refused, w.id)
		}
	}
	return refused
}

// drawEstimate draws a call's estimate: small ones, ones a budget holds
// back, and one larger than either budget.
func drawEstimate(t *rapid.T) int64 {
	return rapid.SampledFrom([]int64{5, 10, 20, 40, 70}).Draw(t, "tokens")
}

// settleCall settles hd's call at a use drawn below, at or above its
// estimate, as Slot.Settle does, and returns the calls the lane grants then.
func (m *model) settleCall(t *rapid.T) {
	var on []*mHeld
	for _, hd := range m.held {
		if hd.onLane && hd.slot != nil && m.lanes[hd.lane].tok != nil {
			on = append(on, hd)
		}
	}
	if len(on) == 0 {
		t.Skip("nothing held on a lane")
	}
	hd := on[rapid.IntRange(0, len(on)-1).Draw(t, "settled")]
	used := rapid.SampledFrom([]int64{hd.est / 2, hd.est, hd.est*2 + 1}).Draw(t, "used")
	u := limiter.Usage{Prompt: used / 2, Completion: used - used/2}
	hd.slot.Settle(u)
	ln := m.lane(hd.lane)
	tk := ln.tok
	if c := max(m.cfg.TokensPerMinute, m.cfg.MaxInflightTokens); c > 0 {
		used = min(used, c)
	}
	if tk.on {
		if used > hd.cost {
			tk.refill(m.now())
		}
		tk.level = max(-tk.cap, min(tk.cap, tk.level-float64(used-hd.cost)))
	}
	if !hd.settled && hd.base > 0 {
		r := float64(used) / float64(hd.base)
		ln.tenants[hd.tenant].over.note(r, m.now())
		if hd.fresh {
			ln.fresh.note(r, m.now())
		}
	}
	hd.cost, hd.settled = used, true
	m.settle(m.dispatch(hd.lane), nil)
}

// checkTokens compares a lane's token snapshot with the model's.
func (m *model) checkTokens(t *rapid.T, l limiter.LaneSnapshot) {
	ml := m.lane(l.Lane)
	tk := ml.tok
	s := l.Tokens
	if tk == nil || s == nil {
		if (tk == nil) != (s == nil) {
			t.Fatalf("lane %s: tokens %+v, model %+v", l.Lane, s, tk)
		}
		return
	}
	if s.Inflight != tk.inflight {
		t.Fatalf("lane %s: %d tokens in flight, model %d", l.Lane, s.Inflight, tk.inflight)
	}
	if tk.on {
		b := *tk
		b.refill(m.now())
		if s.Remaining == nil || *s.Remaining != int64(b.level) {
			t.Fatalf("lane %s: remaining %s, model %v (bucket %+v at %v)", l.Lane, fmtPtr(s.Remaining), b.level, *tk, m.now().Sub(t0))
		}
	} else if s.Remaining != nil {
		t.Fatalf("lane %s: remaining %d with no bucket", l.Lane, *s.Remaining)
	}
	// What each queued class waits for: a slot, unless a slot it may take
	// is free; then what the first in the lane's order waits for.
	var mine []*mWaiter
	for _, w := range m.waiters {
		if w.lane == l.Lane && !m.capped(l.Lane, w.tenant) {
			mine = append(mine, w)
		}
	}
	why := limiter.WaitSlot
	if best := m.pick(mine, m.now()); best != nil {
		b := *tk
		if ok, _ := m.fits(&b, best.cost); !ok {
			why = limiter.WaitTokens
		}
	}
	want := map[string]string{}
	for _, w := range m.waiters {
		if w.lane != l.Lane {
			continue
		}
		if m.slotFits(ml, w.prio) {
			want[w.prio.String()] = why
		} else {
			want[w.prio.String()] = limiter.WaitSlot
		}
	}
	if len(want) == 0 {
		want = nil
	}
	if len(s.WaitingFor) != len(want) {
		t.Fatalf("lane %s: waiting for %v, model %v", l.Lane, s.WaitingFor, want)
	}
	for c, w := range want {
		if s.WaitingFor[c] != w {
			t.Fatalf("lane %s: waiting for %v, model %v", l.Lane, s.WaitingFor, want)
		}
	}
}

func fmtPtr(p *int64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10)
}
