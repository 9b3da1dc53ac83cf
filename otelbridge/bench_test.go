package otelbridge_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/otelbridge"
)

// BenchmarkBridge measures one model call's limiter events (acquire,
// release, exchange) with no bridge, with the bridge on the no-op
// providers (no OpenTelemetry SDK installed), and with the SDK recording
// metrics and, inside a sampled call span, the queue-wait and upstream
// spans.
func BenchmarkBridge(b *testing.B) {
	const lane = "https://gw/v1|protolabs/smart"
	run := func(b *testing.B, lim *limiter.Limiter, ctx context.Context) {
		x := limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200, FirstByte: 300 * time.Millisecond, Sent: time.Now(), Duration: time.Second}
		b.ReportAllocs()
		for b.Loop() {
			s, _ := lim.Acquire(ctx, lane)
			lim.RecordExchange(ctx, lane, x)
			s.Release()
		}
	}
	cfg := limiter.Config{MaxInflight: 6}
	b.Run("events/none", func(b *testing.B) {
		lim, _ := limiter.New(cfg)
		run(b, lim, context.Background())
	})
	// The bridge keeps its metrics itself (see Produce), so there is no
	// cheaper "no SDK" mode for them; the no-op tracer is the case of a
	// service that has not set up tracing.
	b.Run("events/otel-metrics", func(b *testing.B) {
		br, _ := otelbridge.New(otelbridge.Options{TracerProvider: tracenoop.NewTracerProvider()})
		lim, _ := limiter.New(cfg, limiter.WithObserver(br.Observe))
		br.Watch(lim)
		run(b, lim, context.Background())
	})
	b.Run("events/otel-metrics-and-spans", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer tp.Shutdown(context.Background())
		br, _ := otelbridge.New(otelbridge.Options{TracerProvider: tp})
		lim, _ := limiter.New(cfg, limiter.WithObserver(br.Observe))
		br.Watch(lim)
		ctx, span := tp.Tracer("bench").Start(context.Background(), "call")
		defer span.End()
		run(b, lim, ctx)
	})
}
