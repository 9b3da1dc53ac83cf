package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A grant that races a cancellation leaves its wake-up in the waiter's
// channel, and the canceled call must take it before the waiter is reused:
// otherwise the next call to wait on that waiter would wake at once,
// without a slot (putWaiter panics on it). The grant is made while the
// lane's lock is held across the cancellation, so the waiting call finds
// itself granted when it gets the lock: every round takes that path when
// the call was parked before the cancellation (nearly always), and half of
// them otherwise.
func TestGrantRacingCancelLeavesWaiterClean(t *testing.T) {
	lim, err := New(Config{MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	const key = "https://gw/v1|m"
	ctx := context.Background()
	held, err := lim.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := lim.lanes.Load(key)
	ln := v.(*lane)
	for range 64 {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			s, err := lim.Acquire(cctx, key)
			s.Release()
			done <- err
		}()
		waitQueued(t, ln, 1)
		ln.mu.Lock()
		cancel()
		ln.releaseLocked(held.h) // grants the slot to the canceled call
		ln.mu.Unlock()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("the canceled call returned %v, want context.Canceled", err)
		}
		// It handed the slot on: the lane is free again.
		if held, err = lim.Acquire(ctx, key); err != nil {
			t.Fatalf("after the raced grant: %v", err)
		}
	}
	// A call that waits now must still wait for a slot.
	got := make(chan error, 1)
	go func() {
		s, err := lim.Acquire(ctx, key)
		s.Release()
		got <- err
	}()
	waitQueued(t, ln, 1)
	held.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func waitQueued(t *testing.T, ln *lane, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		ln.mu.Lock()
		q := ln.q.n
		ln.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want %d", q, n)
		}
	}
}
