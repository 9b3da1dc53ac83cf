package limiter

import "time"

// A laneTimer is one of a lane's two timers (its waits' deadlines, and the
// wake-up for a token budget's room): at most one pending call of its
// function, for the time it was last armed for. Its function runs with the
// lane's lock held, and does nothing if the timer was armed again or
// stopped since it was armed: a runtime timer cannot be stopped once its
// function has started, and that function may be waiting for the lock
// while the lane re-arms or stops the timer. The generation tells the two
// apart. Guarded by the lane's mu.
type laneTimer struct {
	t   Timer
	at  time.Time
	gen uint64
}

// armLocked sets the timer to call f at at, on lane l's clock, with l's
// lock held and the time it runs at; what was pending is dropped.
func (t *laneTimer) armLocked(l *lane, at time.Time, f func(now time.Time)) {
	t.stopLocked()
	gen := t.gen
	t.at = at
	t.t = l.lim.clock.AfterFunc(max(0, at.Sub(l.lim.clock.Now())), func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if gen != t.gen {
			return // armed again, or stopped, since
		}
		t.t = nil
		f(l.lim.clock.Now())
	})
}

// stopLocked drops what is pending: a call already under way does nothing.
func (t *laneTimer) stopLocked() {
	t.gen++
	if t.t != nil {
		t.t.Stop()
		t.t = nil
	}
}

// pendingLocked reports whether the timer is armed, and for when.
func (t *laneTimer) pendingLocked() (time.Time, bool) { return t.at, t.t != nil }
