package telemetry_test

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// 3 (exemplars). A wait sample taken inside a sampled trace carries its
// trace id in the OpenMetrics exposition, so a dashboard can jump from a
// slow bucket to the trace.
func TestWaitHistogramExemplar(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	s := newStack(t, limiter.Config{MaxInflight: 1}, telemetry.Options{TracerProvider: tp})
	ctx, call := tp.Tracer("test").Start(context.Background(), "llm.call")
	slot, err := s.lim.Acquire(limiter.WithPriority(ctx, limiter.Interactive), lane)
	if err != nil {
		t.Fatal(err)
	}
	slot.Release()
	call.End()
	traceID := call.SpanContext().TraceID().String()

	_, body, h := s.get("/metrics", "Accept", "application/openmetrics-text; version=1.0.0")
	if !strings.HasPrefix(h.Get("Content-Type"), "application/openmetrics-text") {
		t.Fatalf("content type %q", h.Get("Content-Type"))
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `llmlanes_llm_queue_wait_seconds_bucket{lane="`+lane+`",priority="interactive"`) &&
			strings.Contains(line, `trace_id="`+traceID+`"`) {
			return
		}
	}
	t.Fatalf("no wait bucket carries trace %s:\n%s", traceID, grep(body, "queue_wait"))
}

func grep(body, s string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
