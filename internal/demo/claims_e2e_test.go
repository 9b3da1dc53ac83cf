//go:build e2e

package demo

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
)

// The README's claim about the demo, checked in real time (the demo is a
// real-time show): within a minute the classification (which the status
// page renders) shows a healthy lane, protolabs/smart as local_queue, and
// protolabs/fast as gateway_degraded once the faults start. Run with
// `make e2e`.
func TestDemoShowsEveryStateWithinAMinute(t *testing.T) {
	d, err := Start("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d.Stop(ctx)
	}()
	c := &classify.Client{BaseURL: "http://" + d.Listener.Addr}
	start := time.Now()
	seen := map[string]time.Duration{} // "model state" → first seen
	for time.Since(start) < time.Minute {
		rep, err := c.Report(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range rep.Lanes {
			k := l.Model + " " + string(l.State)
			if _, ok := seen[k]; !ok {
				seen[k] = time.Since(start).Round(time.Second)
				t.Logf("%s after %s", k, seen[k])
			}
		}
		if has(seen, "protolabs/smart local_queue") && has(seen, "protolabs/fast gateway_degraded") && hasState(seen, classify.Healthy) {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("within a minute the demo showed %v; the README promises a healthy lane, protolabs/smart local_queue and protolabs/fast gateway_degraded", seen)
}

func has(m map[string]time.Duration, k string) bool { _, ok := m[k]; return ok }

func hasState(m map[string]time.Duration, s classify.State) bool {
	for k := range m {
		if strings.HasSuffix(k, " "+string(s)) {
			return true
		}
	}
	return false
}
