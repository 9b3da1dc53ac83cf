package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Queue timeouts take one timer per lane, not one per waiter: 100 calls
// waiting schedule no more timers than one does, and once they have all
// timed out the lane schedules none.
func TestOneTimerPerLane(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 1, QueueTimeout: 5 * time.Minute})
	held := h.take(gw, "holder", limiter.Default)
	ctx := context.Background()
	h.queue(ctx, gw, "w0", limiter.Default)
	one := h.clock.Pending()
	for i := 1; i < 100; i++ {
		h.queue(ctx, gw, fmt.Sprint("w", i), limiter.Bulk)
	}
	if n := h.clock.Pending(); n != one {
		t.Fatalf("%d timers with 100 waiting, %d with one", n, one)
	}
	h.clock.Advance(5 * time.Minute)
	for range 100 {
		if r := h.next(); !errors.Is(r.err, limiter.ErrQueueTimeout) {
			t.Fatalf("%s: %v, want a queue timeout", r.id, r.err)
		}
	}
	if n := h.clock.Pending(); n >= one {
		t.Fatalf("%d timers with no one waiting, %d with one", n, one)
	}
	held.Release()
}

// A waiter that leaves before its deadline does not end the next one's
// early or late: the timer armed for it fires, ends nothing, and waits for
// the next deadline.
func TestTimerOutlivesItsWaiter(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 1, QueueTimeout: 5 * time.Minute})
	held := h.take(gw, "holder", limiter.Default)
	ctx := context.Background()
	h.queue(ctx, gw, "a", limiter.Default) // deadline 5 min
	h.clock.Advance(2 * time.Minute)
	h.queue(ctx, gw, "b", limiter.Default) // deadline 7 min
	held.Release()
	a := h.expectGrant("a")
	h.clock.Advance(5*time.Minute - time.Millisecond) // past a's deadline, 1 ms before b's
	h.noneEnded()
	h.clock.Advance(time.Millisecond)
	if r := h.next(); r.id != "b" || !errors.Is(r.err, limiter.ErrQueueTimeout) {
		t.Fatalf("%s: %v, want b's queue timeout at 7 min", r.id, r.err)
	}
	a.Release()
}

// A reload that shortens the queue timeout: calls queued after it time out
// by the new timeout even while calls queued before wait under the old
// one (deadlines are then out of enqueue order).
func TestQueueTimeoutShortenedByReload(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 1, QueueTimeout: 10 * time.Minute})
	held := h.take(gw, "holder", limiter.Default)
	ctx := context.Background()
	h.queue(ctx, gw, "old", limiter.Default) // deadline 10 min
	if err := h.lim.SetConfig(limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	h.queue(ctx, gw, "new", limiter.Default) // deadline 1 min
	h.clock.Advance(time.Minute)
	if r := h.next(); r.id != "new" || !errors.Is(r.err, limiter.ErrQueueTimeout) {
		t.Fatalf("%s: %v, want new's queue timeout at 1 min", r.id, r.err)
	}
	h.clock.Advance(9*time.Minute - time.Millisecond)
	h.noneEnded()
	h.clock.Advance(time.Millisecond)
	if r := h.next(); r.id != "old" || !errors.Is(r.err, limiter.ErrQueueTimeout) {
		t.Fatalf("%s: %v, want old's queue timeout at 10 min", r.id, r.err)
	}
	held.Release()
}
