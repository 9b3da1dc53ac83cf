package limitertest_test

import (
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

func TestAdvanceFiresDueTimersInOrder(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := limitertest.NewClock(start)
	var got []string
	at := func(name string) func() {
		return func() { got = append(got, name+"@"+c.Now().Sub(start).String()) }
	}
	c.AfterFunc(3*time.Second, at("c"))
	c.AfterFunc(time.Second, at("a"))
	c.AfterFunc(time.Second, at("b")) // same due time: scheduling order
	stopped := c.AfterFunc(2*time.Second, at("stopped"))
	c.AfterFunc(10*time.Second, at("late"))
	c.AfterFunc(0, func() {
		got = append(got, "now@"+c.Now().Sub(start).String())
		// Scheduled by a timer and due within the same Advance: runs too.
		c.AfterFunc(time.Second, at("chained"))
	})
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	if c.Pending() != 5 {
		t.Fatalf("pending %d, want 5", c.Pending())
	}
	c.Advance(3 * time.Second)
	want := []string{"now@0s", "a@1s", "b@1s", "chained@1s", "c@3s"}
	if len(got) != len(want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("fired %v, want %v", got, want)
		}
	}
	if !c.Now().Equal(start.Add(3*time.Second)) || c.Pending() != 1 {
		t.Fatalf("now %v pending %d", c.Now(), c.Pending())
	}
	c.Advance(7 * time.Second)
	if got[len(got)-1] != "late@10s" || c.Pending() != 0 {
		t.Fatalf("fired %v pending %d", got, c.Pending())
	}
}

func TestNextDue(t *testing.T) {
	c := limitertest.NewClock(time.Unix(0, 0))
	if _, ok := c.NextDue(); ok {
		t.Fatal("a due time with no timer")
	}
	c.AfterFunc(5*time.Second, func() {})
	t2 := c.AfterFunc(2*time.Second, func() {})
	if at, ok := c.NextDue(); !ok || !at.Equal(time.Unix(2, 0)) {
		t.Fatalf("next due %v %v, want 2 s", at, ok)
	}
	t2.Stop()
	if at, _ := c.NextDue(); !at.Equal(time.Unix(5, 0)) {
		t.Fatalf("after a stop: %v", at)
	}
}
