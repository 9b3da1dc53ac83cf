package lanehttp

import (
	"testing"
	"time"
)

// The memory of recent calls, step by step.
func TestRecall(t *testing.T) {
	t0 := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	r := newRecall(2 * time.Minute)

	a := r.begin(1, 7, t0, false)
	if !a.arrival.Equal(t0) || a.retry || !a.tracked {
		t.Fatalf("first attempt %+v", a)
	}
	// The same request while the first is in progress: a call of its own.
	if d := r.begin(1, 7, at(time.Second), false); !d.arrival.Equal(at(time.Second)) || d.retry || d.tracked {
		t.Fatalf("side-by-side duplicate %+v", d)
	}
	a.end(at(10*time.Second), true, false)
	// A retry within the window keeps the first arrival.
	b := r.begin(1, 7, at(70*time.Second), false)
	if !b.arrival.Equal(t0) || !b.retry {
		t.Fatalf("retry %+v", b)
	}
	b.end(at(80*time.Second), true, true) // it succeeded: forgotten
	if c := r.begin(1, 7, at(90*time.Second), false); c.retry || !c.arrival.Equal(at(90*time.Second)) {
		t.Fatalf("after success %+v", c)
	} else {
		c.end(at(100*time.Second), true, false)
	}
	// Past the window after its last attempt, a call starts over.
	if e := r.begin(1, 7, at(100*time.Second+2*time.Minute+time.Nanosecond), false); e.retry {
		t.Fatalf("after the window %+v", e)
	} else {
		e.end(at(4*time.Minute), true, false)
	}
	// A chain of attempts older than maxCallAge starts over, however
	// recent its last attempt.
	r2 := newRecall(2 * time.Minute)
	now := t0
	x := r2.begin(2, 7, now, false)
	for now.Sub(t0) <= maxCallAge {
		now = now.Add(time.Minute)
		x.end(now, true, false)
		now = now.Add(time.Minute)
		x = r2.begin(2, 7, now, false)
	}
	if x.retry || !x.arrival.Equal(now) {
		t.Fatalf("after %s of attempts %+v, want a new call", now.Sub(t0), x)
	}
}

// The memory is bounded: idle calls are evicted, oldest first, and when
// every remembered call is in progress a new one is simply not remembered.
func TestRecallBounded(t *testing.T) {
	t0 := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	r := newRecall(time.Hour)
	for k := uint64(0); k < maxRecalled; k++ {
		r.begin(k, k, t0, false).end(t0.Add(time.Duration(k)), true, false)
	}
	r.begin(maxRecalled, maxRecalled, t0.Add(time.Second), false) // evicts key 0, the longest idle
	if r.len() != maxRecalled {
		t.Fatalf("%d remembered, bound %d", r.len(), maxRecalled)
	}
	if a := r.begin(0, 0, t0.Add(2*time.Second), false); a.retry { // and evicts key 1
		t.Fatal("the evicted call was still recalled")
	}
	if a := r.begin(maxRecalled-1, maxRecalled-1, t0.Add(2*time.Second), false); !a.retry {
		t.Fatal("a call that was not evicted was forgotten")
	}
	full := newRecall(time.Hour)
	for k := uint64(0); k < maxRecalled; k++ {
		full.begin(k, k, t0, false) // all in progress
	}
	if a := full.begin(maxRecalled, maxRecalled, t0, false); a.tracked || full.len() != maxRecalled {
		t.Fatalf("new call when all are in progress: %+v, %d remembered", a, full.len())
	}
}

// Only an attempt that reached the gateway makes a place: one its caller
// gave up while it queued (or that timed out, or was refused) leaves none,
// even for a call whose earlier attempt did reach the gateway.
func TestRecallOnlySentAttempts(t *testing.T) {
	t0 := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	r := newRecall(30 * time.Second)
	r.begin(1, 7, t0, false).end(t0.Add(time.Second), false, false) // canceled while queued
	if a := r.begin(1, 7, t0.Add(2*time.Second), false); a.retry || !a.arrival.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("after an attempt that never reached the gateway: %+v", a)
	} else {
		a.end(t0.Add(3*time.Second), true, false) // sent, failed: a place
	}
	b := r.begin(1, 7, t0.Add(4*time.Second), false)
	if !b.retry {
		t.Fatal("a retry after a failed attempt that reached the gateway was not recognised")
	}
	b.end(t0.Add(5*time.Second), false, false) // the retry gave up in the queue
	if c := r.begin(1, 7, t0.Add(6*time.Second), false); c.retry {
		t.Fatal("the place survived an attempt that gave up while queued")
	}
}

// One caller's share of the memory is bounded: its flood of failing calls
// leaves another caller's retries recognised.
func TestRecallPerCaller(t *testing.T) {
	t0 := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	r := newRecall(time.Hour)
	r.begin(1, 100, t0, false).end(t0, true, false) // the honest caller's failed call
	for k := uint64(2); k < 2+maxRecalled; k++ {
		r.begin(k, 200, t0.Add(time.Second), false).end(t0.Add(time.Second), true, false)
	}
	if n := r.callers[200]; n != maxPerCaller {
		t.Fatalf("the flooding caller has %d calls remembered, bound %d", n, maxPerCaller)
	}
	if a := r.begin(1, 100, t0.Add(2*time.Second), false); !a.retry || !a.arrival.Equal(t0) {
		t.Fatalf("the honest caller's retry after the flood: %+v", a)
	}
}

// A call whose caller gave up while it queued keeps, for a resend its SDK
// marks as a retry within the window, the time it waited, not the time
// away; it is not counted as a retry. An unmarked resend, a marked one for
// a call never seen, or one past the window starts over.
func TestRecallGaveUpInQueue(t *testing.T) {
	t0 := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	r := newRecall(30 * time.Second)

	a := r.begin(1, 7, t0, false)
	a.gaveUp(at(6 * time.Second)) // waited 6 s, then its client timed out
	b := r.begin(1, 7, at(8*time.Second), true)
	if !b.arrival.Equal(at(2*time.Second)) || b.retry || !b.tracked {
		t.Fatalf("marked retry %+v, want arrival 2 s (6 s waited), not counted as a retry", b)
	}
	b.gaveUp(at(14 * time.Second))
	if c := r.begin(1, 7, at(15*time.Second), false); !c.arrival.Equal(at(15 * time.Second)) {
		t.Fatalf("unmarked resend %+v, want a call of its own", c)
	} else {
		c.gaveUp(at(15 * time.Second)) // gave up without waiting
	}
	if d := r.begin(1, 7, at(40*time.Second), true); !d.arrival.Equal(at(40 * time.Second)) {
		t.Fatalf("a resend after giving up without waiting %+v, want no gain", d)
	} else {
		d.gaveUp(at(50 * time.Second))
	}
	if e := r.begin(1, 7, at(50*time.Second+31*time.Second), true); !e.arrival.Equal(at(81 * time.Second)) {
		t.Fatalf("past the window %+v, want a call of its own", e)
	}
	if f := r.begin(2, 7, at(90*time.Second), true); !f.arrival.Equal(at(90*time.Second)) || f.retry {
		t.Fatalf("a marked retry of a call never seen %+v, want nothing gained", f)
	}
}
