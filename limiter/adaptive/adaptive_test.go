package adaptive_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/adaptive"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

const akey = "https://gw/v1|m"

// adaptiveLane is a limiter with an adaptive lane on a fake clock, and
// helpers to feed it samples.
type adaptiveLane struct {
	t     *testing.T
	lim   *limiter.Limiter
	clock *limitertest.Clock
	held  []limiter.Slot
}

func newAdaptive(t *testing.T, min, max, initial int) *adaptiveLane {
	c := limitertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	lim, err := limiter.New(limiter.Config{MaxInflight: max, QueueTimeout: time.Hour,
		Adaptive: &limiter.Adaptive{MinInflight: min, Initial: initial}}, limiter.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	a := &adaptiveLane{t: t, lim: lim, clock: c}
	a.hold(1) // the lane exists once it has had a call
	return a
}

func (a *adaptiveLane) limit() int { return a.lim.Snapshot().Lanes[0].Limit }

func (a *adaptiveLane) state() *limiter.AdaptiveState { return a.lim.Snapshot().Lanes[0].Adaptive }

// atOnce bounds, in real time, an acquisition that must not wait. In these
// tests nothing releases a slot while a call waits, so a call that is not
// granted at once is never granted: the bound only keeps a failing test
// from hanging, and a loaded machine cannot make a grant look like a wait.
// notGranted is how long a call that must not be granted is given: a short
// wait, for the same reason.
const (
	atOnce     = 10 * time.Second
	notGranted = 50 * time.Millisecond
)

// hold takes n slots at once; it fails if one is not granted at once.
func (a *adaptiveLane) hold(n int) {
	a.t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), atOnce)
		s, err := a.lim.Acquire(ctx, akey)
		cancel()
		if err != nil {
			a.t.Fatalf("no slot at once: %v (limit %d, held %d)", err, a.limit(), len(a.held))
		}
		a.held = append(a.held, s)
	}
}

func (a *adaptiveLane) releaseAll() {
	for i := range a.held {
		a.held[i].Release()
	}
	a.held = nil
}

// sample reports a first byte after ttfb, of a call sent now, of size bytes.
func (a *adaptiveLane) sample(ttfb time.Duration, bytes int) {
	sent := a.clock.Now()
	a.clock.Advance(ttfb)
	a.lim.RecordFirstByte(context.Background(), akey, limiter.FirstByte{Sent: sent, After: ttfb, RequestBytes: bytes})
}

// goodRounds fills the lane n times, two no-load first bytes each time:
// n additive increases, where nothing holds them back.
func (a *adaptiveLane) goodRounds(n int) {
	for range n {
		a.fill()
		a.sample(2*time.Second, 1000)
		a.sample(2*time.Second, 1000)
	}
}

// fill holds every slot, so the lane counts as using them.
func (a *adaptiveLane) fill() {
	a.releaseAll()
	a.hold(a.limit())
}

// The probe: a new lane admits MinInflight calls until three no-load first
// bytes have come, then starts at Initial.
func TestAdaptiveProbe(t *testing.T) {
	a := newAdaptive(t, 1, 12, 12)
	if a.limit() != 1 || !a.state().Probing {
		t.Fatalf("limit %d during the probe, state %+v", a.limit(), a.state())
	}
	for range 3 {
		a.sample(2*time.Second, 1000)
	}
	if a.limit() != 12 || a.state().Probing || a.state().BaselineTTFB == nil || *a.state().BaselineTTFB != 2 {
		t.Fatalf("after the probe: limit %d, %+v", a.limit(), a.state())
	}
}

// First bytes past the baseline cut the limit to limit/ratio; samples of
// calls sent before the change do not count again.
func TestAdaptiveLatencyCuts(t *testing.T) {
	a := newAdaptive(t, 1, 12, 12)
	for range 3 {
		a.sample(2*time.Second, 1000)
	}
	a.fill()
	a.sample(2400*time.Millisecond, 1000) // ratio 1.2: one such sample does not cut
	if a.limit() != 12 {
		t.Fatalf("one first byte 1.2 times the baseline cut to %d", a.limit())
	}
	a.sample(2400*time.Millisecond, 1000)
	// Two, sent into a load of 12: cut to 12 / (1 + 2 × 0.2) = 8.
	if a.limit() != 8 || a.state().LastChange != "latency: first bytes past the no-load baseline" {
		t.Fatalf("limit %d (%s), want 12 / (1 + 2 × 0.2) = 8", a.limit(), a.state().LastChange)
	}
	// A first byte Severe times the baseline cuts on its own: sent into
	// a load of 8 (12 held, the limit 8), ratio 1.5: to 8 / 2 = 4.
	stale := a.clock.Now()
	a.sample(3*time.Second, 1000)
	if a.limit() != 4 || a.state().LastChange != "latency: a first byte far past the no-load baseline" {
		t.Fatalf("limit %d (%s), want 8 / (1 + 2 × 0.5) = 4", a.limit(), a.state().LastChange)
	}
	// A sample of a call sent before the cut is stale.
	a.lim.RecordFirstByte(context.Background(), akey, limiter.FirstByte{Sent: stale, After: 6 * time.Second, RequestBytes: 1000})
	a.lim.RecordFirstByte(context.Background(), akey, limiter.FirstByte{Sent: stale, After: 6 * time.Second, RequestBytes: 1000})
	if a.limit() != 4 {
		t.Fatalf("stale samples moved the limit to %d", a.limit())
	}
	// A held slot is never revoked: 12 stay held under a limit of 4.
	if s := a.lim.Snapshot().Lanes[0]; s.Inflight != 12 {
		t.Fatalf("in flight %d", s.Inflight)
	}
}

// Good samples while every slot is used: slow start doubles; after a cut,
// one slot per good fresh sample; a lane that does not use its slots does
// not grow.
func TestAdaptiveGrowth(t *testing.T) {
	a := newAdaptive(t, 2, 16, 2)
	for range 3 {
		a.sample(2*time.Second, 1000)
	}
	a.releaseAll()
	for range 4 { // not using its slots
		a.sample(2*time.Second, 1000)
	}
	if a.limit() != 2 {
		t.Fatalf("an idle lane grew to %d", a.limit())
	}
	a.fill()
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	if a.limit() != 4 || a.state().LastChange != "slow start" {
		t.Fatalf("slow start: %d (%s)", a.limit(), a.state().LastChange)
	}
	a.fill()
	a.sample(2200*time.Millisecond, 1000) // ratio 1.1 at a load of 4: a cut ends slow start
	a.sample(2200*time.Millisecond, 1000)
	if a.limit() != 3 {
		t.Fatalf("after the cut: %d, want 4 / 1.2 = 3", a.limit())
	}
	// For LatencyHold, no increase past 3 (one below the 4 that was too
	// many).
	for range 4 {
		a.fill()
		a.sample(2*time.Second, 1000)
	}
	if a.limit() != 3 {
		t.Fatalf("grew during the latency hold: %d", a.limit())
	}
	a.clock.Advance(adaptive.LatencyHold)
	// Additive increase: Window good first bytes of calls sent since the
	// last change, with every slot in use, add one slot.
	a.fill()
	a.sample(2*time.Second, 1000)
	if a.limit() != 3 {
		t.Fatalf("grew after one good sample: %d", a.limit())
	}
	a.sample(2*time.Second, 1000)
	if a.limit() != 4 {
		t.Fatalf("additive increase: %d, want 4", a.limit())
	}
	a.fill()
	a.sample(2300*time.Millisecond, 1000) // one slow first byte among good ones does not cut
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	if a.limit() != 5 {
		t.Fatalf("after one slow and two good samples: %d, want 5", a.limit())
	}
}

// A loss cuts the limit by LossFactor and holds increases one slot below
// the limit that saw it for HoldOff; Retry-After holds longer.
func TestAdaptiveLoss(t *testing.T) {
	a := newAdaptive(t, 1, 16, 8)
	for range 3 {
		a.sample(2*time.Second, 1000)
	}
	a.fill()
	sent := a.clock.Now()
	a.clock.Advance(time.Second)
	a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeRateLimited, Status: 429, Sent: sent})
	if a.limit() != 6 || a.state().LastChange != "loss: rate_limited" || !a.state().CutByLoss {
		t.Fatalf("after a 429: %d, %+v", a.limit(), a.state())
	}
	// Another loss of a call sent before the cut does not cut again.
	a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 503, Sent: sent})
	if a.limit() != 6 {
		t.Fatalf("a stale loss cut to %d", a.limit())
	}
	grow := func(samples int) {
		for range samples {
			a.fill()
			a.sample(2*time.Second, 1000)
		}
	}
	grow(10)
	if a.limit() != 7 {
		t.Fatalf("during the hold: %d, want 7 (one below the 8 that saw the loss)", a.limit())
	}
	a.clock.Advance(adaptive.HoldOff)
	grow(3) // the baseline aged out with the 5 minutes: the first sample sets it again
	if a.limit() != 8 {
		t.Fatalf("after the hold: %d, want 8", a.limit())
	}
	// The probe one past the hold fails (a 429 of a call sent into a load
	// of 8): back to the 7 that served without loss, not 8 × 0.75; a
	// Retry-After longer than the hold holds longer.
	a.fill()
	sent = a.clock.Now()
	a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeRateLimited, Status: 429, Sent: sent, RetryAfter: 20 * time.Minute})
	if a.limit() != 7 {
		t.Fatalf("a failed probe: %d, want back to 7", a.limit())
	}
	a.clock.Advance(adaptive.HoldOff + time.Minute)
	grow(10)
	if a.limit() != 7 {
		t.Fatalf("Retry-After 20 min: %d after 6 min, want held at 7", a.limit())
	}
	// ...but for at most twice the hold-off: a gateway's Retry-After
	// cannot pin the limit for its 20 minutes.
	a.clock.Advance(4*time.Minute + time.Second)
	grow(10)
	if a.limit() <= 7 {
		t.Fatalf("Retry-After 20 min: %d after 10 min, want grown past 7 (the hold is at most 2 × HoldOff)", a.limit())
	}
	// A loss holds one slot below the load the lost call was sent into,
	// not below the limit: 4 in flight under a limit of 7, a 429: held
	// at 3.
	a.clock.Advance(20 * time.Minute)
	a.releaseAll()
	a.hold(4)
	sent = a.clock.Now()
	a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeRateLimited, Status: 429, Sent: sent})
	if a.limit() != 3 {
		t.Fatalf("a 429 at a load of 4: %d, want 3", a.limit())
	}
}

// The prompt's size alone does not move the limit: first bytes that take
// longer for longer prompts, at no load, are compared with the baseline of
// their size.
func TestAdaptivePromptSize(t *testing.T) {
	a := newAdaptive(t, 4, 16, 6)
	ttfb := func(kb int) time.Duration { return time.Second + time.Duration(kb)*50*time.Millisecond }
	// Sizes from 1 to 63 KiB, most of them within one octave of each
	// other: their no-load first bytes differ by up to 4x, and by up to
	// 40 % within the octave.
	sizes := []int{33, 1, 39, 45, 51, 3, 57, 63, 36, 8, 42, 48, 54, 60, 16, 35}
	for _, kb := range sizes[:3] {
		a.sample(ttfb(kb), kb*1024)
	}
	a.fill()
	for round := range 20 {
		for _, kb := range sizes {
			a.sample(ttfb(kb), kb*1024)
		}
		if a.limit() < 6 {
			t.Fatalf("round %d: prompt sizes cut the limit to %d (%s)", round, a.limit(), a.state().LastChange)
		}
	}
}

// The reserve follows the limit: at limit 1 there is none, and the one
// slot goes to whoever asks.
func TestAdaptiveReserveClamped(t *testing.T) {
	c := limitertest.NewClock(time.Unix(0, 0))
	lim, _ := limiter.New(limiter.Config{MaxInflight: 8, QueueTimeout: time.Hour, InteractiveReserve: 2,
		Adaptive: &limiter.Adaptive{MinInflight: 1}}, limiter.WithClock(c))
	ctx, cancel := context.WithTimeout(limiter.WithPriority(context.Background(), limiter.Bulk), atOnce)
	defer cancel()
	s, err := lim.Acquire(ctx, akey)
	if err != nil {
		t.Fatalf("a bulk call at limit 1: %v", err)
	}
	if l := lim.Snapshot().Lanes[0]; l.Limit != 1 || l.Reserve != 0 {
		t.Fatalf("limit %d reserve %d", l.Limit, l.Reserve)
	}
	s.Release()
}

// newAdaptiveReserve is newAdaptive with an interactive reserve, its probe
// done (limit at initial).
func newAdaptiveReserve(t *testing.T, max, initial, reserve int) *adaptiveLane {
	c := limitertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	lim, err := limiter.New(limiter.Config{MaxInflight: max, QueueTimeout: time.Hour, InteractiveReserve: reserve,
		Adaptive: &limiter.Adaptive{MinInflight: 1, Initial: initial}}, limiter.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	a := &adaptiveLane{t: t, lim: lim, clock: c}
	a.hold(1)
	a.sample(2*time.Second, 1000) // the probe's one sample
	a.releaseAll()
	if a.limit() != initial {
		t.Fatalf("after the probe: %d, want %d", a.limit(), initial)
	}
	return a
}

// holdPrio takes n slots of class p at once.
func (a *adaptiveLane) holdPrio(n int, p limiter.Priority) {
	a.t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(limiter.WithPriority(context.Background(), p), atOnce)
		s, err := a.lim.Acquire(ctx, akey)
		cancel()
		if err != nil {
			a.t.Fatalf("no %s slot at once: %v", p, err)
		}
		a.held = append(a.held, s)
	}
}

// waitBulk queues one bulk call (the lane then has a waiter); it returns
// a stop that cancels it and returns once it has left the lane (a slot
// granted to it as it was canceled is given back), so that the next
// acquisition finds no waiter ahead of it.
func (a *adaptiveLane) waitBulk() (stop func()) {
	ctx, cancel := context.WithCancel(limiter.WithPriority(context.Background(), limiter.Bulk))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if s, err := a.lim.Acquire(ctx, akey); err == nil {
			s.Release()
		}
	}()
	for a.lim.Snapshot().Lanes[0].Queued == 0 {
		time.Sleep(time.Millisecond)
	}
	return func() { cancel(); <-done }
}

// With a reserve and no interactive call in the last HoldOff, a lane
// whose non-interactive calls use every slot they may (the limit less the
// reserve) with more waiting is using its slots, and grows; after an
// interactive call, it takes every slot held (the reserve's included), so
// that the reserved slot stays inside what the gateway was found to serve.
func TestAdaptiveFullWithReserve(t *testing.T) {
	a := newAdaptiveReserve(t, 16, 4, 1)
	a.holdPrio(3, limiter.Bulk) // 4 - 1: every slot bulk work may take
	stop := a.waitBulk()
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	stop()
	if a.limit() != 8 {
		t.Fatalf("bulk work using every slot it may, two good first bytes: limit %d, want 8 (slow start)", a.limit())
	}
	// An interactive call now: from here, 7 of 8 held is not every slot.
	a.releaseAll()
	a.holdPrio(1, limiter.Interactive)
	a.releaseAll()
	a.holdPrio(7, limiter.Bulk)
	stop = a.waitBulk()
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	if a.limit() != 8 {
		t.Fatalf("7 of 8 held after an interactive call: grew to %d", a.limit())
	}
	a.holdPrio(1, limiter.Interactive) // 8 of 8
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	stop()
	if a.limit() != 16 {
		t.Fatalf("every slot held: %d, want 16", a.limit())
	}
}

// An increase takes Window good first bytes in a row: a slow one between
// them starts the count again.
func TestAdaptiveGoodInARow(t *testing.T) {
	a := newAdaptiveReserve(t, 16, 4, 0)
	a.fill()
	a.sample(2*time.Second, 1000)
	a.sample(2200*time.Millisecond, 1000) // slow (1.1), alone: no cut
	a.sample(2*time.Second, 1000)
	if a.limit() != 4 {
		t.Fatalf("good, slow, good: %d, want 4", a.limit())
	}
	a.sample(2*time.Second, 1000)
	if a.limit() != 8 {
		t.Fatalf("then good again: %d, want 8", a.limit())
	}
}

// A cut just after a raise goes back to the limit before the raise when
// the formula would go lower: that limit served within tolerance. Past
// slow start, the limit latency cut is a ceiling for HoldOff; slow
// start's overshoot sets none, and a lower cut does not lower it.
func TestAdaptiveCutAfterRaiseAndCeiling(t *testing.T) {
	a := newAdaptiveReserve(t, 32, 4, 0)
	a.fill()
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000) // 4 -> 8
	a.fill()
	a.sample(3*time.Second, 1000) // Severe at 8: the formula says 4
	if a.limit() != 4 || a.state().LastChange != "latency: a first byte far past the no-load baseline" {
		t.Fatalf("overshoot: %d (%s), want back to 4", a.limit(), a.state().LastChange)
	}
	// No ceiling from slow start: after the latency hold, additive
	// increase runs past 8.
	a.clock.Advance(adaptive.LatencyHold)
	a.goodRounds(6)
	if a.limit() != 10 {
		t.Fatalf("after slow start: %d, want 4 + 6 = 10", a.limit())
	}
	// A probe past slow start fails: 10 -> 11, slow: back to 10, and 11
	// is a ceiling for HoldOff.
	a.fill()
	a.sample(2*time.Second, 1000)
	a.sample(2*time.Second, 1000)
	if a.limit() != 11 {
		t.Fatalf("probe: %d", a.limit())
	}
	a.fill()
	a.sample(2200*time.Millisecond, 1000) // 1.1, twice: the median cuts
	a.sample(2200*time.Millisecond, 1000)
	if a.limit() != 10 {
		t.Fatalf("a failed probe: %d, want back to 10", a.limit())
	}
	a.clock.Advance(adaptive.LatencyHold)
	a.goodRounds(4)
	if a.limit() != 10 {
		t.Fatalf("under the ceiling: %d, want 10 (one below the 11 latency cut)", a.limit())
	}
	// The capacity dips: a first byte twice the baseline, the limit held
	// at 10 for a while (the increases stopped by the ceiling): the
	// formula, 10 / (1 + 2) = 3.
	a.fill()
	a.sample(4*time.Second, 1000)
	if a.limit() != 3 {
		t.Fatalf("a dip: %d, want 10 / 3 = 3", a.limit())
	}
	// That lower cut did not lower the ceiling: the limit grows back to
	// 10 and stops there while the ceiling lasts.
	a.clock.Advance(adaptive.LatencyHold)
	a.goodRounds(12)
	if a.limit() != 10 {
		t.Fatalf("after the dip: %d, want back to the ceiling, 10", a.limit())
	}
	// Once HoldOff has passed since the cut at 11, 11 is tried again.
	a.clock.Advance(adaptive.HoldOff)
	for range 3 {
		a.fill()
		a.sample(2*time.Second, 1000)
	}
	if a.limit() != 11 {
		t.Fatalf("after the ceiling: %d, want 11", a.limit())
	}
}

// A limit that drops does not take the interactive reserve away: while
// non-interactive calls hold more than the lowered limit leaves them, an
// interactive call may take a slot up to the limit before the drop (no
// more interactive holders than the reserve); nothing else may.
func TestAdaptiveDropKeepsReserve(t *testing.T) {
	a := newAdaptiveReserve(t, 16, 8, 1)
	a.holdPrio(7, limiter.Bulk)   // every slot bulk work may take at 8
	a.sample(4*time.Second, 1000) // Severe, at a load of 7: to 7 / 3 = 2
	if a.limit() != 2 {
		t.Fatalf("limit %d, want 2", a.limit())
	}
	try := func(p limiter.Priority, granted bool) error {
		wait := notGranted
		if granted {
			wait = atOnce
		}
		ctx, cancel := context.WithTimeout(limiter.WithPriority(context.Background(), p), wait)
		defer cancel()
		s, err := a.lim.Acquire(ctx, akey)
		if err == nil {
			a.held = append(a.held, s)
		}
		return err
	}
	if err := try(limiter.Bulk, false); err == nil {
		t.Fatal("a bulk call granted above the lowered limit")
	}
	if err := try(limiter.Interactive, true); err != nil {
		t.Fatalf("the interactive call lost its reserve to the drop: %v", err)
	}
	if err := try(limiter.Interactive, false); err == nil {
		t.Fatal("a second interactive call granted: the reserve is one")
	}
	// Drained (the bulk calls ended): the lowered limit's own rules.
	for i := range a.held[:7] {
		a.held[i].Release()
	}
	a.held = a.held[7:]
	if err := try(limiter.Interactive, true); err != nil {
		t.Fatalf("at limit 2 with one interactive call in flight: %v", err)
	}
	if err := try(limiter.Interactive, false); err == nil {
		t.Fatal("a third call past the limit of 2")
	}
}

// A gateway that jitters whatever its load: its lane learns the jitter from
// pairs of first bytes sent into the same load, a cut it made before it
// knew is taken back, and from then on the jitter never cuts; a real
// slowdown, beyond the jitter, still does.
func TestAdaptiveJitter(t *testing.T) {
	a := newAdaptive(t, 1, 8, 8)
	a.sample(2*time.Second, 1000) // the probe
	a.fill()
	jittery := func(n int) {
		for i := range n {
			if a.limit() < 8 {
				a.fill()
			}
			if i%2 == 0 {
				a.sample(2*time.Second, 1000)
			} else {
				a.sample(2600*time.Millisecond, 1000) // 1.3 times the baseline
			}
		}
	}
	jittery(40)
	if a.limit() != 8 {
		t.Fatalf("after learning the jitter: limit %d (%s), want 8", a.limit(), a.state().LastChange)
	}
	if tol := a.state().Tolerance; tol < 0.3 {
		t.Fatalf("tolerance %v, want above the jitter's 0.3", tol)
	}
	jittery(200)
	if a.limit() != 8 {
		t.Fatalf("jitter alone cut the limit to %d (%s)", a.limit(), a.state().LastChange)
	}
	// First bytes three times the baseline, every one: past the jitter
	// (the tolerance is 0.05 + 4 × 0.3).
	a.fill()
	a.sample(6*time.Second, 1000)
	a.sample(6*time.Second, 1000)
	if a.limit() >= 8 || !strings.HasPrefix(a.state().LastChange, "latency:") {
		t.Fatalf("a slowdown beyond the jitter: limit %d (%s)", a.limit(), a.state().LastChange)
	}
	// A steady gateway's lane keeps the 5 % tolerance.
	s := newAdaptive(t, 1, 8, 8)
	s.sample(2*time.Second, 1000)
	s.fill()
	for range 40 {
		s.sample(2*time.Second, 1000)
	}
	if tol := s.state().Tolerance; tol != adaptive.Tolerance {
		t.Fatalf("steady gateway: tolerance %v, want %v", tol, adaptive.Tolerance)
	}
}

// A 500 is the gateway's error about one request, which a client can
// provoke: it cuts no one's limit. A 503 (overloaded) does.
func TestAdaptivePlain500IsNoLoss(t *testing.T) {
	a := newAdaptive(t, 1, 16, 8)
	for range 3 {
		a.sample(2*time.Second, 1000)
	}
	a.fill()
	sent := a.clock.Now()
	a.clock.Advance(time.Second)
	for range 5 {
		a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 500, Sent: sent})
	}
	if a.limit() != 8 || a.state().CutByLoss {
		t.Fatalf("after five 500s: limit %d, %+v", a.limit(), a.state())
	}
	if u := a.lim.Snapshot().Lanes[0].Upstream; u == nil || u.ServerErrors != 5 {
		t.Fatalf("the 500s are not counted in the lane's health: %+v", u)
	}
	a.lim.RecordExchange(context.Background(), akey, limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 503, Sent: sent})
	if a.limit() != 6 || a.state().LastChange != "loss: server_error" {
		t.Fatalf("after a 503: limit %d (%s), want 6", a.limit(), a.state().LastChange)
	}
}
