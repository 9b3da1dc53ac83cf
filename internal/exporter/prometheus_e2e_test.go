//go:build e2e

package exporter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/llmlanes/llmlanes/dashboards"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
)

// A real Prometheus (Debian's, installed by `make tools`) scrapes a
// lanes-exporter that has one saturated lane in front of a healthy gateway
// and one free lane in front of a failing gateway. The rules (with their
// `for` shortened to 5 s, rewritten from alerts/llmlanes.rules.yml) load
// with health ok; LLMLanesLaneSaturated and LLMLanesGatewayDegraded reach
// pending or firing, each for the right lane; and every dashboard query
// returns data: a second exporter, whose lanes are shared in a real Redis
// and whose limit is adaptive, is scraped too, for the panels of shared
// and adaptive lanes.
func TestPrometheusEndToEnd(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found: `make tools` installs Debian's prometheus (%v)", err)
	}
	healthy := gatewaysim.New(gatewaysim.Config{Capacity: 8, TokenTime: 100 * time.Millisecond, Tokens: 20, PropagateDisconnect: true})
	failing := gatewaysim.New(gatewaysim.Config{Capacity: 8, TokenTime: 5 * time.Millisecond, Tokens: 5, ServerError: 0.5, PropagateDisconnect: true})
	hs, fs := httptest.NewServer(healthy), httptest.NewServer(failing)
	defer hs.Close()
	defer fs.Close()
	defer healthy.Close()
	defer failing.Close()
	// Another process's snapshot, for the target panels.
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"enabled":true,"generated_at":"2026-09-28T09:00:00Z","lanes":[{"lane":"%s/v1|m","limit":3,"reserve":1,"inflight":1,"queued":0,
			"queued_by_priority":{"interactive":0,"default":0,"bulk":0},"oldest_wait_s":0.0,"wait_p50_s_5m":1.0,"wait_p90_s_5m":2.0,
			"queue_timeouts_5m":0,"saturated":false}]}`, hs.URL)
	}))
	defer target.Close()
	cfg, err := ParseConfig("e2e.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: 2, queue_timeout: 600s, interactive_reserve: 0, tokens_per_minute: 100000000}
upstreams:
  - {name: healthy, base_url: "%s/v1", capacity: 8}
  - {name: failing, base_url: "%s/v1", capacity: 8}
targets: [{name: vera, url: "%s", interval: 1s}]
`, hs.URL, fs.URL, target.URL)))
	if err != nil {
		t.Fatal(err)
	}
	// Tracing on (sampled, exported nowhere): the wait histogram's
	// exemplars then carry trace ids, which Prometheus must store.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	srv, err := New(cfg, Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Start(srv, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(context.Background())
	shared := startShared(t, hs.URL)

	// The load: six workers keep the healthy lane's queue full; one worker
	// calls the failing gateway every 300 ms and retries its 5xx once. Every
	// call names a tenant.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	call := func(upstream string, retry int) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.Addr+"/proxy/"+upstream+"/chat/completions",
			strings.NewReader(`{"model":"m","stream":true}`))
		req.Header.Set("X-Stainless-Retry-Count", fmt.Sprint(retry))
		req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01") // every call in one caller's trace
		req.Header.Set(TenantHeader, "board-a")                             // the lane-detail dashboard's tenant panels have data
		res, err := client.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				call("healthy", 0)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if call("failing", 0) >= 500 {
				call("failing", 1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	// And one caller whose timeout (X-LLM-Timeout, 0.2 s) the full healthy
	// lane cannot meet, every 2 s: answered at once, it gives up (the
	// callers-giving-up series have data).
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.Addr+"/proxy/healthy/chat/completions",
				strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set("X-LLM-Timeout", "0.2")
			if res, err := client.Do(req); err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()

	// Prometheus, scraping every second, with the rules' `for` shortened.
	dir := t.TempDir()
	src, err := os.ReadFile("../../alerts/llmlanes.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	short := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(src, []byte("$1 5s"))
	os.WriteFile(filepath.Join(dir, "rules.yml"), short, 0o644)
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fmt.Sprintf(`
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yml]
scrape_configs:
  - job_name: lanes-exporter
    static_configs: [{targets: ["%s", "%s"]}]
`, l.Addr, shared)), 0o644)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	promAddr := ln.Addr().String()
	ln.Close()
	prom := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn", "--enable-feature=exemplar-storage")
	prom.Stderr = os.Stderr
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { prom.Process.Kill(); prom.Wait() }()
	api := func(path string, v any) error {
		res, err := http.Get("http://" + promAddr + path)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		return json.NewDecoder(res.Body).Decode(v)
	}

	// The alerts: saturation on the healthy lane (after 60 s of queueing),
	// gateway degraded on the failing one.
	want := map[string]string{"LLMLanesLaneSaturated": hs.URL + "/v1|m", "LLMLanesGatewayDegraded": fs.URL + "/v1|m"}
	seen := map[string]string{}
	for deadline := time.Now().Add(150 * time.Second); len(seen) < len(want); time.Sleep(2 * time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("alerts reached: %v, want %v", seen, want)
		}
		var r struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string
					State  string
				}
			}
		}
		if api("/api/v1/alerts", &r) != nil {
			continue
		}
		for _, a := range r.Data.Alerts {
			name, lane := a.Labels["alertname"], a.Labels["lane"]
			if want[name] != "" && (a.State == "pending" || a.State == "firing") {
				if lane != want[name] {
					t.Fatalf("%s on lane %s, want %s", name, lane, want[name])
				}
				seen[name] = a.State
			}
		}
	}
	t.Logf("alerts: %v", seen)

	// The rules load with health ok.
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct{ Name, Health, LastError string }
			}
		}
	}
	if err := api("/api/v1/rules", &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %s %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if n != 10 {
		t.Errorf("%d rules loaded, want 10", n)
	}

	// Prometheus stored an exemplar of the wait histogram whose trace id
	// is the callers' trace: the dashboards' exemplar links point at it.
	var ex struct {
		Status string
		Data   []struct {
			Exemplars []struct{ Labels map[string]string }
		}
	}
	now := time.Now()
	q := "/api/v1/query_exemplars?query=" + url.QueryEscape("llmlanes_llm_queue_wait_seconds_bucket") +
		fmt.Sprintf("&start=%d&end=%d", now.Add(-10*time.Minute).Unix(), now.Unix())
	if err := api(q, &ex); err != nil || ex.Status != "success" {
		t.Fatalf("query_exemplars: %v %s", err, ex.Status)
	}
	found := false
	for _, d := range ex.Data {
		for _, e := range d.Exemplars {
			found = found || e.Labels["trace_id"] == traceID
		}
	}
	if !found {
		t.Errorf("no exemplar with trace id %s stored by Prometheus: %+v", traceID, ex.Data)
	}

	// The GenAI conventions' metrics, under their Prometheus names, no
	// prefix: the calls' durations with the failing gateway's error_type,
	// the tokens by type, the streams' chunk timings.
	for _, q := range []string{
		`gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",server_address="127.0.0.1"}`,
		`gen_ai_client_operation_duration_seconds_count{error_type=~"5.."}`,
		`gen_ai_client_token_usage_sum{gen_ai_token_type="input"}`,
		`gen_ai_client_token_usage_sum{gen_ai_token_type="output"}`,
		`gen_ai_client_operation_time_to_first_chunk_seconds_count`,
		`gen_ai_client_operation_time_per_output_chunk_seconds_count`,
	} {
		var r struct {
			Status string
			Data   struct{ Result []json.RawMessage }
		}
		if err := api("/api/v1/query?query="+url.QueryEscape(q), &r); err != nil || r.Status != "success" || len(r.Data.Result) == 0 {
			t.Errorf("%s: no series in Prometheus (%v)", q, err)
		}
	}

	// Every dashboard query returns data.
	files, _ := dashboards.Files("llmlanes")
	for name, b := range files {
		exprs, _ := dashboards.Exprs(b)
		for _, e := range exprs {
			var r struct {
				Status string
				Error  string
				Data   struct{ Result []json.RawMessage }
			}
			if err := api("/api/v1/query?query="+url.QueryEscape(dashboards.Substitute(e)), &r); err != nil || r.Status != "success" {
				t.Errorf("%s: %s: %v %s", name, e, err, r.Error)
				continue
			}
			if len(r.Data.Result) == 0 {
				t.Errorf("%s: no data for %s", name, e)
			}
		}
	}
}

// startShared starts a lanes-exporter whose lanes are shared in a real
// Redis and whose limit is adaptive, holding one slot of the lane in front
// of upstream for the rest of the test (so that the holders' panel has a
// holder at every scrape), and returns its address.
func startShared(t *testing.T, upstream string) string {
	r := redistest.Start(t)
	r.WaitUptime(time.Second) // no grant in a Redis' first lease
	cfg, err := ParseConfig("shared.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: 3, adaptive: {min_inflight: 1}}
upstreams: [{name: healthy, base_url: "%s/v1"}]
shared: {redis_url: "%s", lease_ttl: 1s}
`, upstream, r.URL())))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Start(srv, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Shutdown(context.Background()) })
	postJSON(t, "http://"+l.Addr+"/proxy/healthy/chat/completions", `{"model":"m"}`)
	held, err := srv.Limiter().Acquire(context.Background(), upstream+"/v1|m")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Release)
	return l.Addr
}
