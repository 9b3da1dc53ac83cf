package classify_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
)

const lane = "https://gw/v1|protolabs/smart"

func sec(v float64) *limiter.Seconds { s := limiter.Seconds(v); return &s }

// 5. Classification, case by case.
func TestClassify(t *testing.T) {
	th := classify.DefaultThresholds()
	base := limiter.LaneSnapshot{Lane: lane, Limit: 6, Reserve: 1}
	with := func(f func(*limiter.LaneSnapshot)) limiter.LaneSnapshot { l := base; f(&l); return l }
	cases := []struct {
		name    string
		lane    limiter.LaneSnapshot
		state   classify.State
		reasons []string
		hold    string
	}{
		{"idle: nothing in 5 minutes", base, classify.Idle, []string{}, "gate idle: no call in the last 5 min"},
		{"flowing", with(func(l *limiter.LaneSnapshot) { l.Inflight, l.WaitP50, l.WaitP90 = 1, sec(0), sec(0) }),
			classify.Healthy, []string{}, "gate healthy: 1 of 6 slots in use, 0 waiting"},
		{"no call now, but calls within 5 minutes", with(func(l *limiter.LaneSnapshot) { l.WaitP50, l.WaitP90 = sec(0), sec(0) }),
			classify.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"only exchanges within 5 minutes", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{OK: 1} }),
			classify.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"busy but flowing", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.WaitP90 = 6, 2, sec(12)
			l.Upstream = &limiter.UpstreamCounts{OK: 200, ServerErrors: 2}
		}), classify.Healthy, []string{}, "gate healthy: 6 of 6 slots in use, 2 waiting"},
		{"saturated", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.Saturated, l.WaitP50, l.WaitP90 = 6, 9, true, sec(38), sec(171)
			l.QueuedByPriority = limiter.QueuedByPriority{Default: 2, Bulk: 7}
		}), classify.LocalQueue, []string{"saturated", "wait_p90"}, "gate queue: 9 calls waiting, p90 wait 171 s"},
		{"saturated, by tenants: the busiest is named", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.Saturated, l.WaitP50, l.WaitP90 = 6, 9, true, sec(38), sec(171)
			l.QueuedByPriority = limiter.QueuedByPriority{Default: 2, Bulk: 7}
			l.Tenants = []limiter.TenantSnapshot{{Tenant: "board-a", Inflight: 4, Queued: 7}, {Tenant: "board-b", Inflight: 2, Queued: 2}}
		}), classify.LocalQueue, []string{"saturated", "wait_p90"}, "gate queue: 9 calls waiting (7 from board-a), p90 wait 171 s"},
		{"tenants, none queued: no name", with(func(l *limiter.LaneSnapshot) {
			l.WaitP90 = sec(45)
			l.Tenants = []limiter.TenantSnapshot{{Tenant: "board-a", Inflight: 4}}
		}), classify.LocalQueue, []string{"wait_p90"}, "gate queue: 0 calls waiting, p90 wait 45 s"},
		{"high p90 alone", with(func(l *limiter.LaneSnapshot) { l.WaitP90 = sec(45) }),
			classify.LocalQueue, []string{"wait_p90"}, "gate queue: 0 calls waiting, p90 wait 45 s"},
		{"p90 at the threshold is not over it", with(func(l *limiter.LaneSnapshot) { l.WaitP50, l.WaitP90 = sec(1), sec(30) }),
			classify.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		{"queue timeouts", with(func(l *limiter.LaneSnapshot) { l.Queued, l.QueueTimeouts5m, l.WaitP90 = 1, 2, sec(20) }),
			classify.LocalQueue, []string{"queue_timeouts"}, "gate queue: 1 call waiting, p90 wait 20 s, 2 queue timeouts in 5 min"},
		{"callers giving up while calls queue: the issue's first minute", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.WaitP50, l.WaitP90 = 6, 24, sec(0), sec(5.5)
			l.GaveUp5m = &limiter.GaveUp{CallerGone: limiter.QueuedByPriority{Bulk: 2}, Deadline: limiter.QueuedByPriority{Default: 1, Bulk: 4}}
		}), classify.LocalQueue, []string{"callers_gave_up"}, "gate queue: 24 calls waiting, p90 wait 6 s, 2 callers gave up waiting, 5 calls answered at their deadline"},
		{"callers gave up at their deadlines all at once: none queued, the lane full", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.WaitP50, l.WaitP90 = 6, sec(5.5), sec(5.5)
			l.GaveUp5m = &limiter.GaveUp{Deadline: limiter.QueuedByPriority{Bulk: 18}}
		}), classify.LocalQueue, []string{"callers_gave_up"}, "gate queue: 0 calls waiting, p90 wait 6 s, 18 calls answered at their deadline"},
		{"callers gave up, none queued now", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.WaitP50, l.WaitP90 = 2, sec(0), sec(3)
			l.GaveUp5m = &limiter.GaveUp{CallerGone: limiter.QueuedByPriority{Interactive: 1}}
		}), classify.Healthy, []string{"callers_gave_up"}, "gate healthy: 2 of 6 slots in use, 0 waiting, 1 caller gave up waiting"},
		{"5xx with a free lane", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Upstream = 2, &limiter.UpstreamCounts{OK: 10, ServerErrors: 4}
		}), classify.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 4 × 5xx in 5 min"},
		{"429s", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{RateLimited: 3} }),
			classify.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 3 × 429 in 5 min"},
		{"stalls (timeouts) and transport errors", with(func(l *limiter.LaneSnapshot) {
			l.Upstream = &limiter.UpstreamCounts{OK: 1, Stalls: 2, TransportErrors: 1}
		}), classify.GatewayDegraded, []string{"upstream_errors"}, "gateway degraded: 1 transport error, 2 stalls in 5 min"},
		{"retries alone", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{OK: 50, Retries: 3} }),
			classify.GatewayDegraded, []string{"retries"}, "gateway degraded: 3 retries in 5 min"},
		{"errors under the ratio", with(func(l *limiter.LaneSnapshot) { l.Upstream = &limiter.UpstreamCounts{OK: 1000, ServerErrors: 5} }),
			classify.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
		// docs/DESIGN.md, "Classification": gateway_degraded only while the lane is not queueing
		// on purpose; when both hold, local_queue, gateway reasons listed.
		{"saturated in front of a failing gateway: local_queue, gateway reasons listed", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.Queued, l.Saturated, l.WaitP90 = 6, 9, true, sec(171)
			l.Upstream = &limiter.UpstreamCounts{OK: 20, ServerErrors: 3, RateLimited: 2, Retries: 5}
		}), classify.LocalQueue, []string{"saturated", "wait_p90", "upstream_errors", "retries"},
			"gate queue: 9 calls waiting, p90 wait 171 s; gateway failing too: 2 × 429, 3 × 5xx, 5 retries in 5 min"},
		{"high p90 (not saturated) in front of a failing gateway: local_queue", with(func(l *limiter.LaneSnapshot) {
			l.Inflight, l.WaitP90 = 3, sec(45)
			l.Upstream = &limiter.UpstreamCounts{OK: 2, TransportErrors: 4}
		}), classify.LocalQueue, []string{"wait_p90", "upstream_errors"},
			"gate queue: 0 calls waiting, p90 wait 45 s; gateway failing too: 4 transport errors in 5 min"},
		{"client errors are not the gateway's", with(func(l *limiter.LaneSnapshot) {
			l.Upstream = &limiter.UpstreamCounts{ClientErrors: 40, Canceled: 9}
		}), classify.Healthy, []string{}, "gate healthy: 0 of 6 slots in use, 0 waiting"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := classify.Lane(tc.lane, th)
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
	got := classify.Lane(l, classify.DefaultThresholds()).Counts
	want := classify.Counts{Inflight: 3, Limit: 4, Queued: 2, QueueTimeouts5m: 1, Exchanges5m: 26, UpstreamErrors: 14,
		RateLimited: 2, ServerErrors: 3, TransportErrors: 4, Stalls: 5, Retries: 7}
	if got != want {
		t.Fatalf("counts %+v\nwant %+v", got, want)
	}
}

func TestThresholdsConfigurable(t *testing.T) {
	l := limiter.LaneSnapshot{Lane: lane, Limit: 2, WaitP90: sec(20)}
	if c := classify.Lane(l, classify.Thresholds{WaitP90: 10 * time.Second, UpstreamErrors: 3, ErrorRatio: 0, Retries: 3}); c.State != classify.LocalQueue {
		t.Fatalf("lower p90 threshold: %s", c.State)
	}
	for _, bad := range []classify.Thresholds{
		{WaitP90: 0, UpstreamErrors: 3, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 0, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 3, ErrorRatio: 2, Retries: 3},
		{WaitP90: time.Second, UpstreamErrors: 3, Retries: 0},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// ClearAfter: with it set, the gateway reasons hold only while the latest
// upstream error is recent; the counts stay as they are. Off, the window
// alone decides (the ADR's rule).
func TestClearAfter(t *testing.T) {
	degraded := func(age *limiter.Seconds) limiter.LaneSnapshot {
		return limiter.LaneSnapshot{Lane: lane, Limit: 6, Inflight: 1,
			Upstream: &limiter.UpstreamCounts{OK: 10, ServerErrors: 5, Retries: 4, LastErrorAge: age}}
	}
	off := classify.DefaultThresholds()
	on := off
	on.ClearAfter = 30 * time.Second
	for _, c := range []struct {
		name  string
		lane  limiter.LaneSnapshot
		th    classify.Thresholds
		state classify.State
	}{
		{"off, old error", degraded(sec(200)), off, classify.GatewayDegraded},
		{"off, no age known", degraded(nil), off, classify.GatewayDegraded},
		{"on, error 10 s ago", degraded(sec(10)), on, classify.GatewayDegraded},
		{"on, error exactly 30 s ago", degraded(sec(30)), on, classify.GatewayDegraded},
		{"on, error 31 s ago", degraded(sec(31)), on, classify.Healthy},
		{"on, retries but no error in the window", degraded(nil), on, classify.Healthy},
	} {
		got := classify.Lane(c.lane, c.th)
		if got.State != c.state {
			t.Errorf("%s: %s %v, want %s", c.name, got.State, got.Reasons, c.state)
		}
		if got.Counts.ServerErrors != 5 || got.Counts.Retries != 4 {
			t.Errorf("%s: counts changed: %+v", c.name, got.Counts)
		}
	}
	bad := off
	bad.ClearAfter = -time.Second
	if bad.Validate() == nil {
		t.Fatal("a negative clear_after passed validation")
	}
}

// A shared lane whose store is down lists shared_store_down and says so in
// the hold text; the state still comes from the other reasons.
func TestSharedStoreDown(t *testing.T) {
	l := limiter.LaneSnapshot{Lane: lane, Limit: 4, Inflight: 1, Shared: &limiter.Shared{State: limiter.BackendLocalFallback}}
	c := classify.Lane(l, classify.DefaultThresholds())
	if c.State != classify.Healthy || !reflect.DeepEqual(c.Reasons, []string{classify.ReasonSharedDown}) ||
		c.HoldText != "gate healthy: 1 of 4 slots in use, 0 waiting; shared store unreachable: this process uses lanes of its own" {
		t.Fatalf("%+v", c)
	}
	l.Shared.State = limiter.BackendOK
	if c := classify.Lane(l, classify.DefaultThresholds()); len(c.Reasons) != 0 {
		t.Fatalf("reasons %v with the store up", c.Reasons)
	}
}

// An adaptive limit cut by the gateway's loss signals is a gateway reason.
func TestLimitCut(t *testing.T) {
	l := limiter.LaneSnapshot{Lane: lane, Limit: 3, Inflight: 1, Adaptive: &limiter.AdaptiveState{Min: 1, Max: 8, CutByLoss: true}}
	if c := classify.Lane(l, classify.DefaultThresholds()); c.State != classify.GatewayDegraded || !reflect.DeepEqual(c.Reasons, []string{classify.ReasonLimitCut}) {
		t.Fatalf("%+v", c)
	}
	l.Adaptive.CutByLoss = false
	if c := classify.Lane(l, classify.DefaultThresholds()); c.State != classify.Healthy {
		t.Fatalf("%+v", c)
	}
}

// TestTruthTable tests each row of the truth table in docs/DESIGN.md: the
// lane's four local facts and the gateway's health, the state and the
// reasons listed.
func TestTruthTable(t *testing.T) {
	th := classify.DefaultThresholds()
	failing := &limiter.UpstreamCounts{ServerErrors: 20, LastErrorAge: sec(1)} // every call fails with a 5xx
	healthy := &limiter.UpstreamCounts{OK: 20}
	type facts struct {
		saturated, p90Over bool
		timeouts, queued   int
		gateway            bool
		waitsFor           string // what the queued bulk calls wait for (limiter.Wait...), if not a slot
	}
	snap := func(f facts) limiter.LaneSnapshot {
		l := limiter.LaneSnapshot{Lane: lane, Limit: 4, Reserve: 1, Inflight: 1, WaitP50: sec(0), WaitP90: sec(0),
			Saturated: f.saturated, Queued: f.queued, QueueTimeouts5m: f.timeouts, Upstream: healthy}
		l.QueuedByPriority.Bulk = f.queued
		if f.p90Over {
			l.WaitP90 = sec(31)
		}
		if f.gateway {
			l.Upstream = failing
		}
		if f.waitsFor != "" {
			l.Tokens = &limiter.TokenSnapshot{TokensPerMinute: 90000, WaitingFor: map[string]string{"bulk": f.waitsFor}}
		}
		return l
	}
	rows := []struct {
		name    string
		f       facts
		state   classify.State
		reasons []string
	}{
		{"nothing holds: healthy", facts{}, classify.Healthy, []string{}},
		{"saturated", facts{saturated: true, queued: 3}, classify.LocalQueue, []string{"saturated"}},
		{"saturated with timeouts and a high p90: all listed", facts{saturated: true, p90Over: true, timeouts: 1, queued: 3},
			classify.LocalQueue, []string{"saturated", "wait_p90", "queue_timeouts"}},
		{"p90 over the threshold", facts{p90Over: true}, classify.LocalQueue, []string{"wait_p90"}},
		{"p90 over, with a timeout", facts{p90Over: true, timeouts: 1}, classify.LocalQueue, []string{"wait_p90", "queue_timeouts"}},
		{"a timeout while calls queue now", facts{timeouts: 1, queued: 2}, classify.LocalQueue, []string{"queue_timeouts"}},
		{"a timeout on a lane free now: listed, healthy", facts{timeouts: 1}, classify.Healthy, []string{"queue_timeouts"}},
		{"failing gateway, free lane", facts{gateway: true}, classify.GatewayDegraded, []string{"upstream_errors"}},
		{"one queue timeout, free lane, failing gateway: gateway_degraded", facts{timeouts: 1, gateway: true},
			classify.GatewayDegraded, []string{"queue_timeouts", "upstream_errors"}},
		{"a timeout while calls queue now, failing gateway", facts{timeouts: 1, queued: 2, gateway: true},
			classify.LocalQueue, []string{"queue_timeouts", "upstream_errors"}},
		{"saturated, failing gateway: local_queue, gateway reasons listed", facts{saturated: true, queued: 3, gateway: true},
			classify.LocalQueue, []string{"saturated", "upstream_errors"}},
		{"p90 over, failing gateway", facts{p90Over: true, gateway: true}, classify.LocalQueue, []string{"wait_p90", "upstream_errors"}},
		{"queued for the token budget", facts{queued: 2, waitsFor: limiter.WaitTokens}, classify.LocalQueue, []string{"token_budget"}},
		{"queued for the provider's budget", facts{queued: 2, waitsFor: limiter.WaitProvider}, classify.LocalQueue, []string{"provider_limit"}},
		{"held by a 429's Retry-After", facts{queued: 2, waitsFor: limiter.WaitRetryAfter}, classify.LocalQueue, []string{"provider_limit"}},
		{"queued for the provider's budget, failing gateway", facts{queued: 2, waitsFor: limiter.WaitProvider, gateway: true},
			classify.LocalQueue, []string{"provider_limit", "upstream_errors"}},
		{"queued for the token budget, failing gateway", facts{queued: 2, waitsFor: limiter.WaitTokens, gateway: true},
			classify.LocalQueue, []string{"token_budget", "upstream_errors"}},
		{"queued for a slot: not the token budget", facts{queued: 2, waitsFor: limiter.WaitSlot}, classify.Healthy, []string{}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			c := classify.Lane(snap(r.f), th)
			if c.State != r.state || !reflect.DeepEqual(c.Reasons, r.reasons) {
				t.Fatalf("%+v: got %s %v, want %s %v (%q)", r.f, c.State, c.Reasons, r.state, r.reasons, c.HoldText)
			}
		})
	}
	// The hold text of the case names the gateway first, and the
	// timeout too.
	c := classify.Lane(snap(facts{timeouts: 1, gateway: true}), th)
	if want := "gateway degraded: 20 × 5xx in 5 min, 1 queue timeout in 5 min"; c.HoldText != want {
		t.Fatalf("hold text %q, want %q", c.HoldText, want)
	}
	c = classify.Lane(snap(facts{queued: 2, waitsFor: limiter.WaitTokens}), th)
	if want := "gate queue: 2 calls waiting, p90 wait 0 s; waiting for the token budget to refill"; c.HoldText != want {
		t.Fatalf("hold text %q, want %q", c.HoldText, want)
	}
	// A lane held by the provider's word, with no budget of its own, names
	// the provider and when it resets, not the token budget.
	l := snap(facts{queued: 2, waitsFor: limiter.WaitProvider})
	l.Tokens.TokensPerMinute = 0
	l.Tokens.Provider = &limiter.ProviderSnapshot{Tokens: &limiter.ProviderBudgetSnapshot{Limit: 6000, Remaining: 10, Reset: 41.2}, RetryAfter: 3}
	c = classify.Lane(l, th)
	if want := "gate queue: 2 calls waiting, p90 wait 0 s; waiting for the provider's rate limit (resets in 42 s)"; c.HoldText != want {
		t.Fatalf("hold text %q, want %q", c.HoldText, want)
	}
	// Idle is the healthy row with no activity at all.
	if c := classify.Lane(limiter.LaneSnapshot{Lane: lane, Limit: 4}, th); c.State != classify.Idle {
		t.Fatalf("no activity: %s", c.State)
	}
}
