package sharedlane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/lanescenario"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// Answered early, in both engines by the same rule: with the exchanges'
// mean hold time known (10 s a call, on a lane of one slot), a call whose
// deadline leaves it 2.5 s, behind one in flight, is estimated to wait
// 10 s and answered at once (CauseEstimate); one with a minute left
// queues. The scenario deadline.txt shows the rest; its estimate from the
// queue's own grants is the in-process lane's alone.
func TestAnswerEarlyBothEngines(t *testing.T) {
	t.Parallel()
	e := &shared{r: startRedis(t)}
	local := func(t testing.TB, cfg limiter.Config, clock *limitertest.Clock) (*limiter.Limiter, error) {
		return limiter.New(cfg, limiter.WithClock(clock))
	}
	for name, mk := range map[string]func(testing.TB, limiter.Config, *limitertest.Clock) (*limiter.Limiter, error){"local": local, "shared": e.New} {
		t.Run(name, func(t *testing.T) {
			clock := limitertest.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
			cfg := limiter.DefaultConfig()
			cfg.MaxInflight, cfg.InteractiveReserve = 1, 0
			lim, err := mk(t, cfg, clock)
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Shutdown()
			key := lanescenario.Lane
			for range 3 { // three calls of 10 s each
				s, err := lim.Acquire(context.Background(), key)
				if err != nil {
					t.Fatal(err)
				}
				lim.RecordExchange(context.Background(), key, limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200, Duration: 10 * time.Second})
				s.Release()
			}
			held, err := lim.Acquire(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			early := make(chan error, 1)
			go func() {
				_, err := lim.Acquire(limiter.WithDeadline(context.Background(), clock.Now().Add(3*time.Second)), key)
				early <- err
			}()
			select {
			case err = <-early:
			case <-time.After(10 * time.Second):
				t.Fatal("a call that cannot be served in time was queued, not answered")
			}
			var qe *limiter.QueueTimeoutError
			if !errors.As(err, &qe) || qe.Cause != limiter.CauseEstimate || qe.RetryAfter < 10*time.Second {
				t.Fatalf("err %v (%+v), want answered early on an estimate of 10 s", err, qe)
			}
			ctx, cancel := context.WithCancel(limiter.WithDeadline(context.Background(), clock.Now().Add(time.Minute)))
			done := make(chan error, 1)
			go func() {
				_, err := lim.Acquire(ctx, key)
				done <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if l := lim.Snapshot().Lanes; len(l) == 1 && l[0].Queued == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the call with a minute left never queued")
				}
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want canceled", err)
			}
			if l := lim.Snapshot().Lanes[0]; l.GaveUp5m == nil || l.GaveUp5m.Deadline.Default != 1 || l.GaveUp5m.CallerGone.Default != 1 {
				t.Fatalf("gave up %+v, want one deadline and one caller gone", l.GaveUp5m)
			}
		})
	}
}
