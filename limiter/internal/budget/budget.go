// Package budget keeps a lane's token budgets: its own tokens_per_minute
// (Bucket), the provider's budgets as its rate-limit headers last said
// them (Mirror), a 429's hold and the estimates of the calls in flight.
// Times are nanoseconds since the limiter's origin; the caller holds the
// lane's lock.
//
// Budgets.Fits is pure: the snapshot asks it what a call would wait for
// without changing anything. A grant brings the budgets to its time
// (Advance) and takes its estimate (Take); the order of the two and the
// look are the caller's, under one lock, so that a grant reads the clock
// once.
package budget

import (
	"math"
	"time"
)

// Eps absorbs float rounding in the budgets' comparisons, so that a timer
// armed for the moment a budget has room finds it there.
const Eps = 1e-6

// Bucket is a tokens_per_minute budget: a token bucket of capacity Cap
// that refills continuously at Cap per minute. Level may go below 0 (a
// call that used more than its estimate), never below -Cap.
type Bucket struct {
	On    bool
	Cap   float64
	Level float64 // at At
	At    int64
}

// LevelAt returns the level refilled to now.
func (b Bucket) LevelAt(now int64) float64 {
	if now > b.At {
		return min(b.Cap, b.Level+b.Cap*float64(now-b.At)/float64(time.Minute))
	}
	return b.Level
}

// Refill brings the level to now. Refilling at any moments in between
// gives the same level: the refill is linear and capped.
func (b *Bucket) Refill(now int64) {
	if now > b.At {
		b.Level, b.At = b.LevelAt(now), now
	}
}

// Mirror is a budget as the provider last announced it: Level at At,
// refilling at Rate (per ns) towards Limit, so that it is whole at the
// reset the provider announced (Until), less what the lane granted since.
// It binds until its reset, and past it until it has refilled to the
// limit: a lane that forgot the grants it made since the count would send
// a burst the provider has no room for. A budget with no limit stops
// binding at its reset.
//
// Whatever the headers say, it binds for at most two windows: the reset
// is at most a window away (the caller bounds it), the level never below
// minus the limit (0 with none), and it refills by at least the whole
// limit per window.
type Mirror struct {
	On                 bool
	Level, Limit, Rate float64
	At, Until          int64
}

// Said makes the budget what the headers said as counted at at: limit
// (0: not said) and remaining, whole again after reset, less missed (what
// the lane's calls that the count may not hold are charged: see
// limiter.Limiter.RecordLimits). window is the provider's.
func Said(limit, remaining int64, reset time.Duration, at int64, missed float64, window time.Duration) Mirror {
	m := Mirror{On: true, Limit: float64(limit), At: at, Until: at + int64(reset)}
	m.Level = max(-m.Limit, float64(remaining)-missed)
	if limit > 0 {
		m.Rate = m.Limit / float64(window)
		if limit > remaining && reset > 0 {
			m.Rate = max(m.Rate, float64(limit-remaining)/float64(reset))
		}
	}
	return m
}

// Active reports whether the budget binds at now. Once it does not, it
// never does again.
func (m *Mirror) Active(now int64) bool {
	return m.On && (now < m.Until || (m.Rate > 0 && m.LevelAt(now)+Eps < m.Limit))
}

// Expire forgets the budget once it no longer binds, so that the lane
// reads no clock for it (see Budgets.Binds).
func (m *Mirror) Expire(now int64) {
	if m.On && !m.Active(now) {
		m.On = false
	}
}

// BindsFor returns how long from now (ns) the budget binds: to its reset,
// and past it until it has refilled to its limit (0: it does not).
func (m *Mirror) BindsFor(now int64) int64 {
	if !m.Active(now) {
		return 0
	}
	d := m.Until - now
	if m.Rate > 0 && m.Limit > 0 {
		d = max(d, int64(math.Ceil((m.Limit-m.LevelAt(now))/m.Rate)))
	}
	return max(0, d)
}

// LevelAt returns the budget's level at now.
func (m *Mirror) LevelAt(now int64) float64 {
	v := m.Level + m.Rate*float64(now-m.At)
	if m.Limit > 0 {
		v = min(v, m.Limit)
	}
	return v
}

// Fits reports whether cost fits at now; if not, when it may.
func (m *Mirror) Fits(cost float64, now int64) (bool, int64) {
	if !m.Active(now) {
		return true, 0
	}
	v := m.LevelAt(now)
	if v+Eps >= cost {
		return true, 0
	}
	wake := int64(math.MaxInt64) // active: before the reset, or refilling
	if now < m.Until {
		wake = m.Until
	}
	if m.Rate > 0 {
		wake = min(wake, now+int64(math.Ceil((cost-v)/m.Rate)))
	}
	return false, max(wake, now+1)
}

// Take charges cost at now.
func (m *Mirror) Take(cost float64, now int64) {
	if m.Active(now) {
		m.Level, m.At = max(-m.Limit, m.LevelAt(now)-cost), now
	}
}

// Reason is what a call that does not fit waits for.
type Reason int

// The reasons.
const (
	Fit         Reason = iota // nothing: it fits
	Tokens                    // the lane's own budgets
	Provider                  // the provider's budgets
	RetryAfter                // a 429's Retry-After holds the lane
	Concurrency               // a gateway's concurrency 429 holds the lane
)

// Budgets are what may hold a lane's grants back for tokens.
type Budgets struct {
	Inflight int64 // the estimates of the calls holding slots
	Bucket   Bucket
	// Tokens and Requests are the provider's budgets; Hold is when a
	// rate limit's 429 stops holding grants (its Retry-After), ConcHold
	// when a concurrency 429's does at the latest (the caller ends it
	// sooner, when a call in flight ends).
	Tokens, Requests Mirror
	Hold, ConcHold   int64
	// At is the time of the last Advance: a grant follows it at once,
	// under the same lock, and is charged then.
	At int64
}

// Binds reports whether anything may hold a grant back, a budget of the
// lane's configuration (budgeted) aside: the provider's word or a hold. A
// lane whose calls only carry estimates reads no clock for them.
func (b *Budgets) Binds(budgeted bool) bool {
	return budgeted || b.Tokens.On || b.Requests.On || b.Hold != 0 || b.ConcHold != 0
}

// Fits reports whether a call estimated at cost tokens may be granted at
// now, with at most maxInflight tokens estimated in flight (0: no bound):
// if not, what it waits for and when it may fit (0: when a call in flight
// ends). It changes nothing.
func (b *Budgets) Fits(now, cost, maxInflight int64) (Reason, int64) {
	if now < b.Hold {
		return RetryAfter, b.Hold
	}
	if now < b.ConcHold {
		return Concurrency, b.ConcHold
	}
	c := float64(cost)
	if maxInflight > 0 && b.Inflight > 0 && b.Inflight+cost > maxInflight {
		return Tokens, 0
	}
	if bk := &b.Bucket; bk.On {
		if v := bk.LevelAt(now); v+Eps < c {
			return Tokens, max(now+1, now+int64(math.Ceil((c-v)*float64(time.Minute)/bk.Cap)))
		}
	}
	if ok, wake := b.Tokens.Fits(c, now); !ok {
		return Provider, wake
	}
	if ok, wake := b.Requests.Fits(1, now); !ok {
		return Provider, wake
	}
	return Fit, 0
}

// Advance brings the budgets to now: the bucket refilled, a hold or a
// provider's budget that has ended forgotten. What Fits answers at now is
// the same before and after.
func (b *Budgets) Advance(now int64) {
	b.At = now
	if now >= b.Hold {
		b.Hold = 0
	}
	if now >= b.ConcHold {
		b.ConcHold = 0
	}
	if b.Bucket.On {
		b.Bucket.Refill(now)
	}
	b.Tokens.Expire(now)
	b.Requests.Expire(now)
}

// Take charges a grant estimated at cost at the time of the last Advance.
func (b *Budgets) Take(cost int64) {
	b.Inflight += cost
	if bk := &b.Bucket; bk.On {
		bk.Level = max(-bk.Cap, bk.Level-float64(cost))
	}
	b.Tokens.Take(float64(cost), b.At)
	b.Requests.Take(1, b.At)
}
