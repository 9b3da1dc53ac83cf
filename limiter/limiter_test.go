package limiter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/limiter"
)

func TestMain(m *testing.M) {
	// About 30,000 random operations by default (1,000 cases of ~30 steps);
	// -rapid.checks on the command line still wins.
	flag.Parse()
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("1000")
	}
	leaktest.VerifyTestMain(m)
}

const gw = "https://gw/v1|protolabs/smart"

// 1. MaxInflight 0 is a pass-through.
func TestOffIsPassThrough(t *testing.T) {
	h := newHarness(t, limiter.DefaultConfig())
	for i := 0; i < 100; i++ {
		s, err := h.lim.Acquire(context.Background(), gw)
		if err != nil || s.Lane() != "" {
			t.Fatalf("Acquire off: slot lane %q err %v", s.Lane(), err)
		}
		s.Release()
	}
	snap := h.lim.Snapshot()
	if snap.Enabled || len(snap.Lanes) != 0 {
		t.Fatalf("snapshot off = %+v, want disabled and no lanes", snap)
	}
	b, _ := json.Marshal(snap)
	if string(b) != `{"enabled":false}` {
		t.Fatalf("off JSON = %s", b)
	}
	// Turning it on afterwards shows that the calls made while off created
	// no lane.
	if err := h.lim.SetConfig(cfgN(2)); err != nil {
		t.Fatal(err)
	}
	if n := len(h.lim.Snapshot().Lanes); n != 0 {
		t.Fatalf("%d lanes after calls made while off, want 0", n)
	}
	ctx := context.Background()
	_ = h.lim.SetConfig(limiter.DefaultConfig())
	if a := testing.AllocsPerRun(1000, func() {
		s, _ := h.lim.Acquire(ctx, gw)
		s.Release()
	}); a != 0 {
		t.Fatalf("off path allocates %v per call, want 0", a)
	}
}

func TestEnabledFastPathDoesNotAllocate(t *testing.T) {
	h := newHarness(t, cfgN(4))
	ctx := limiter.WithPriority(context.Background(), limiter.Bulk)
	if a := testing.AllocsPerRun(1000, func() {
		s, _ := h.lim.Acquire(ctx, gw)
		s.Release()
	}); a != 0 {
		t.Fatalf("uncontended path allocates %v per call, want 0", a)
	}
}

// 2. With one slot, a second caller waits and gets the slot on release.
func TestSecondCallerWaitsForRelease(t *testing.T) {
	h := newHarness(t, cfgN(1))
	a := h.take(gw, "a", limiter.Default)
	h.queue(context.Background(), gw, "b", limiter.Default)
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	a.Release()
	b := h.expectGrant("b")
	h.expectCounts(gw, 1, 0)
	b.Release()
	h.expectCounts(gw, 0, 0)
}

// 3. Class order, then FIFO within a class.
func TestServedByClassThenFIFO(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx := context.Background()
	h.queue(ctx, gw, "bulk1", limiter.Bulk)
	h.queue(ctx, gw, "default1", limiter.Default)
	h.queue(ctx, gw, "bulk2", limiter.Bulk)
	h.queue(ctx, gw, "default2", limiter.Default)
	h.queue(ctx, gw, "interactive1", limiter.Interactive)
	if q := h.lane(gw).QueuedByPriority; q != (limiter.QueuedByPriority{Interactive: 1, Default: 2, Bulk: 2}) {
		t.Fatalf("queued_by_priority = %+v", q)
	}
	for _, id := range []string{"interactive1", "default1", "default2", "bulk1", "bulk2"} {
		held.Release()
		held = h.expectGrant(id)
	}
	held.Release()
	h.expectCounts(gw, 0, 0)
}

// 4. Aging: one class step per 60 s waited, from the logical arrival.
func TestAging(t *testing.T) {
	for _, tc := range []struct {
		at     time.Duration
		winner string
	}{{59 * time.Second, "default"}, {60 * time.Second, "bulk"}} {
		t.Run(tc.at.String(), func(t *testing.T) {
			h := newHarness(t, cfgN(1))
			held := h.take(gw, "holder", limiter.Default)
			ctx := context.Background()
			h.queue(ctx, gw, "bulk", limiter.Bulk)
			h.clock.Advance(tc.at)
			h.queue(ctx, gw, "default", limiter.Default)
			held.Release()
			s := h.expectGrant(tc.winner)
			s.Release()
			r := h.next()
			r.slot.Release()
		})
	}
}

func TestArrivalInThePastAges(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	h.queue(context.Background(), gw, "interactive", limiter.Interactive)
	// A bulk retry whose logical call began 130 s ago ranks as interactive
	// and, having arrived earlier, goes first.
	retry := limiter.WithArrival(context.Background(), h.clock.Now().Add(-130*time.Second))
	h.queue(retry, gw, "bulk-retry", limiter.Bulk)
	held.Release()
	s := h.expectGrant("bulk-retry")
	s.Release()
	s = h.expectGrant("interactive")
	s.Release()
}

func TestArrivalOrdersWithinClass(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	h.queue(context.Background(), gw, "fresh", limiter.Default)
	h.queue(limiter.WithArrival(context.Background(), h.clock.Now().Add(-10*time.Second)), gw, "reconnect", limiter.Default)
	held.Release()
	s := h.expectGrant("reconnect")
	s.Release()
	s = h.expectGrant("fresh")
	s.Release()
}

// 5. Reserve: counted against non-interactive holders (docs/DESIGN.md, "Semantics of a lane").
// Calls whose own class is not interactive may hold MaxInflight minus the
// reserve slots at once; interactive calls may take any free slot.

// Limit 2, reserve 1, one interactive call in flight: a bulk call still
// gets the other slot at once ("non-interactive work always has at least
// one slot").
func TestReserveLeavesBulkASlotBesideInteractive(t *testing.T) {
	h := newHarness(t, cfgN(2)) // reserve 1
	i := h.take(gw, "interactive", limiter.Interactive)
	b := h.take(gw, "bulk", limiter.Bulk)
	h.expectCounts(gw, 2, 0)
	// Both slots are held; a second bulk call waits.
	h.queue(context.Background(), gw, "bulk2", limiter.Bulk)
	b.Release()
	b2 := h.expectGrant("bulk2")
	i.Release()
	b2.Release()
	h.expectCounts(gw, 0, 0)
}

// Limit 3, reserve 1, two bulk calls in flight: a third bulk call waits,
// while an interactive call is granted at once.
func TestReserveHoldsBackThirdBulk(t *testing.T) {
	h := newHarness(t, cfgN(3)) // reserve 1
	b1 := h.take(gw, "bulk1", limiter.Bulk)
	b2 := h.take(gw, "bulk2", limiter.Bulk)
	h.queue(context.Background(), gw, "bulk3", limiter.Bulk)
	h.expectCounts(gw, 2, 1)
	i := h.take(gw, "interactive", limiter.Interactive) // the queued bulk call may not take it
	h.expectCounts(gw, 3, 1)
	// The interactive call leaving frees a slot, but not one bulk may hold:
	// two bulk calls still do.
	i.Release()
	h.expectCounts(gw, 2, 1)
	h.noneEnded()
	b1.Release()
	b3 := h.expectGrant("bulk3")
	b2.Release()
	b3.Release()
	h.expectCounts(gw, 0, 0)
}

// The cap is on holders, not on free slots: interactive calls in flight do
// not shrink what non-interactive work may hold.
func TestReserveCountsNonInteractiveHolders(t *testing.T) {
	h := newHarness(t, cfgN(4)) // reserve 1: others may hold 3
	i1 := h.take(gw, "i1", limiter.Interactive)
	i2 := h.take(gw, "i2", limiter.Interactive)
	d := h.take(gw, "default", limiter.Default)
	b := h.take(gw, "bulk", limiter.Bulk) // the last slot: 2 of 3 for others, none free
	h.expectCounts(gw, 4, 0)
	h.queue(context.Background(), gw, "bulk2", limiter.Bulk)
	h.queue(context.Background(), gw, "interactive3", limiter.Interactive)
	i1.Release() // served by class: the interactive waiter first
	i3 := h.expectGrant("interactive3")
	i2.Release() // 2 non-interactive holders of 3: bulk2 may take it
	b2 := h.expectGrant("bulk2")
	for _, s := range []*limiter.Slot{i3, d, b, b2} {
		s.Release()
	}
	h.expectCounts(gw, 0, 0)
}

// A reserved slot goes to an interactive waiter ahead of older work that
// has reached the cap.
func TestReserveGoesToInteractive(t *testing.T) {
	h := newHarness(t, cfgN(2)) // reserve 1
	a := h.take(gw, "a", limiter.Default)
	b := h.take(gw, "b", limiter.Interactive)
	h.queue(context.Background(), gw, "bulk", limiter.Bulk)
	h.queue(context.Background(), gw, "interactive", limiter.Interactive)
	b.Release()
	// One slot free, and a default call holds the only non-interactive
	// one: the interactive call gets it although the bulk call came first.
	i := h.expectGrant("interactive")
	h.expectCounts(gw, 2, 1)
	i.Release()
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	a.Release()
	bulk := h.expectGrant("bulk")
	bulk.Release()
}

func TestReserveLeavesNonInteractiveOneSlot(t *testing.T) {
	h := newHarness(t, cfgN(2))
	a := h.take(gw, "a", limiter.Bulk)
	h.queue(context.Background(), gw, "default", limiter.Default)
	h.expectCounts(gw, 1, 1)
	i := h.take(gw, "interactive", limiter.Interactive) // the queued default call may not take it
	i.Release()
	h.expectCounts(gw, 1, 1)
	a.Release()
	s := h.expectGrant("default")
	s.Release()
}

func TestReserveClamp(t *testing.T) {
	for _, tc := range []struct{ limit, reserve, want int }{
		{2, 99, 1}, {1, 1, 0}, {1, 5, 0}, {0, 1, 0}, {6, 1, 1}, {6, 0, 0},
	} {
		c := limiter.Config{MaxInflight: tc.limit, InteractiveReserve: tc.reserve}
		if got := c.Reserve(); got != tc.want {
			t.Errorf("limit %d reserve %d: Reserve() = %d, want %d", tc.limit, tc.reserve, got, tc.want)
		}
	}
	// Limit 1 leaves no reserve: a bulk call takes the only slot.
	h := newHarness(t, limiter.Config{MaxInflight: 1, InteractiveReserve: 1})
	s := h.take(gw, "bulk", limiter.Bulk)
	if l := h.lane(gw); l.Reserve != 0 || l.Limit != 1 {
		t.Fatalf("snapshot limit %d reserve %d, want 1 and 0", l.Limit, l.Reserve)
	}
	s.Release()
	// Limit 2 with reserve 99 keeps one slot for others.
	h2 := newHarness(t, limiter.Config{MaxInflight: 2, InteractiveReserve: 99})
	s = h2.take(gw, "bulk", limiter.Bulk)
	s.Release()
	if l := h2.lane(gw); l.Reserve != 1 {
		t.Fatalf("snapshot reserve %d, want 1", l.Reserve)
	}
}

func TestAgingNeverOpensTheReserve(t *testing.T) {
	h := newHarness(t, cfgN(2))
	a := h.take(gw, "a", limiter.Default)
	h.queue(context.Background(), gw, "bulk", limiter.Bulk)
	h.clock.Advance(200 * time.Second) // bulk now ranks as interactive
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	i := h.take(gw, "interactive", limiter.Interactive)
	i.Release()
	h.expectCounts(gw, 1, 1)
	a.Release()
	s := h.expectGrant("bulk")
	s.Release()
}

// 6. Queue timeout.
func TestQueueTimeout(t *testing.T) {
	// 30 s: short enough that no waiter has aged, so classes still differ.
	h := newHarness(t, limiter.Config{MaxInflight: 1, QueueTimeout: 30 * time.Second})
	held := h.take(gw, "holder", limiter.Default)
	ctx := context.Background()
	h.queue(ctx, gw, "bulk", limiter.Bulk)
	h.queue(ctx, gw, "default", limiter.Default)
	h.queue(ctx, gw, "interactive", limiter.Interactive)
	h.clock.Advance(30*time.Second - time.Millisecond)
	h.expectCounts(gw, 1, 3)
	h.noneEnded()
	h.clock.Advance(time.Millisecond)
	// All three time out together, in the order they queued; each reports
	// its place in the serving order at that moment: bulk behind the two
	// others, default behind interactive, interactive first.
	want := map[string][2]int{"bulk": {3, 3}, "default": {2, 2}, "interactive": {1, 1}}
	for range 3 {
		r := h.next()
		if !errors.Is(r.err, limiter.ErrQueueTimeout) {
			t.Fatalf("%s: err %v, want ErrQueueTimeout", r.id, r.err)
		}
		var qe *limiter.QueueTimeoutError
		if !errors.As(r.err, &qe) {
			t.Fatalf("%s: err %T, want *QueueTimeoutError", r.id, r.err)
		}
		if qe.Lane != gw || [2]int{qe.Position, qe.Queued} != want[r.id] || qe.Waited != 30*time.Second ||
			qe.Limit != 1 || qe.QueueTimeout != 30*time.Second || qe.Priority.String() != r.id {
			t.Fatalf("%s: %+v", r.id, qe)
		}
		msg := r.err.Error()
		for _, s := range []string{`"` + gw + `"`, "waiting 30s", "position", "max_inflight (now 1)", "queue_timeout (now 30s)", "priority " + r.id} {
			if !strings.Contains(msg, s) {
				t.Fatalf("message %q lacks %q", msg, s)
			}
		}
	}
	l := h.lane(gw)
	if l.Queued != 0 || l.Inflight != 1 || l.QueueTimeouts5m != 3 {
		t.Fatalf("after timeouts: %+v", l)
	}
	held.Release()
	h.expectCounts(gw, 0, 0)
}

// 7. Cancellation and races.
func TestCanceledWaiterLeavesNothing(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	timers := h.clock.Pending()
	ctx, cancel := context.WithCancel(context.Background())
	h.queue(ctx, gw, "canceled", limiter.Interactive)
	h.queue(context.Background(), gw, "next", limiter.Bulk)
	cancel()
	if r := h.next(); r.id != "canceled" || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("ended %s with %v, want canceled with context.Canceled", r.id, r.err)
	}
	h.expectCounts(gw, 1, 1)
	if l := h.lane(gw); l.QueuedByPriority.Interactive != 0 {
		t.Fatalf("interactive still counted: %+v", l.QueuedByPriority)
	}
	if got := h.clock.Pending(); got != timers+1 { // only "next"'s timeout timer is new
		t.Fatalf("pending timers %d, want %d", got, timers+1)
	}
	held.Release()
	s := h.expectGrant("next")
	s.Release()
	h.expectCounts(gw, 0, 0)
}

func TestCancelRacingGrantHandsSlotOn(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	h.queue(context.Background(), gw, "bulk", limiter.Bulk)
	ctx, cancel := context.WithCancel(context.Background())
	// When "racer" has joined the queue but not yet begun to wait, grant it
	// the slot and cancel it: both wake-ups are ready at once.
	race := func(ctx context.Context, e limiter.Event) {
		if e.Kind == limiter.Enqueued && ctx.Value(callID{}) == "racer" {
			held.Release()
			cancel()
		}
	}
	h.onEvent.Store(&race)
	h.queue(ctx, gw, "racer", limiter.Interactive)
	s := h.expectEnds(map[string]string{"racer": "context canceled", "bulk": "ok"})["bulk"]
	h.expectCounts(gw, 1, 0)
	s.Release()
	h.expectCounts(gw, 0, 0)
}

func TestDoneContextTakesNoSlot(t *testing.T) {
	h := newHarness(t, cfgN(1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.lim.Acquire(ctx, gw); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if n := len(h.lim.Snapshot().Lanes); n != 0 {
		t.Fatalf("%d lanes, want none", n)
	}
	s := h.take(gw, "after", limiter.Default)
	s.Release()
}

// Releasing a copy of a Slot after the original (or the other way round)
// frees the slot once: the lane never counts fewer holders than it has, and
// the freed place is not given away twice.
func TestCopiedSlotReleasedTwice(t *testing.T) {
	h := newHarness(t, cfgN(2))
	a := h.take(gw, "a", limiter.Bulk)
	b := h.take(gw, "b", limiter.Interactive)
	copyA := *a
	a.Release()
	copyA.Release()
	h.expectCounts(gw, 1, 0)
	// The hold behind a is reused for c; the stale copy must not free it.
	c := h.take(gw, "c", limiter.Bulk)
	copyA.Release()
	h.expectCounts(gw, 2, 0)
	h.queue(context.Background(), gw, "d", limiter.Interactive)
	copyC := *c
	c.Release()
	d := h.expectGrant("d")
	copyC.Release()
	h.expectCounts(gw, 2, 0)
	for _, s := range []*limiter.Slot{b, d} {
		s.Release()
	}
	h.expectCounts(gw, 0, 0)
}

func TestDoubleReleaseFreesOneSlot(t *testing.T) {
	h := newHarness(t, cfgN(2))
	a := h.take(gw, "a", limiter.Interactive)
	b := h.take(gw, "b", limiter.Interactive)
	a.Release()
	a.Release()
	h.expectCounts(gw, 1, 0)
	c := h.take(gw, "c", limiter.Interactive)
	h.queue(context.Background(), gw, "d", limiter.Interactive)
	h.expectCounts(gw, 2, 1)
	for _, s := range []*limiter.Slot{b, c} {
		s.Release()
	}
	d := h.expectGrant("d")
	d.Release()
	d.Release()
	h.expectCounts(gw, 0, 0)
}

// 8. Hot config.
func TestRaisingLimitAdmitsAtOnce(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	for _, id := range []string{"w1", "w2", "w3"} {
		h.queue(context.Background(), gw, id, limiter.Default)
	}
	if err := h.lim.SetConfig(limiter.Config{MaxInflight: 3}); err != nil {
		t.Fatal(err)
	}
	h.expectCounts(gw, 3, 1) // granted inside SetConfig
	got := h.expectEnds(map[string]string{"w1": "ok", "w2": "ok"})
	w1, w2 := got["w1"], got["w2"]
	if err := h.lim.SetConfig(limiter.DefaultConfig()); err != nil { // 0: off, admits all
		t.Fatal(err)
	}
	w3 := h.expectGrant("w3")
	for _, s := range []*limiter.Slot{held, w1, w2, w3} {
		s.Release()
	}
	_ = h.lim.SetConfig(cfgN(1))
	h.expectCounts(gw, 0, 0)
}

func TestLoweringLimitRevokesNothing(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 3})
	slots := []*limiter.Slot{h.take(gw, "a", limiter.Default), h.take(gw, "b", limiter.Default), h.take(gw, "c", limiter.Default)}
	if err := h.lim.SetConfig(limiter.Config{MaxInflight: 1}); err != nil {
		t.Fatal(err)
	}
	h.expectCounts(gw, 3, 0)
	h.queue(context.Background(), gw, "w", limiter.Interactive)
	slots[0].Release()
	slots[1].Release()
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	slots[2].Release()
	s := h.expectGrant("w")
	s.Release()
}

func TestBadConfigRefused(t *testing.T) {
	if _, err := limiter.New(limiter.Config{MaxInflight: -1, QueueTimeout: -time.Second, InteractiveReserve: -2}); err == nil {
		t.Fatal("New accepted negatives")
	} else {
		for _, s := range []string{"max_inflight is -1", "queue_timeout is -1s", "interactive_reserve is -2"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q lacks %q", err, s)
			}
		}
	}
	c := cfgN(2)
	h := newHarness(t, c)
	if err := h.lim.SetConfig(limiter.Config{MaxInflight: -3}); err == nil {
		t.Fatal("SetConfig accepted a negative limit")
	}
	if got := h.lim.Config(); got != c {
		t.Fatalf("config after refused SetConfig = %+v", got)
	}
}

func TestQueueTimeoutZeroMeansDefault(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 1})
	held := h.take(gw, "holder", limiter.Default)
	h.queue(context.Background(), gw, "w", limiter.Default)
	h.clock.Advance(limiter.DefaultQueueTimeout - time.Second)
	h.noneEnded()
	h.expectCounts(gw, 1, 1)
	h.clock.Advance(time.Second)
	if r := h.next(); !errors.Is(r.err, limiter.ErrQueueTimeout) {
		t.Fatalf("err %v", r.err)
	}
	held.Release()
}

// Observers may panic without harming the lane.
func TestPanickingObserver(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := newHarness(t, cfgN(1), limiter.WithLogger(log), limiter.WithObserver(func(context.Context, limiter.Event) { panic("boom") }))
	a := h.take(gw, "a", limiter.Default)
	h.queue(context.Background(), gw, "b", limiter.Default)
	a.Release()
	b := h.expectGrant("b")
	b.Release()
	h.expectCounts(gw, 0, 0)
	if !strings.Contains(logs.String(), "observer panicked") || !strings.Contains(logs.String(), "boom") {
		t.Fatalf("log = %q", logs.String())
	}
}

func TestEvents(t *testing.T) {
	var got []string
	events := make(chan limiter.Event, 64)
	h := newHarness(t, cfgN(1), limiter.WithObserver(func(_ context.Context, e limiter.Event) { events <- e }))
	a := h.take(gw, "a", limiter.Bulk)
	h.queue(context.Background(), gw, "b", limiter.Interactive)
	h.clock.Advance(7 * time.Second)
	a.Release()
	b := h.expectGrant("b")
	b.Release()
	close(events)
	var waited time.Duration
	for e := range events {
		if e.Lane != gw {
			t.Fatalf("event lane %q", e.Lane)
		}
		got = append(got, e.Kind.String()+"/"+e.Priority.String())
		if e.Kind == limiter.Acquired && e.Priority == limiter.Interactive {
			waited = e.Wait
		}
	}
	// Released and Acquired of different calls may come in either order.
	// Released carries the releasing call's own class.
	want := map[string]int{"acquired/bulk": 1, "enqueued/interactive": 1, "released/bulk": 1, "released/interactive": 1, "acquired/interactive": 1}
	for _, g := range got {
		want[g]--
	}
	for k, n := range want {
		if n != 0 {
			t.Fatalf("events %v: %s off by %d", got, k, -n)
		}
	}
	if waited != 7*time.Second {
		t.Fatalf("acquired wait %v, want 7s", waited)
	}
}

// A slow observer delays only the call it observes: the lane's lock is not
// held while observers run, so other calls take and give back slots.
func TestSlowObserverDoesNotStallLane(t *testing.T) {
	block, entered := make(chan struct{}), make(chan struct{})
	h := newHarness(t, cfgN(2))
	stuck := func(ctx context.Context, e limiter.Event) {
		if e.Kind == limiter.Acquired && ctx.Value(callID{}) == "slow" {
			close(entered)
			<-block
		}
	}
	h.onEvent.Store(&stuck)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.WithValue(context.Background(), callID{}, "slow")
		s, err := h.lim.Acquire(ctx, gw)
		if err == nil {
			s.Release()
		}
	}()
	<-entered // the slow call holds its slot, stuck in its observer
	h.expectCounts(gw, 1, 0)
	for i := range 50 { // the other slot keeps turning over
		s := h.take(gw, fmt.Sprintf("other%d", i), limiter.Interactive)
		s.Release()
	}
	h.expectCounts(gw, 1, 0)
	close(block)
	<-done
	h.expectCounts(gw, 0, 0)
}

// A queue timeout's whole wait is a wait sample: a lane whose every caller
// times out after 300 s reports p50 and p90 of 300 s, never a fast lane.
func TestTimedOutWaitsCountInPercentiles(t *testing.T) {
	h := newHarness(t, cfgN(1)) // queue timeout 300 s
	held := h.take(gw, "holder", limiter.Default)
	// The holder's immediate grant was 5 minutes ago by the time the
	// callers time out: it has left the window.
	h.clock.Advance(20 * time.Second)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		h.queue(context.Background(), gw, id, limiter.Bulk)
	}
	h.clock.Advance(300 * time.Second)
	h.expectEnds(map[string]string{"a": "no slot", "b": "no slot", "c": "no slot", "d": "no slot", "e": "no slot"})
	l := h.lane(gw)
	if l.WaitP50 == nil || l.WaitP90 == nil || *l.WaitP50 != 300 || *l.WaitP90 != 300 || l.QueueTimeouts5m != 5 {
		t.Fatalf("after five 300 s timeouts: p50 %v p90 %v timeouts %d, want 300.0, 300.0, 5", l.WaitP50, l.WaitP90, l.QueueTimeouts5m)
	}
	held.Release()
}

// A canceled wait is not a wait sample: its length was the caller's
// choice, not the lane's.
func TestCanceledWaitIsNotASample(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx, cancel := context.WithCancel(context.Background())
	h.queue(ctx, gw, "w", limiter.Default)
	h.clock.Advance(100 * time.Second)
	cancel()
	if r := h.next(); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("err %v", r.err)
	}
	if l := h.lane(gw); *l.WaitP90 != 0 || l.QueueTimeouts5m != 0 {
		t.Fatalf("after a canceled 100 s wait: p90 %v timeouts %d, want only the holder's 0", *l.WaitP90, l.QueueTimeouts5m)
	}
	held.Release()
}

// The estimated wait of a newcomer, by class, comes from the calls ahead of
// it and the lane's recent hold times, and a queue timeout suggests when to
// come back.
func TestETAAndRetryAfter(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 2, InteractiveReserve: 1, QueueTimeout: 30 * time.Second})
	b := h.take(gw, "bulk", limiter.Bulk)
	i := h.take(gw, "interactive", limiter.Interactive)
	ctx := context.Background()
	if e := h.lane(gw).ETA; e == nil || e.Interactive != nil || e.Default != nil || e.Bulk != nil {
		t.Fatalf("eta with no hold times known: %+v, want no estimates", e)
	}
	for range 3 { // calls hold their slot 10 s each
		h.lim.RecordExchange(ctx, gw, limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200, Duration: 10 * time.Second})
	}
	for _, c := range []struct {
		id string
		p  limiter.Priority
	}{{"bulk1", limiter.Bulk}, {"default1", limiter.Default}, {"bulk2", limiter.Bulk}} {
		h.queue(ctx, gw, c.id, c.p)
	}
	// Interactive: no one ranks ahead; 2 slots of 10 s serve 0.2 calls/s:
	// 5 s. Default: one call ahead; only 1 slot may serve it (the reserve):
	// (1+1) × 10 s = 20 s. Bulk: all 3 ahead: 40 s.
	e := h.lane(gw).ETA
	if e == nil || e.Interactive == nil || e.Default == nil || e.Bulk == nil ||
		*e.Interactive != 5 || *e.Default != 20 || *e.Bulk != 40 {
		t.Fatalf("eta %+v, want 5, 20 and 40 s", e)
	}
	h.clock.Advance(30 * time.Second)
	// Each times out in turn and is told what a new call of its class would
	// wait then: bulk1 leaves two calls ahead of a new bulk call, (2+1) ×
	// 10 s; default1 none ahead of a new default call (bulk2 ranks below
	// it), 10 s; bulk2 none, 10 s.
	retry := map[string]time.Duration{}
	for range 3 {
		r := h.next()
		var qe *limiter.QueueTimeoutError
		if !errors.As(r.err, &qe) {
			t.Fatalf("%s: %v", r.id, r.err)
		}
		retry[r.id] = qe.RetryAfter
		if !strings.Contains(qe.Error(), "a new call would wait about "+qe.RetryAfter.String()) {
			t.Fatalf("message %q lacks the estimate", qe.Error())
		}
	}
	if retry["bulk1"] != 30*time.Second || retry["default1"] != 10*time.Second || retry["bulk2"] != 10*time.Second {
		t.Fatalf("retry-after %v, want bulk1 30s, default1 10s, bulk2 10s", retry)
	}
	// With the queue empty and the slots held, a newcomer waits for one
	// slot only.
	if e := h.lane(gw).ETA; *e.Interactive != 5 || *e.Bulk != 10 {
		t.Fatalf("eta with an empty queue %+v, want 5 and 10 s", e)
	}
	i.Release()
	if e := h.lane(gw).ETA; *e.Interactive != 0 || *e.Bulk != 10 {
		t.Fatalf("eta with the reserved slot free %+v, want 0 for interactive, 10 s for bulk", e)
	}
	b.Release()
	if e := h.lane(gw).ETA; *e.Interactive != 0 || *e.Default != 0 || *e.Bulk != 0 {
		t.Fatalf("eta with an idle lane %+v, want 0", e)
	}
}
