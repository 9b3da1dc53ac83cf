package classify_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// The client against a real telemetry server: a lane by upstream and model,
// an idle one, an unknown upstream, and the limiter off.
func TestClientAgainstTelemetry(t *testing.T) {
	tel, err := telemetry.New(telemetry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	lim, _ := limiter.New(limiter.Config{MaxInflight: 2}, limiter.WithObserver(tel.Observe))
	tel.Watch(lim)
	tel.SetUpstreams(map[string]string{"gw": "https://gw/v1"})
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	c := &classify.Client{BaseURL: srv.URL + "/"}
	ctx := context.Background()

	s, _ := lim.Acquire(ctx, lane)
	defer s.Release()
	got, err := c.Model(ctx, "gw", "protolabs/smart")
	if err != nil || got.State != classify.Healthy || got.Upstream != "gw" || got.Model != "protolabs/smart" || got.Counts.Inflight != 1 {
		t.Fatalf("Model = %+v, %v", got, err)
	}
	if got, err := c.Lane(ctx, lane, ""); err != nil || got.Lane != lane {
		t.Fatalf("Lane = %+v, %v", got, err)
	}
	if got, err := c.Model(ctx, "gw", "other"); err != nil || got.State != classify.Idle {
		t.Fatalf("a model with no call: %+v, %v", got, err)
	}
	if _, err := c.Model(ctx, "nope", "m"); !errors.Is(err, classify.ErrNotFound) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown upstream: %v", err)
	}
	rep, err := c.Report(ctx)
	if err != nil || !rep.Enabled || len(rep.Lanes) != 1 || rep.Version != 1 || rep.Thresholds.WaitP90S != 30 {
		t.Fatalf("Report = %+v, %v", rep, err)
	}
	if err := lim.SetConfig(limiter.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Model(ctx, "gw", "protolabs/smart"); !errors.Is(err, classify.ErrDisabled) {
		t.Fatalf("limiter off: %v", err)
	}
	if _, err := c.Report(ctx); !errors.Is(err, classify.ErrDisabled) {
		t.Fatalf("limiter off: %v", err)
	}
}

// A payload of another version, or not the classification at all, is an
// error, not a misread.
func TestClientRefusesOtherPayloads(t *testing.T) {
	for body, want := range map[string]string{
		`{"version":2,"enabled":true,"lanes":[]}`: "payload version 2",
		`<html>hello</html>`:                      "not the classification JSON",
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		_, err := (&classify.Client{BaseURL: srv.URL}).Report(context.Background())
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", body, err, want)
		}
	}
}

func ExampleClient() {
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What lanes-exporter answers for ?upstream=gw&model=protolabs/smart.
		io.WriteString(w, `{"version":1,"lane":"https://gw/v1|protolabs/smart","upstream":"gw","model":"protolabs/smart",
			"state":"local_queue","reasons":["saturated","wait_p90"],"lane_queue_depth":9,"lane_wait_p90_s":171.0,
			"lane_saturated":true,"eta_s":{"interactive":0.0,"default":95.5,"bulk":240.0},"counts":{},
			"hold_text":"gate queue: 9 calls waiting, p90 wait 171 s"}`)
	}))
	defer exporter.Close()

	c := &classify.Client{BaseURL: exporter.URL, HTTP: &http.Client{Timeout: 5 * time.Second}}
	lane, err := c.Model(context.Background(), "gw", "protolabs/smart")
	if err != nil {
		fmt.Println("cannot tell:", err)
		return
	}
	switch lane.State {
	case classify.LocalQueue:
		fmt.Printf("throttling on purpose; a bulk call would wait about %.0f s\n", float64(*lane.ETA.Bulk))
	case classify.GatewayDegraded:
		fmt.Println("the gateway is failing")
	}
	fmt.Println(lane.HoldText)
	// Output:
	// throttling on purpose; a bulk call would wait about 240 s
	// gate queue: 9 calls waiting, p90 wait 171 s
}
