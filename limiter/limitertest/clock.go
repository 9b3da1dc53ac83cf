// Package limitertest provides a fake clock for tests of code that uses
// package limiter, so that aging, queue timeouts, saturation and the
// 5-minute windows can be driven step by step without sleeping.
package limitertest

import (
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Clock is a limiter.Clock whose time moves only when Advance is called.
// It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*timer // pending, in no particular order
}

// NewClock returns a clock that reads start until advanced.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f to run when the clock has been advanced by d or
// more. f runs on the goroutine that calls Advance; a d of 0 or less is due
// at the next Advance, even Advance(0).
func (c *Clock) AfterFunc(d time.Duration, f func()) limiter.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.seq++
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock forward by d. It runs every timer that falls due,
// one at a time in order of due time (then of scheduling), with the clock
// reading that due time while the timer's function runs, and without the
// clock's lock held, so the functions may use the clock. Timers scheduled by
// those functions that fall due within d run too. When Advance returns,
// every due timer has run and the clock reads the old time plus d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		t := c.popDue(end)
		if t == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
	}
}

// NextDue returns when the earliest pending timer falls due, if any: for a
// discrete-event simulation that moves the clock from one due time to the
// next.
func (c *Clock) NextDue() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	for i, t := range c.timers {
		if i == 0 || t.at.Before(best) {
			best = t.at
		}
	}
	return best, len(c.timers) > 0
}

// Pending returns how many timers are scheduled and not yet run or stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// popDue removes and returns the earliest timer due by end, or nil.
func (c *Clock) popDue(end time.Time) *timer {
	best := -1
	for i, t := range c.timers {
		if t.at.After(end) {
			continue
		}
		if best < 0 || t.at.Before(c.timers[best].at) || (t.at.Equal(c.timers[best].at) && t.seq < c.timers[best].seq) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	t := c.timers[best]
	c.removeAt(best)
	return t
}

func (c *Clock) removeAt(i int) {
	last := len(c.timers) - 1
	c.timers[i] = c.timers[last]
	c.timers[last] = nil
	c.timers = c.timers[:last]
}

type timer struct {
	c   *Clock
	at  time.Time
	seq uint64
	f   func()
}

// Stop cancels the timer if it has not run; it reports whether it did.
func (t *timer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, o := range c.timers {
		if o == t {
			c.removeAt(i)
			return true
		}
	}
	return false
}
