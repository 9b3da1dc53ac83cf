package limiter_test

import (
	"testing"

	"github.com/llmlanes/llmlanes/internal/lanescenario"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// TestScenarios runs the lane's scenario files (testdata/scenarios) on the
// in-process limiter. sharedlane's TestScenarios runs the same files on
// lane.lua: both must print what the files say.
func TestScenarios(t *testing.T) { lanescenario.RunDir(t, "testdata/scenarios", local{}) }

type local struct{}

func (local) Name() string { return "local" }

func (local) New(_ testing.TB, cfg limiter.Config, clock *limitertest.Clock) (*limiter.Limiter, error) {
	return limiter.New(cfg, limiter.WithClock(clock))
}

func (local) Queue(_ testing.TB, lim *limiter.Limiter, lane string) lanescenario.Queue {
	ws, service := limiter.LaneQueue(lim, lane)
	q := lanescenario.Queue{Service: service}
	for _, w := range ws {
		q.Waiters = append(q.Waiters, lanescenario.Waiter{Class: w.Class, Tenant: w.Tenant, Arrival: w.Arrival, Seq: w.Seq, Tokens: w.Tokens})
	}
	return q
}
