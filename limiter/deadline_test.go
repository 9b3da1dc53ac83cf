package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// queueTimeoutOf returns err as a *QueueTimeoutError, or fails.
func queueTimeoutOf(t *testing.T, err error) *limiter.QueueTimeoutError {
	t.Helper()
	var qe *limiter.QueueTimeoutError
	if !errors.As(err, &qe) {
		t.Fatalf("err %v, want a *QueueTimeoutError", err)
	}
	return qe
}

// A call queued with a deadline leaves the queue DeadlineMargin before it,
// with a queue error whose cause is the deadline, not the context's own
// error: its caller gets a typed answer before its timer fires.
func TestDeadlineEndsTheWaitBeforeIt(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx := limiter.WithDeadline(context.Background(), t0.Add(6*time.Second))
	h.queue(ctx, gw, "waiter", limiter.Bulk)
	h.clock.Advance(5499 * time.Millisecond)
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	h.clock.Advance(time.Millisecond)
	r := h.next()
	qe := queueTimeoutOf(t, r.err)
	if qe.Cause != limiter.CauseDeadline || qe.Waited != 5500*time.Millisecond || qe.Position != 1 || qe.RetryAfter < time.Second {
		t.Fatalf("got %+v, want cause deadline after 5.5 s at place 1 with a Retry-After", qe)
	}
	l := h.lane(gw)
	if l.Queued != 0 || l.QueueTimeouts5m != 0 || l.GaveUp5m == nil || l.GaveUp5m.Deadline.Bulk != 1 {
		t.Fatalf("snapshot %+v (gave up %+v), want the deadline counted apart from queue timeouts", l, l.GaveUp5m)
	}
	held.Release()
	h.expectCounts(gw, 0, 0)
}

// The context's own deadline is the call's deadline too, moved onto the
// limiter's clock as the call queues.
func TestContextDeadlineIsTheCallsDeadline(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	h.queue(ctx, gw, "waiter", limiter.Default)
	h.clock.Advance(99 * time.Second) // the real clock moves a little meanwhile
	h.expectCounts(gw, 1, 1)
	h.noneEnded()
	h.clock.Advance(time.Second)
	if qe := queueTimeoutOf(t, h.next().err); qe.Cause != limiter.CauseDeadline {
		t.Fatalf("cause %v, want deadline", qe.Cause)
	}
	held.Release()
}

// A deadline further than the queue timeout changes nothing.
func TestFarDeadlineKeepsTheQueueTimeout(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	h.queue(limiter.WithDeadline(context.Background(), t0.Add(time.Hour)), gw, "waiter", limiter.Default)
	h.clock.Advance(limiter.DefaultQueueTimeout)
	if qe := queueTimeoutOf(t, h.next().err); qe.Cause != limiter.CauseQueueTimeout {
		t.Fatalf("cause %v, want queue_timeout", qe.Cause)
	}
	if l := h.lane(gw); l.QueueTimeouts5m != 1 || l.GaveUp5m != nil {
		t.Fatalf("snapshot %+v, want one queue timeout and nothing given up", l)
	}
	held.Release()
}

// A deadline already within the margin is answered as the call queues; a
// call that can be granted at once is granted whatever its deadline.
func TestPassedDeadlineAnsweredAtOnce(t *testing.T) {
	h := newHarness(t, cfgN(2))
	held := h.take(gw, "holder", limiter.Default)
	granted, r := h.call(limiter.WithDeadline(context.Background(), t0.Add(100*time.Millisecond)), gw, "late", limiter.Default)
	if !granted {
		t.Fatalf("a call past its deadline was queued")
	}
	if qe := queueTimeoutOf(t, r.err); qe.Cause != limiter.CauseDeadline || qe.Waited != 0 {
		t.Fatalf("got %+v, want cause deadline, no wait", qe)
	}
	if l := h.lane(gw); l.GaveUp5m == nil || l.GaveUp5m.Deadline.Default != 1 || l.QueueTimeouts5m != 0 {
		t.Fatalf("snapshot %+v, gave up %+v: want one deadline", l, l.GaveUp5m)
	}
	// Interactive takes the reserved slot: granted, deadline or not.
	s := h.take(gw, "chat", limiter.Interactive)
	s.Release()
	held.Release()
}

// busyLane returns a harness whose lane of one slot has served calls of
// 10 s each for a minute, with a holder in place now: its estimate for a
// newcomer is about 10 s per call ahead of it.
func busyLane(t *testing.T, cfg limiter.Config) (*harness, *limiter.Slot) {
	h := newHarness(t, cfg)
	held := h.take(gw, "h0", limiter.Default)
	for i := range 6 {
		h.queue(context.Background(), gw, "q", limiter.Default)
		h.clock.Advance(10 * time.Second)
		held.Release()
		r := h.next()
		if r.err != nil {
			t.Fatalf("grant %d: %v", i, r.err)
		}
		held = &r.slot
	}
	return h, held
}

// AnswerEarly: a call whose estimated wait is longer than the time before
// its deadline is answered as it queues; one that fits waits; with
// WaitForDeadline both wait.
func TestAnswerEarlyOnTheEstimate(t *testing.T) {
	h, held := busyLane(t, cfgN(1))
	now := h.clock.Now()
	if l := h.lane(gw); l.ETA == nil || l.ETA.Default == nil || l.ETA.Default.Duration() < 5*time.Second {
		t.Fatalf("eta %+v, want an estimate of several seconds", l.ETA)
	}
	granted, r := h.call(limiter.WithDeadline(context.Background(), now.Add(3*time.Second)), gw, "short", limiter.Default)
	if !granted {
		t.Fatalf("a call that cannot be served before its deadline was queued")
	}
	qe := queueTimeoutOf(t, r.err)
	if qe.Cause != limiter.CauseEstimate || qe.Waited != 0 || qe.RetryAfter < 5*time.Second {
		t.Fatalf("got %+v, want cause estimate at once, Retry-After the estimate", qe)
	}
	h.queue(limiter.WithDeadline(context.Background(), now.Add(time.Minute)), gw, "long", limiter.Default)
	held.Release()
	if r := h.next(); r.id != "long" || r.err != nil {
		t.Fatalf("%s ended with %v, want long granted", r.id, r.err)
	}

	cfg := cfgN(1)
	cfg.Deadline = limiter.WaitForDeadline
	h, held = busyLane(t, cfg)
	h.queue(limiter.WithDeadline(context.Background(), h.clock.Now().Add(3*time.Second)), gw, "short", limiter.Default)
	h.clock.Advance(2500 * time.Millisecond)
	if qe := queueTimeoutOf(t, h.next().err); qe.Cause != limiter.CauseDeadline {
		t.Fatalf("cause %v, want deadline", qe.Cause)
	}
	held.Release()
}

// A caller that leaves the queue is counted by class, as one that gave up.
func TestCallerGoneCounted(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx, cancel := context.WithCancel(context.Background())
	h.queue(ctx, gw, "gone", limiter.Interactive)
	cancel()
	h.next()
	if l := h.lane(gw); l.GaveUp5m == nil || l.GaveUp5m.CallerGone.Interactive != 1 {
		t.Fatalf("gave up %+v, want one interactive caller gone", l.GaveUp5m)
	}
	held.Release()
}

func TestDeadlineSettingsChecked(t *testing.T) {
	cfg := cfgN(1)
	cfg.DeadlineMargin = -time.Second
	if err := cfg.Validate(); err == nil {
		t.Fatal("a negative deadline margin passed")
	}
	cfg.DeadlineMargin, cfg.Deadline = 0, 7
	if err := cfg.Validate(); err == nil {
		t.Fatal("an unknown deadline policy passed")
	}
	for in, want := range map[string]limiter.DeadlinePolicy{"Answer_Early": limiter.AnswerEarly, "wait": limiter.WaitForDeadline} {
		if got, ok := limiter.ParseDeadlinePolicy(in); !ok || got != want {
			t.Errorf("ParseDeadlinePolicy(%q) = %v %v", in, got, ok)
		}
	}
	if _, ok := limiter.ParseDeadlinePolicy("soon"); ok {
		t.Error("ParseDeadlinePolicy accepted soon")
	}
}
