package demo

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The demo starts, drives calls through the proxy to the simulator, serves
// every route, and stops cleanly.
func TestDemo(t *testing.T) {
	d, err := Start("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.Listener.Addr
	// The first chat and coder calls go out at once; wait until one is done.
	for deadline := time.Now().Add(20 * time.Second); d.Sim.Stats().Completed == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no demo call completed")
		}
	}
	for path, want := range map[string]string{
		"/":                        "llmlanes: lanes",
		"/api/telemetry/llm-lanes": `"lane":"http://127.0.0.1:`,
		"/api/telemetry/llm-lanes/classification": `"hold_text":`,
		"/metrics": `llmlanes_llm_upstream_requests_total{lane="http://127.0.0.1:`,
		"/healthz": "ok",
	} {
		if code, body := get(t, base+path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("%s: %d, lacks %q", path, code, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// Against the LiteLLM-like gateway, the demo's panel bursts meet its
// max_parallel_requests (3, below the lanes' 4): its concurrency 429s show
// in the classification as the gateway_concurrency reason.
func TestDemoLiteLLM(t *testing.T) {
	d, err := StartGateway("127.0.0.1:0", exporterOptions(), GatewayLiteLLM)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.Listener.Addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, body := get(t, base+"/api/telemetry/llm-lanes/classification")
		if strings.Contains(body, `"gateway_concurrency"`) && d.Sim.Stats().ConcurrencyRefused > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gateway_concurrency reason in 30 s: %s; gateway %+v", body, d.Sim.Stats())
		}
	}
	if _, err := StartGateway("127.0.0.1:0", exporterOptions(), "bogus"); err == nil || !strings.Contains(err.Error(), "litellm") {
		t.Fatalf("an unknown gateway: %v, want an error naming the choices", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func exporterOptions() exporter.Options {
	return exporter.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}
