package telemetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
	"github.com/llmlanes/llmlanes/telemetry"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

const lane = "https://gw/v1|protolabs/smart"

var t0 = time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)

// stack is a limiter on a fake clock, watched by a Telemetry.
type stack struct {
	t      *testing.T
	clock  *limitertest.Clock
	lim    *limiter.Limiter
	tel    *telemetry.Telemetry
	queued chan struct{}
}

func newStack(t *testing.T, cfg limiter.Config, o telemetry.Options) *stack {
	t.Helper()
	s := &stack{t: t, clock: limitertest.NewClock(t0), queued: make(chan struct{}, 100)}
	tel, err := telemetry.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	lim, err := limiter.New(cfg, limiter.WithClock(s.clock), limiter.WithObserver(tel.Observe),
		limiter.WithObserver(func(_ context.Context, e limiter.Event) {
			if e.Kind == limiter.Enqueued {
				s.queued <- struct{}{}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	tel.Watch(lim)
	s.lim, s.tel = lim, tel
	return s
}

func (s *stack) take(p limiter.Priority) *limiter.Slot {
	s.t.Helper()
	slot, err := s.lim.Acquire(limiter.WithPriority(context.Background(), p), lane)
	if err != nil {
		s.t.Fatal(err)
	}
	return &slot
}

// wait starts a call that must queue; its result arrives on the channel.
func (s *stack) wait(p limiter.Priority) chan result {
	ch := make(chan result, 1)
	go func() {
		slot, err := s.lim.Acquire(limiter.WithPriority(context.Background(), p), lane)
		ch <- result{&slot, err}
	}()
	<-s.queued
	return ch
}

type result struct {
	slot *limiter.Slot
	err  error
}

func (s *stack) get(path string, header ...string) (int, string, http.Header) {
	s.t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	s.tel.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), rec.Header()
}

// script drives the lane of DESIGN.md's metrics through a known history:
// limit 2 with one reserved slot, queue timeout 20 s.
//
//	t=0   A (default) and I (interactive) get slots at once: waits 0 and 0
//	t=0   B and D (bulk) queue: both slots are held
//	t=7   A and I release: B gets a slot after 7 s; D may not take the other, as
//	      one non-interactive call (B) already holds all that the reserve leaves
//	t=20  D times out after 20 s (a wait sample too); E (default) queues behind the cap
func script(s *stack) (cleanup func()) {
	a, i := s.take(limiter.Default), s.take(limiter.Interactive)
	b := s.wait(limiter.Bulk)
	d := s.wait(limiter.Bulk)
	s.clock.Advance(7 * time.Second)
	a.Release()
	i.Release()
	rb := <-b
	s.clock.Advance(13 * time.Second)
	if r := <-d; r.err == nil {
		s.t.Fatal("D got a slot")
	}
	e := s.wait(limiter.Default)
	return func() {
		rb.slot.Release()
		r := <-e
		r.slot.Release()
	}
}

func d8(prefix string) string {
	return strings.ReplaceAll(`# HELP P_llm_inflight Model calls holding a lane slot.
# TYPE P_llm_inflight gauge
P_llm_inflight{lane="https://gw/v1|protolabs/smart"} 1
# HELP P_llm_queue_depth Model calls waiting for a lane slot, by class.
# TYPE P_llm_queue_depth gauge
P_llm_queue_depth{lane="https://gw/v1|protolabs/smart",priority="bulk"} 0
P_llm_queue_depth{lane="https://gw/v1|protolabs/smart",priority="default"} 1
P_llm_queue_depth{lane="https://gw/v1|protolabs/smart",priority="interactive"} 0
# HELP P_llm_queue_timeouts_total Model calls that gave up waiting for a lane slot after the queue timeout.
# TYPE P_llm_queue_timeouts_total counter
P_llm_queue_timeouts_total{lane="https://gw/v1|protolabs/smart"} 1
# HELP P_llm_queue_wait_seconds Time model calls waited for a lane slot, by lane and class, until a grant (immediate grants count as 0) or a queue timeout (the whole wait).
# TYPE P_llm_queue_wait_seconds histogram
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="0.1"} 0
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="0.5"} 0
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="1"} 0
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="5"} 0
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="15"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="30"} 2
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="60"} 2
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="120"} 2
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="300"} 2
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="bulk",le="+Inf"} 2
P_llm_queue_wait_seconds_sum{lane="https://gw/v1|protolabs/smart",priority="bulk"} 27
P_llm_queue_wait_seconds_count{lane="https://gw/v1|protolabs/smart",priority="bulk"} 2
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="0.1"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="0.5"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="1"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="5"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="15"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="30"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="60"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="120"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="300"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="default",le="+Inf"} 1
P_llm_queue_wait_seconds_sum{lane="https://gw/v1|protolabs/smart",priority="default"} 0
P_llm_queue_wait_seconds_count{lane="https://gw/v1|protolabs/smart",priority="default"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="0.1"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="0.5"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="1"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="5"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="15"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="30"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="60"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="120"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="300"} 1
P_llm_queue_wait_seconds_bucket{lane="https://gw/v1|protolabs/smart",priority="interactive",le="+Inf"} 1
P_llm_queue_wait_seconds_sum{lane="https://gw/v1|protolabs/smart",priority="interactive"} 0
P_llm_queue_wait_seconds_count{lane="https://gw/v1|protolabs/smart",priority="interactive"} 1
`, "P_", prefix+"_")
}

// 1. The design record's series (docs/DESIGN.md, "Metrics") after a scripted scenario, exactly, for two prefixes.
func TestDesignSeriesExactly(t *testing.T) {
	for _, prefix := range []string{"", "protoagent"} {
		want := prefix
		if want == "" {
			want = telemetry.DefaultPrefix
		}
		t.Run(want, func(t *testing.T) {
			s := newStack(t, limiter.Config{MaxInflight: 2, QueueTimeout: 20 * time.Second, InteractiveReserve: 1}, telemetry.Options{Prefix: prefix})
			defer script(s)()
			names := []string{want + "_llm_inflight", want + "_llm_queue_depth", want + "_llm_queue_wait_seconds", want + "_llm_queue_timeouts_total"}
			if err := testutil.GatherAndCompare(s.tel.Registry(), strings.NewReader(d8(want)), names...); err != nil {
				t.Fatal(err)
			}
			// And the same through the /metrics route.
			code, body, _ := s.get("/metrics")
			if code != 200 || !strings.Contains(body, want+`_llm_queue_timeouts_total{lane="https://gw/v1|protolabs/smart"} 1`) {
				t.Fatalf("/metrics %d:\n%s", code, body)
			}
		})
	}
}

// The series beyond the design record's that dashboards and alerts use.
func TestExtraSeries(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 2, QueueTimeout: 20 * time.Second, InteractiveReserve: 1}, telemetry.Options{})
	defer script(s)()
	ctx := context.Background()
	s.lim.RecordExchange(ctx, lane, limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200, FirstByte: 300 * time.Millisecond})
	s.lim.RecordExchange(ctx, lane, limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 502, Retry: true})
	_, body, _ := s.get("/metrics")
	for _, want := range []string{
		`llmlanes_llm_limit{lane="https://gw/v1|protolabs/smart"} 2`,
		`llmlanes_llm_reserve{lane="https://gw/v1|protolabs/smart"} 1`,
		`llmlanes_llm_saturated{lane="https://gw/v1|protolabs/smart"} 0`,
		`llmlanes_llm_oldest_wait_seconds{lane="https://gw/v1|protolabs/smart"} 0`,
		`llmlanes_llm_upstream_requests_total{lane="https://gw/v1|protolabs/smart",outcome="ok"} 1`,
		`llmlanes_llm_upstream_requests_total{lane="https://gw/v1|protolabs/smart",outcome="server_error"} 1`,
		`llmlanes_llm_upstream_retries_total{lane="https://gw/v1|protolabs/smart"} 1`,
		`llmlanes_llm_upstream_first_byte_seconds_bucket{lane="https://gw/v1|protolabs/smart",le="0.5"} 1`,
		`llmlanes_llm_lane_state{lane="https://gw/v1|protolabs/smart",state="idle"} 0`,
		`llmlanes_llm_lane_state{lane="https://gw/v1|protolabs/smart",state="healthy"} 0`,
		`llmlanes_llm_lane_state{lane="https://gw/v1|protolabs/smart",state="local_queue"} 1`,
		`llmlanes_llm_lane_state{lane="https://gw/v1|protolabs/smart",state="gateway_degraded"} 0`,
		`llmlanes_llm_lane_reason{lane="https://gw/v1|protolabs/smart",reason="queue_timeouts"} 1`,
		`llmlanes_llm_lane_reason{lane="https://gw/v1|protolabs/smart",reason="saturated"} 0`,
		`llmlanes_llm_lane_reason{lane="https://gw/v1|protolabs/smart",reason="upstream_errors"} 0`,
		`llmlanes_llm_queue_cancellations_total{lane="https://gw/v1|protolabs/smart"} 0`,
		"go_goroutines ", "process_cpu_seconds_total ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// No label changes with every scrape: the hold text is in the JSON
	// routes and on the status page, not in a label.
	if strings.Contains(body, "hold_text") || strings.Contains(body, "hold_info") {
		t.Error("/metrics carries the hold text in a label")
	}
	_, cls, _ := s.get("/api/telemetry/llm-lanes/classification?lane=" + url.QueryEscape(lane))
	// Waits 0, 0, 7 and 20 (D's timeout): p90 16.1 s.
	if !strings.Contains(cls, `"hold_text":"gate queue: 1 call waiting, p90 wait 16 s, 1 queue timeout in 5 min"`) {
		t.Errorf("classification %s", cls)
	}
}

// 2. The exposition passes the client_golang linter (promtool's rules).
func TestExpositionLints(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 2, QueueTimeout: 20 * time.Second, InteractiveReserve: 1}, telemetry.Options{Prefix: "protoagent"})
	defer script(s)()
	s.lim.RecordExchange(context.Background(), lane, limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200, FirstByte: time.Second})
	problems, err := testutil.GatherAndLint(s.tel.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestBadPrefixRefused(t *testing.T) {
	for _, p := range []string{"9lives", "my-app", "a b"} {
		if _, err := telemetry.New(telemetry.Options{Prefix: p}); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("prefix %q: err %v", p, err)
		}
	}
}

// noNetwork fails the test if anything is fetched while it is in force.
type noNetwork struct{ t *testing.T }

func (n noNetwork) RoundTrip(r *http.Request) (*http.Response, error) {
	n.t.Errorf("network call to %s while serving telemetry", r.URL)
	return nil, fmt.Errorf("no network")
}

// 4. The snapshot route is the limiter's snapshot, in DESIGN.md's keys.
func TestSnapshotRoute(t *testing.T) {
	old := http.DefaultTransport
	http.DefaultTransport = noNetwork{t}
	defer func() { http.DefaultTransport = old }()

	s := newStack(t, limiter.Config{MaxInflight: 2, QueueTimeout: 20 * time.Second, InteractiveReserve: 1}, telemetry.Options{})
	defer script(s)()
	code, body, h := s.get("/api/telemetry/llm-lanes")
	want, _ := json.Marshal(s.lim.Snapshot())
	if code != 200 || strings.TrimSpace(body) != string(want) || h.Get("Content-Type") != "application/json" {
		t.Fatalf("route %d %s:\n%s\nwant\n%s", code, h.Get("Content-Type"), body, want)
	}
	var got map[string]any
	_ = json.Unmarshal([]byte(body), &got)
	l := got["lanes"].([]any)[0].(map[string]any)
	for _, k := range []string{"lane", "limit", "reserve", "inflight", "queued", "queued_by_priority", "oldest_wait_s",
		"wait_p50_s_5m", "wait_p90_s_5m", "queue_timeouts_5m", "saturated"} {
		if _, ok := l[k]; !ok {
			t.Errorf("key %q missing", k)
		}
	}
	for _, k := range []string{"enabled", "generated_at", "lanes"} {
		if _, ok := got[k]; !ok {
			t.Errorf("top-level key %q missing", k)
		}
	}
}

func TestRoutesWhenOff(t *testing.T) {
	s := newStack(t, limiter.DefaultConfig(), telemetry.Options{})
	for path, want := range map[string]string{
		"/api/telemetry/llm-lanes":                                    `{"enabled":false}`,
		"/api/telemetry/llm-lanes/classification":                     `{"version":1,"enabled":false}`,
		"/api/telemetry/llm-lanes/classification?lane=" + lane:        `{"version":1,"enabled":false}`,
		"/api/telemetry/llm-lanes/classification?upstream=gw&model=m": `{"version":1,"enabled":false}`,
	} {
		code, body, _ := s.get(path)
		if code != 200 || strings.TrimSpace(body) != want {
			t.Fatalf("%s: %d %q, want %s", path, code, body, want)
		}
	}
}

// A lane whose every caller times out after 300 s reports p50 and p90 of
// 300 s, and its waits land in the histogram's 300 s bucket.
func TestTimedOutLaneNeverLooksFast(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 1}, telemetry.Options{}) // queue timeout 300 s
	held := s.take(limiter.Default)
	s.clock.Advance(20 * time.Second) // the holder's 0 s leaves the window before the timeouts do
	var waiting []chan result
	for range 4 {
		waiting = append(waiting, s.wait(limiter.Bulk))
	}
	s.clock.Advance(300 * time.Second)
	for _, w := range waiting {
		if r := <-w; !errors.Is(r.err, limiter.ErrQueueTimeout) {
			t.Fatalf("err %v, want a queue timeout", r.err)
		}
	}
	_, snap, _ := s.get("/api/telemetry/llm-lanes")
	if !strings.Contains(snap, `"wait_p50_s_5m":300.0,"wait_p90_s_5m":300.0,"queue_timeouts_5m":4`) {
		t.Fatalf("snapshot %s", snap)
	}
	_, metrics, _ := s.get("/metrics")
	for _, want := range []string{
		`llmlanes_llm_queue_wait_seconds_bucket{lane="` + lane + `",priority="bulk",le="120"} 0`,
		`llmlanes_llm_queue_wait_seconds_bucket{lane="` + lane + `",priority="bulk",le="300"} 4`,
		`llmlanes_llm_queue_wait_seconds_sum{lane="` + lane + `",priority="bulk"} 1200`,
		`llmlanes_llm_queue_timeouts_total{lane="` + lane + `"} 4`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	held.Release()
}

func TestRoutesAreReadOnly(t *testing.T) {
	s := newStack(t, limiter.DefaultConfig(), telemetry.Options{})
	for _, path := range []string{"/metrics", "/api/telemetry/llm-lanes", "/api/telemetry/llm-lanes/classification", "/healthz"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
			rec := httptest.NewRecorder()
			s.tel.Handler().ServeHTTP(rec, httptest.NewRequest(m, path, strings.NewReader("{}")))
			if rec.Code != http.StatusMethodNotAllowed {
				t.Fatalf("%s %s: %d", m, path, rec.Code)
			}
		}
	}
	if code, body, _ := s.get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
}

// 6. A saturated lane end to end: limiter, snapshot, classification,
// metrics.
func TestSaturatedLaneThroughRoutes(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 1}, telemetry.Options{})
	held := s.take(limiter.Default)
	var waiting []chan result
	for range 3 {
		waiting = append(waiting, s.wait(limiter.Bulk))
	}
	s.clock.Advance(90 * time.Second)

	code, body, _ := s.get("/api/telemetry/llm-lanes/classification?lane=" + lane)
	var c classify.Classification
	if err := json.Unmarshal([]byte(body), &c); code != 200 || err != nil {
		t.Fatalf("%d %v %s", code, err, body)
	}
	if c.State != classify.LocalQueue || c.Reasons[0] != classify.ReasonSaturated || !c.LaneSaturated || c.LaneQueueDepth != 3 {
		t.Fatalf("classification %+v", c)
	}
	if c.HoldText != "gate queue: 3 calls waiting, p90 wait 0 s" {
		t.Fatalf("hold text %q", c.HoldText)
	}
	_, all, _ := s.get("/api/telemetry/llm-lanes/classification")
	if !strings.Contains(all, `"state":"local_queue"`) || !strings.Contains(all, `"thresholds":{"wait_p90_s":30`) {
		t.Fatalf("all lanes: %s", all)
	}
	if code, _, _ := s.get("/api/telemetry/llm-lanes/classification?lane=nope"); code != 404 {
		t.Fatalf("unknown lane: %d", code)
	}
	_, snap, _ := s.get("/api/telemetry/llm-lanes")
	if !strings.Contains(snap, `"saturated":true`) || !strings.Contains(snap, `"oldest_wait_s":90.0`) {
		t.Fatalf("snapshot %s", snap)
	}
	_, metrics, _ := s.get("/metrics")
	for _, want := range []string{
		`llmlanes_llm_saturated{lane="` + lane + `"} 1`,
		`llmlanes_llm_queue_depth{lane="` + lane + `",priority="bulk"} 3`,
		`llmlanes_llm_lane_state{lane="` + lane + `",state="local_queue"} 1`,
		`llmlanes_llm_oldest_wait_seconds{lane="` + lane + `"} 90`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	held.Release()
	for _, w := range waiting {
		r := <-w
		r.slot.Release()
	}
}

var _ = io.EOF

// Lookups by lane key and by configured upstream and model; the payload is
// versioned, and a configured upstream's lane with no call yet is idle.
func TestClassificationLookups(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 2, InteractiveReserve: 1}, telemetry.Options{})
	s.tel.SetUpstreams(map[string]string{"gw": "HTTPS://GW:443/v1/", "other": "https://other.example/api"})
	slot := s.take(limiter.Default)
	defer slot.Release()
	get := func(q string) (int, map[string]any) {
		t.Helper()
		code, body, _ := s.get("/api/telemetry/llm-lanes/classification" + q)
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%s: %v: %s", q, err, body)
		}
		if m["version"] != 1.0 {
			t.Fatalf("%s: no version 1: %s", q, body)
		}
		return code, m
	}
	for _, c := range []struct {
		query, state, upstream string
		code                   int
	}{
		{"?upstream=gw&model=protolabs/smart", "healthy", "gw", 200},
		{"?lane=" + url.QueryEscape(lane), "healthy", "gw", 200},
		{"?upstream=gw&model=protolabs/fast", "idle", "gw", 200}, // never called
		{"?upstream=other&model=m", "idle", "other", 200},
		{"?lane=" + url.QueryEscape("https://other.example/api|m"), "idle", "other", 200},
		{"?upstream=nope&model=m", "", "", 404},
		{"?lane=" + url.QueryEscape("https://unknown/v1|m"), "", "", 404},
		{"?upstream=gw", "", "", 400},
		{"?upstream=gw&model=m&lane=x", "", "", 400},
	} {
		code, m := get(c.query)
		if code != c.code {
			t.Fatalf("%s: %d, want %d (%v)", c.query, code, c.code, m)
		}
		if code != 200 {
			if m["error"] == "" {
				t.Fatalf("%s: no error message: %v", c.query, m)
			}
			continue
		}
		if m["state"] != c.state || m["upstream"] != c.upstream || m["hold_text"] == "" {
			t.Fatalf("%s: %v, want state %s upstream %s", c.query, m, c.state, c.upstream)
		}
		for _, k := range []string{"lane", "model", "reasons", "lane_queue_depth", "lane_wait_p90_s", "lane_saturated", "eta_s", "counts"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("%s: key %q missing: %v", c.query, k, m)
			}
		}
	}
	_, all := get("")
	if all["enabled"] != true || len(all["lanes"].([]any)) != 1 {
		t.Fatalf("report %v", all)
	}
}

// An evicted lane leaves every metric: its gauges, counters, histograms and
// states are gone from /metrics, not left stale; another lane's stay.
func TestEvictedLaneLeavesMetrics(t *testing.T) {
	cfg := limiter.Config{MaxInflight: 2, LaneIdleTTL: 10 * time.Minute}
	s := newStack(t, cfg, telemetry.Options{})
	const other = "https://gw/v1|other"
	slot := s.take(limiter.Default)
	s.lim.RecordExchange(context.Background(), lane, limiter.Exchange{Outcome: limiter.OutcomeOK, FirstByte: time.Second})
	slot.Release()
	_, before, _ := s.get("/metrics")
	for _, m := range []string{"llm_inflight", "llm_queue_depth", "llm_queue_wait_seconds_bucket", "llm_queue_timeouts_total",
		"llm_upstream_requests_total", "llm_upstream_first_byte_seconds_bucket", "llm_lane_state", "llm_lane_reason"} {
		if !strings.Contains(before, "llmlanes_"+m+`{lane="`+lane+`"`) {
			t.Fatalf("before eviction /metrics lacks %s for the lane", m)
		}
	}
	s.clock.Advance(6 * time.Minute)
	keep, err := s.lim.Acquire(context.Background(), other) // stays busy
	if err != nil {
		t.Fatal(err)
	}
	s.clock.Advance(6 * time.Minute)
	_, after, _ := s.get("/metrics")
	if strings.Contains(after, `lane="`+lane+`"`) {
		t.Fatalf("series of the evicted lane remain:\n%s", after)
	}
	if !strings.Contains(after, `llmlanes_llm_inflight{lane="`+other+`"} 1`) {
		t.Fatal("the busy lane's series are gone too")
	}
	keep.Release()
}

// With an adaptive limit, {p}_llm_limit and the reserve are the lane's
// current ones: the probe's limit first, then the initial limit.
func TestAdaptiveLimitSeries(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 8, QueueTimeout: time.Minute, InteractiveReserve: 1,
		Adaptive: &limiter.Adaptive{MinInflight: 1, Initial: 4}}, telemetry.Options{})
	slot := s.take(limiter.Default)
	_, body, _ := s.get("/metrics")
	for _, want := range []string{`llmlanes_llm_limit{lane="` + lane + `"} 1`, `llmlanes_llm_reserve{lane="` + lane + `"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("during the probe, /metrics lacks %q", want)
		}
	}
	s.lim.RecordFirstByte(context.Background(), lane, limiter.FirstByte{Sent: s.clock.Now(), After: time.Second, RequestBytes: 1000})
	slot.Release()
	_, body, _ = s.get("/metrics")
	for _, want := range []string{`llmlanes_llm_limit{lane="` + lane + `"} 4`, `llmlanes_llm_reserve{lane="` + lane + `"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("after the probe, /metrics lacks %q", want)
		}
	}
}
