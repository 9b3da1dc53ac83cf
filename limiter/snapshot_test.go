package limiter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// The snapshot example of docs/DESIGN.md ("The snapshot"), as written there.
const designExample = `{"enabled": true, "generated_at": "2026-09-28T09:26:00Z",
 "lanes": [{"lane": "https://gw/v1|protolabs/smart", "limit": 6, "reserve": 1,
            "inflight": 6, "queued": 9,
            "queued_by_priority": {"interactive": 0, "default": 2, "bulk": 7},
            "oldest_wait_s": 212.4, "wait_p50_s_5m": 38.0, "wait_p90_s_5m": 171.0,
            "queue_timeouts_5m": 2, "saturated": true}]}`

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func secs(v float64) *limiter.Seconds { s := limiter.Seconds(v); return &s }

func TestSnapshotEncodesDesignShape(t *testing.T) {
	s := limiter.Snapshot{
		Enabled:     true,
		GeneratedAt: time.Date(2026, 9, 28, 9, 26, 0, 0, time.UTC),
		Lanes: []limiter.LaneSnapshot{{
			Lane: gw, Limit: 6, Reserve: 1, Inflight: 6, Queued: 9,
			QueuedByPriority: limiter.QueuedByPriority{Interactive: 0, Default: 2, Bulk: 7},
			OldestWait:       212.4, WaitP50: secs(38), WaitP90: secs(171),
			QueueTimeouts5m: 2, Saturated: true,
		}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if want := compact(t, designExample); string(b) != want {
		t.Fatalf("encoded\n%s\nwant\n%s", b, want)
	}
	// And it decodes back to the same value.
	var back limiter.Snapshot
	if err := json.Unmarshal([]byte(designExample), &back); err != nil {
		t.Fatal(err)
	}
	if b2, _ := json.Marshal(back); !bytes.Equal(b, b2) {
		t.Fatalf("round trip\n%s\nwant\n%s", b2, b)
	}
}

// A scripted lane, checked byte for byte at each step.
func TestSnapshotScenario(t *testing.T) {
	h := newHarness(t, cfgN(1))
	ctx := context.Background()
	a := h.take(gw, "a", limiter.Default) // t=0, wait 0
	h.queue(ctx, gw, "b", limiter.Bulk)
	h.clock.Advance(30 * time.Second)
	a.Release()
	b := h.expectGrant("b") // t=30, wait 30
	h.queue(ctx, gw, "c", limiter.Default)
	h.clock.Advance(10 * time.Second)
	h.queue(ctx, gw, "d", limiter.Interactive) // t=40

	check := func(want string) {
		t.Helper()
		got, err := json.Marshal(h.lim.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != compact(t, want) {
			t.Fatalf("at %s snapshot\n%s\nwant\n%s", h.clock.Now().Sub(t0), got, compact(t, want))
		}
	}
	h.clock.Advance(49*time.Second + 900*time.Millisecond) // t=89.9: queued for 59.9 s
	check(`{"enabled":true,"generated_at":"2026-09-28T09:01:29Z","lanes":[{"lane":"` + gw + `","limit":1,"reserve":0,
		"inflight":1,"queued":2,"queued_by_priority":{"interactive":1,"default":1,"bulk":0},
		"oldest_wait_s":59.9,"wait_p50_s_5m":15.0,"wait_p90_s_5m":27.0,"queue_timeouts_5m":0,"saturated":false,
		"eta_s":{"interactive":null,"default":null,"bulk":null}}]}`)
	h.clock.Advance(100 * time.Millisecond) // t=90: 60 s
	check(`{"enabled":true,"generated_at":"2026-09-28T09:01:30Z","lanes":[{"lane":"` + gw + `","limit":1,"reserve":0,
		"inflight":1,"queued":2,"queued_by_priority":{"interactive":1,"default":1,"bulk":0},
		"oldest_wait_s":60.0,"wait_p50_s_5m":15.0,"wait_p90_s_5m":27.0,"queue_timeouts_5m":0,"saturated":true,
		"eta_s":{"interactive":null,"default":null,"bulk":null}}]}`)

	b.Release()
	// c has waited 60 s, so it ranks as interactive and, having arrived
	// before d, goes first.
	c := h.expectGrant("c") // t=90, wait 60; d still queued, so still saturated
	if l := h.lane(gw); !l.Saturated || l.Queued != 1 {
		t.Fatalf("after c: %+v", l)
	}
	c.Release()
	d := h.expectGrant("d") // t=90, wait 50; the queue empties
	// Waits now 0, 30, 50, 60: p50 40.0, p90 57.0. The queue was served
	// 3 times in 90 s of queueing, so a newcomer of any class (the slot is
	// held, no one ahead) would wait about 30 s.
	check(`{"enabled":true,"generated_at":"2026-09-28T09:01:30Z","lanes":[{"lane":"` + gw + `","limit":1,"reserve":0,
		"inflight":1,"queued":0,"queued_by_priority":{"interactive":0,"default":0,"bulk":0},
		"oldest_wait_s":0.0,"wait_p50_s_5m":40.0,"wait_p90_s_5m":57.0,"queue_timeouts_5m":0,"saturated":false,
		"eta_s":{"interactive":30.0,"default":30.0,"bulk":30.0}}]}`)

	// A new queue starts a new 60 s count.
	h.queue(ctx, gw, "e", limiter.Bulk)
	h.clock.Advance(59 * time.Second)
	if l := h.lane(gw); l.Saturated {
		t.Fatal("saturated 59 s after the queue refilled")
	}
	h.clock.Advance(time.Second)
	if l := h.lane(gw); !l.Saturated {
		t.Fatal("not saturated 60 s after the queue refilled")
	}
	d.Release()
	e := h.expectGrant("e") // t=150, wait 60
	e.Release()
}

// The 5-minute window: a grant counts for 300 to 310 s (10 s steps).
func TestSnapshotWindowExpiry(t *testing.T) {
	h := newHarness(t, cfgN(1))
	a := h.take(gw, "a", limiter.Default) // t=0, wait 0
	h.queue(context.Background(), gw, "b", limiter.Default)
	h.clock.Advance(30 * time.Second)
	a.Release()
	b := h.expectGrant("b") // t=30, wait 30
	b.Release()
	p := func() (any, any) {
		l := h.lane(gw)
		if l.WaitP50 == nil || l.WaitP90 == nil {
			return nil, nil
		}
		return float64(*l.WaitP50), float64(*l.WaitP90)
	}
	// The t=0 grant is in step 0 (0-10 s) and the t=30 one in step 3
	// (30-40 s); a step leaves the window 310 s after it began.
	h.clock.Advance(280*time.Second - 100*time.Millisecond) // t=309.9: both in
	if p50, p90 := p(); p50 != 15.0 || p90 != 27.0 {
		t.Fatalf("t=309.9: p50 %v p90 %v, want 15 and 27", p50, p90)
	}
	h.clock.Advance(100 * time.Millisecond) // t=310: step 0 has left
	if p50, p90 := p(); p50 != 30.0 || p90 != 30.0 {
		t.Fatalf("t=310: p50 %v p90 %v, want 30 and 30", p50, p90)
	}
	h.clock.Advance(30*time.Second - 100*time.Millisecond) // t=339.9: step 3 still in
	if p50, _ := p(); p50 != 30.0 {
		t.Fatalf("t=339.9: p50 %v, want 30", p50)
	}
	h.clock.Advance(100 * time.Millisecond) // t=340: step 3 has left
	if p50, p90 := p(); p50 != nil || p90 != nil {
		t.Fatalf("t=340: p50 %v p90 %v, want none", p50, p90)
	}
	got, _ := json.Marshal(h.lane(gw))
	if !bytes.Contains(got, []byte(`"wait_p50_s_5m":null,"wait_p90_s_5m":null`)) {
		t.Fatalf("empty window encodes as %s", got)
	}
}

func TestSnapshotCountsTimeoutsForFiveMinutes(t *testing.T) {
	h := newHarness(t, limiter.Config{MaxInflight: 1, QueueTimeout: 10 * time.Second})
	held := h.take(gw, "holder", limiter.Default)
	h.queue(context.Background(), gw, "w", limiter.Default)
	h.clock.Advance(10 * time.Second) // times out at t=10
	if r := h.next(); r.err == nil {
		t.Fatal("no timeout")
	}
	if n := h.lane(gw).QueueTimeouts5m; n != 1 {
		t.Fatalf("queue_timeouts_5m %d, want 1", n)
	}
	h.clock.Advance(300 * time.Second) // t=310: its step (10..20) is still in
	if n := h.lane(gw).QueueTimeouts5m; n != 1 {
		t.Fatalf("queue_timeouts_5m at 310 s %d, want 1", n)
	}
	h.clock.Advance(10 * time.Second) // t=320: gone
	if n := h.lane(gw).QueueTimeouts5m; n != 0 {
		t.Fatalf("queue_timeouts_5m at 320 s %d, want 0", n)
	}
	held.Release()
}

func TestSnapshotSortsLanes(t *testing.T) {
	h := newHarness(t, cfgN(3))
	keys := []string{"https://b/v1|m", "https://a/v1|z", "https://a/v1|m"}
	for _, k := range keys {
		s := h.take(k, k, limiter.Default)
		s.Release()
	}
	snap := h.lim.Snapshot()
	var got []string
	for _, l := range snap.Lanes {
		got = append(got, l.Lane)
	}
	if len(got) != 3 || got[0] != "https://a/v1|m" || got[1] != "https://a/v1|z" || got[2] != "https://b/v1|m" {
		t.Fatalf("lanes %v, want sorted", got)
	}
}

// Every key of DESIGN.md is present, with nothing renamed, at every level;
// the only other keys are the documented extras.
func TestSnapshotKeySet(t *testing.T) {
	h := newHarness(t, cfgN(1))
	s := h.take(gw, "a", limiter.Default)
	defer s.Release()
	got, _ := json.Marshal(h.lim.Snapshot())
	var have, want map[string]any
	_ = json.Unmarshal(got, &have)
	_ = json.Unmarshal([]byte(designExample), &want)
	sameKeys(t, "top", have, want)
	hl := have["lanes"].([]any)[0].(map[string]any)
	wl := want["lanes"].([]any)[0].(map[string]any)
	eta, ok := hl["eta_s"].(map[string]any)
	if !ok {
		t.Fatalf("lane has no eta_s object: %v", hl)
	}
	sameKeys(t, "eta_s", eta, wl["queued_by_priority"].(map[string]any)) // one per class
	delete(hl, "eta_s")
	sameKeys(t, "lane", hl, wl)
	sameKeys(t, "queued_by_priority", hl["queued_by_priority"].(map[string]any), wl["queued_by_priority"].(map[string]any))
}

func sameKeys(t *testing.T, where string, a, b map[string]any) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d keys, want %d (%v vs %v)", where, len(a), len(b), a, b)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			t.Fatalf("%s: key %q missing", where, k)
		}
	}
}

func TestRecordExchangeCountsInWindow(t *testing.T) {
	var seen []limiter.Exchange
	h := newHarness(t, cfgN(2), limiter.WithObserver(func(_ context.Context, e limiter.Event) {
		if e.Kind == limiter.Exchanged {
			seen = append(seen, e.Exchange)
		}
	}))
	ctx := context.Background()
	h.lim.RecordExchange(ctx, gw, limiter.Exchange{Outcome: limiter.OutcomeOK}) // no lane yet: neither counted nor told
	s := h.take(gw, "a", limiter.Default)
	s.Release()
	if l := h.lane(gw); l.Upstream != nil {
		t.Fatalf("upstream counts before any exchange in the lane: %+v", l.Upstream)
	}
	for _, x := range []limiter.Exchange{
		{Outcome: limiter.OutcomeOK, Status: 200},
		{Outcome: limiter.OutcomeServerError, Status: 502},
		{Outcome: limiter.OutcomeRateLimited, Status: 429, Retry: true},
		{Outcome: limiter.OutcomeStall},
		{Outcome: limiter.OutcomeTransportError, Retry: true},
		{Outcome: limiter.OutcomeClientError, Status: 400},
		{Outcome: limiter.OutcomeCanceled},
	} {
		h.lim.RecordExchange(ctx, gw, x)
	}
	h.clock.Advance(4 * time.Second)
	want := limiter.UpstreamCounts{OK: 1, ClientErrors: 1, RateLimited: 1, ServerErrors: 1, TransportErrors: 1, Stalls: 1, Canceled: 1, Retries: 2}
	got := h.lane(gw).Upstream
	if got == nil || got.LastErrorAge == nil || *got.LastErrorAge != 4 {
		t.Fatalf("upstream %+v: want the last error 4 s ago", got)
	}
	if got.LastErrorAge = nil; *got != want {
		t.Fatalf("upstream %+v, want %+v", got, want)
	}
	b, _ := json.Marshal(h.lane(gw))
	if !bytes.Contains(b, []byte(`"upstream_5m":{"ok":1,"client_errors":1,"rate_limited":1,"server_errors":1,"transport_errors":1,"stalls":1,"canceled":1,"client_stalls":0,"retries":2,"last_error_age_s":4.0}`)) {
		t.Fatalf("JSON %s", b)
	}
	if len(seen) != 7 {
		t.Fatalf("observer saw %d exchanges, want 7", len(seen))
	}
	// Errors only, no retry: the age goes on counting.
	h.lim.RecordExchange(ctx, gw, limiter.Exchange{Outcome: limiter.OutcomeOK, Retry: true})
	h.clock.Advance(6 * time.Second)
	if a := h.lane(gw).Upstream.LastErrorAge; a == nil || *a != 10 {
		t.Fatalf("last error age %v after an OK retry, want 10", a)
	}
	h.clock.Advance(310 * time.Second)
	if l := h.lane(gw); l.Upstream != nil {
		t.Fatalf("upstream counts after 5 minutes: %+v", l.Upstream)
	}
}
