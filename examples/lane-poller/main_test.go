package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/demo"
)

// The poller runs against lanes-exporter --demo: one lane by upstream and
// model (answered even before its first call), then every lane.
func TestPollerAgainstDemo(t *testing.T) {
	d, err := demo.Start("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d.Stop(ctx)
	}()
	base := "http://" + d.Listener.Addr
	ctx := context.Background()

	var out bytes.Buffer
	// A model the demo never calls: its lane is idle, not unknown.
	if err := run(ctx, []string{"-exporter", base, "-upstream", "sim", "-model", "never/called", "-count", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sim|never/called  idle") || !strings.Contains(out.String(), "gate idle: no call in the last 5 min") {
		t.Fatalf("idle lane:\n%s", out.String())
	}

	out.Reset()
	if err := run(ctx, []string{"-exporter", base, "-upstream", "sim", "-model", "protolabs/smart", "-count", "3", "-every", "50ms"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		known := false
		for _, s := range classify.States() {
			known = known || strings.Contains(l, "sim|protolabs/smart  "+string(s))
		}
		if !known || !strings.Contains(l, "wait now: interactive ") || !strings.Contains(l, "gate") {
			t.Fatalf("line %q: want the lane, a state, the estimated waits and a hold text", l)
		}
	}

	// Every lane, once the demo's calls have made some.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out.Reset()
		if err := run(ctx, []string{"-exporter", base, "-count", "1"}, &out); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "sim|protolabs/smart") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lanes listed:\n%s", out.String())
		}
	}

	if err := run(ctx, []string{"-exporter", base, "-upstream", "sim"}, &out); err == nil {
		t.Fatal("accepted -upstream without -model")
	}
	out.Reset()
	if err := run(ctx, []string{"-exporter", base, "-upstream", "nope", "-model", "m", "-count", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "not found") {
		t.Fatalf("unknown upstream: %s", out.String())
	}
}
