package telemetry_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

func sec(v float64) *limiter.Seconds { s := limiter.Seconds(v); return &s }

// 5. Classification, case by case.
func TestClassify(t *testing.T) {
	th := telemetry.DefaultThresholds()
	base := limiter.LaneSnapshot{Lane: lane, Limit: 6, Reserve: 1}
	with := func(f func(*limiter.LaneSnapshot)) limiter.LaneSnapshot { l := base; f(&l); return l }
	cases := []struct {
		name    string
		lane    limiter.LaneSnapshot
		state   telemetry.State
		reasons []string
		hold    string
	}{
		{"idle", base, telemetry.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"busy but flowing", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.WaitP90 = 6, 2, sec(12)
			l.Upstream = &limiter.UpstreamCounts{OK: 200, ServerErrors: 2}
		}), telemetry.Healthy, []string{}, "gate healthy: 6 of 6 slots in use, 2 waiting"},
		{"saturated", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.Saturated, l.WaitP50, l.WaitP90 = 6, 9, true, sec(38), sec(171)
			l.QueuedByPriority = limiter.QueuedByPriority{Default: 2, Bulk: 7}
		}), telemetry.LocalQueue, []string{"saturated", "wait_p90"}, "gate queue: 9 calls waiting, p90 wait 171 s"},
		{"high p90 alone", with(func(l *limiter.LaneSnapshot) { l.WaitP90 = sec(45) }),
			telemetry.LocalQueue, []string{"wait_p90"}, "gate queue: 0 calls waiting, p90 wait 45 s"},
		{"p90 at the threshold is not over it", with(func(l *limiter.LaneSnapshot) { l.WaitP90 = sec(30) }),
			telemetry.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"queue timeouts", with(func(l *limiter.LaneSnapshot) { l.Queued, l.QueueTimeouts5m, l.WaitP90 = 1, 2, sec(20) }),
			telemetry.LocalQueue, []string{"queue_timeouts"}, "gate queue: 1 call waiting, p90 wait 20 s, 2 queue timeouts in 5 min"},
		{"5xx with a free lane", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Upstream = 2, &limiter.UpstreamCounts{OK: 10, ServerErrors: 4}
		}), telemetry.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 4 × 5xx in 5 min"},
		{"429s", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{RateLimited: 3} }),
			telemetry.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 3 × 429 in 5 min"},
		{"stalls (timeouts) and transport errors", with(func(l *limiter.LaneSnapshot) {
			l.Upstream = &limiter.UpstreamCounts{OK: 1, Stalls: 2, TransportErrors: 1}
		}), telemetry.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 1 transport error, 2 stalls in 5 min"},
		{"retries alone", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{OK: 50, Retries: 3} }),
			telemetry.GatewayDegraded, []string{"retries"}, "gateway degraded: 3 retries in 5 min"},
		{"errors under the ratio", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{OK: 1000, ServerErrors: 5} }),
			telemetry.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"both: the gateway wins, both listed", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.Saturated, l.WaitP90 = 6, 9, true, sec(171)
			l.Upstream = &limiter.UpstreamCounts{OK: 20, ServerErrors: 3, RateLimited: 2, Retries: 5}
		}), telemetry.GatewayDegraded, []string{"saturated", "wait_p90", "upstream_errors", "retries"},
			"gateway degraded: 2 × 429, 3 × 5xx, 5 retries in 5 min; gate queue: 9 calls waiting, p90 wait 171 s"},
		{"client errors are not the gateway's", with(func(l *limiter.LaneSnapshot) {
			l.Upstream = &limiter.UpstreamCounts{ClientErrors: 40, Canceled: 9}
		}), telemetry.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := telemetry.Classify(tc.lane, th)
			if c.State != tc.state || !reflect.DeepEqual(c.Reasons, tc.reasons) || c.HoldText != tc.hold {
				t.Fatalf("got %s %v %q\nwant %s %v %q", c.State, c.Reasons, c.HoldText, tc.state, tc.reasons, tc.hold)
			}
			if c.LaneQueueDepth != tc.lane.Queued || c.LaneSaturated != tc.lane.Saturated || c.LaneWaitP90S != tc.lane.WaitP90 {
				t.Fatalf("lane fields %+v", c)
			}
		})
	}
}

func TestClassifyCounts(t *testing.T) {
	l := limiter.LaneSnapshot{Lane: lane, Limit: 4, Inflight: 3, Queued: 2, QueueTimeouts5m: 1,
		Upstream: &limiter.UpstreamCounts{OK: 5, ClientErrors: 1, RateLimited: 2, ServerErrors: 3, TransportErrors: 4, Stalls: 5, Canceled: 6, Retries: 7}}
	got := telemetry.Classify(l, telemetry.DefaultThresholds()).Counts
	want := telemetry.Counts{Inflight: 3, Limit: 4, Queued: 2, QueueTimeouts5m: 1, Exchanges5m: 26, UpstreamErrors: 14,
		RateLimited: 2, ServerErrors: 3, TransportErrors: 4, Stalls: 5, Retries: 7}
	if got != want {
		t.Fatalf("counts %+v\nwant %+v", got, want)
	}
}

func TestThresholdsConfigurable(t *testing.T) {
	l := limiter.LaneSnapshot{Lane: lane, Limit: 2, WaitP90: sec(20)}
	if c := telemetry.Classify(l, telemetry.Thresholds{WaitP90: 10 * time.Second, UpstreamErrors: 3, ErrorRatio: 0, Retries: 3}); c.State != telemetry.LocalQueue {
		t.Fatalf("lower p90 threshold: %s", c.State)
	}
	for _, bad := range []telemetry.Thresholds{
		{WaitP90: 0, UpstreamErrors: 3, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 0, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 3, ErrorRatio: 2, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 3, Retries: 0},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := telemetry.New(telemetry.Options{Thresholds: telemetry.Thresholds{WaitP90: -1}}); err == nil {
		t.Fatal("New accepted bad thresholds")
	}
}
