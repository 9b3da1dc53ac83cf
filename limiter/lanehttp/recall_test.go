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

	a := r.begin(1, t0)
	if !a.arrival.Equal(t0) || a.retry || !a.tracked {
		t.Fatalf("first attempt %+v", a)
	}
	// The same request while the first is in progress: a call of its own.
	if d := r.begin(1, at(time.Second)); !d.arrival.Equal(at(time.Second)) || d.retry || d.tracked {
		t.Fatalf("side-by-side duplicate %+v", d)
	}
	a.end(at(10*time.Second), false)
	// A retry within the window keeps the first arrival.
	b := r.begin(1, at(70*time.Second))
	if !b.arrival.Equal(t0) || !b.retry {
		t.Fatalf("retry %+v", b)
	}
	b.end(at(80*time.Second), true) // it succeeded: forgotten
	if c := r.begin(1, at(90*time.Second)); c.retry || !c.arrival.Equal(at(90*time.Second)) {
		t.Fatalf("after success %+v", c)
	} else {
		c.end(at(100*time.Second), false)
	}
	// Past the window after its last attempt, a call starts over.
	if e := r.begin(1, at(100*time.Second+2*time.Minute+time.Nanosecond)); e.retry {
		t.Fatalf("after the window %+v", e)
	} else {
		e.end(at(4*time.Minute), false)
	}
	// A chain of attempts older than maxCallAge starts over, however
	// recent its last attempt.
	r2 := newRecall(2 * time.Minute)
	now := t0
	x := r2.begin(2, now)
	for now.Sub(t0) <= maxCallAge {
		now = now.Add(time.Minute)
		x.end(now, false)
		now = now.Add(time.Minute)
		x = r2.begin(2, now)
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
		r.begin(k, t0).end(t0.Add(time.Duration(k)), false)
	}
	r.begin(maxRecalled, t0.Add(time.Second)) // evicts key 0, the longest idle
	if r.len() != maxRecalled {
		t.Fatalf("%d remembered, bound %d", r.len(), maxRecalled)
	}
	if a := r.begin(0, t0.Add(2*time.Second)); a.retry { // and evicts key 1
		t.Fatal("the evicted call was still recalled")
	}
	if a := r.begin(maxRecalled-1, t0.Add(2*time.Second)); !a.retry {
		t.Fatal("a call that was not evicted was forgotten")
	}
	full := newRecall(time.Hour)
	for k := uint64(0); k < maxRecalled; k++ {
		full.begin(k, t0) // all in progress
	}
	if a := full.begin(maxRecalled, t0); a.tracked || full.len() != maxRecalled {
		t.Fatalf("new call when all are in progress: %+v, %d remembered", a, full.len())
	}
}
