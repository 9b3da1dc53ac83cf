package exporter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmlanes/llmlanes/dashboards"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// exportedNames drives an exporter through every kind of event (calls, a
// retry, a queue timeout, a target) and returns the names of the series its
// registry then exports: histograms as their _bucket, _sum and _count.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	up := newUpstream(t)
	close(up.hold)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"enabled":true,"generated_at":"2026-09-28T09:00:00Z","lanes":[{"lane":%q,"limit":6,"reserve":1,"inflight":1,"queued":0,
			"queued_by_priority":{"interactive":0,"default":0,"bulk":0},"oldest_wait_s":0.0,"wait_p50_s_5m":1.0,"wait_p90_s_5m":2.0,
			"queue_timeouts_5m":0,"saturated":false}]}`, up.srv.URL+"/v1|protolabs/smart")
	}))
	defer target.Close()
	cfg, err := ParseConfig("n.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: 1, queue_timeout: 10s, interactive_reserve: 0, tokens_per_minute: 10000000}
upstreams: [{name: gw, base_url: "%s/v1", capacity: 4}]
targets: [{name: vera, url: "%s", interval: 1h}]
`, up.srv.URL, target.URL)))
	if err != nil {
		t.Fatal(err)
	}
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	queued := make(chan struct{}, 4)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	srv, err := New(cfg, Options{Clock: clock, Base: base, Observers: []limiter.Observer{func(_ context.Context, e limiter.Event) {
		if e.Kind == limiter.Enqueued {
			queued <- struct{}{}
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	call := func(retry string) int {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(chat))
		req.Header.Set("X-Stainless-Retry-Count", retry)
		req.Header.Set(TenantHeader, "board-a") // the tenants' series exist once a call names one
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	call("0")
	call("1") // a retry
	held, _ := srv.Limiter().Acquire(context.Background(), up.srv.URL+"/v1|protolabs/smart")
	got := make(chan int, 1)
	go func() { got <- call("0") }()
	<-queued
	clock.Advance(10 * time.Second) // a queue timeout
	if code := <-got; code != 503 {
		t.Fatalf("queue timeout answered %d", code)
	}
	// A call whose client's timeout is within the deadline's margin: it
	// gives up at once (the callers-gave-up series exist from then).
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(chat))
	req.Header.Set("X-LLM-Timeout", "0.1")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("a call past its deadline: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	held.Release()
	for deadline := time.Now().Add(10 * time.Second); !srv.targets().sources()[0].Up; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("target never polled")
		}
	}
	families, err := srv.Telemetry().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	families = append(families, sharedFamilies(t, up.srv.URL)...)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}

// sharedFamilies are the metrics of an exporter whose lanes are shared in
// a real Redis, after one call: what only shared lanes export.
func sharedFamilies(t *testing.T, upstream string) []*dto.MetricFamily {
	r := redistest.Start(t)
	r.WaitUptime(time.Second) // no grant in a Redis' first lease
	cfg, err := ParseConfig("s.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: 2}
upstreams: [{name: gw, base_url: "%s/v1"}]
shared: {redis_url: "%s", lease_ttl: 1s}
`, upstream, r.URL())))
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	srv, err := New(cfg, Options{Base: base, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	postJSON(t, front.URL+"/proxy/gw/chat/completions", chat)
	held, err := srv.Limiter().Acquire(context.Background(), upstream+"/v1|protolabs/smart") // so that someone holds a slot
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	// A scrape waits for Redis at most limiter.SharedStateTimeout and
	// shows the last figures past it: on a loaded machine the first read
	// may miss, so read until this process's holder is in the figures.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if slices.ContainsFunc(srv.Limiter().Snapshot().Lanes, func(l limiter.LaneSnapshot) bool {
			return l.Shared.State == limiter.BackendOK && len(l.Shared.Holders) > 0
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis's figures never read: %+v", srv.Limiter().Snapshot().Lanes)
		}
	}
	families, err := srv.Telemetry().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// Every metric the alert rules use is one the exporter exports.
func TestRulesUseExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	rules, err := os.ReadFile("../../alerts/llmlanes.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bllmlanes_[a-zA-Z0-9_]+`).FindAllString(string(rules), -1) {
		used[m] = true
	}
	if len(used) < 6 {
		t.Fatalf("found only %v in the rules", used)
	}
	var missing []string
	for m := range used {
		if !names[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the rules use metrics the exporter does not export: %v", missing)
	}
}

// Every metric the dashboards query is one the exporter exports.
func TestDashboardsUseExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	files, err := dashboards.Files("llmlanes")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	count := 0
	for name, b := range files {
		exprs, err := dashboards.Exprs(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range exprs {
			for _, m := range regexp.MustCompile(`\bllmlanes_[a-zA-Z0-9_]+`).FindAllString(e, -1) {
				count++
				if !names[m] {
					missing = append(missing, name+": "+m)
				}
			}
		}
	}
	if count < 20 || len(missing) > 0 {
		t.Fatalf("%d metric references; not exported: %v", count, missing)
	}
}
