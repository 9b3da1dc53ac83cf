package otelbridge

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// ScopeName is the instrumentation scope of the bridge's tracer and metrics.
const ScopeName = "github.com/llmlanes/llmlanes/otelbridge"

// Options configures New.
type Options struct {
	// TracerProvider receives the spans; nil means the global one.
	TracerProvider trace.TracerProvider
	// Propagator carries the trace to the gateway in the request headers;
	// nil means the global one (W3C trace context and baggage unless set).
	Propagator propagation.TextMapPropagator
	// MaxTenantSeries bounds the (lane, tenant) series of the tenant
	// metrics across all lanes; a lane's tenants past it are summed as
	// limiter.OtherTenant. 0 means DefaultMaxTenantSeries.
	MaxTenantSeries int
}

// Bridge records a limiter's lanes as OpenTelemetry metrics (as a metric
// Producer: see Produce) and spans.
type Bridge struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	// untraced: the TracerProvider is the no-op one, so a call outside any
	// trace has no span to make, nor anything to hand on.
	untraced bool
	lim      atomic.Pointer[limiter.Limiter]
	snaps    atomic.Pointer[func() limiter.Snapshot] // where Produce reads the lanes, if not lim.Snapshot

	mu    sync.RWMutex // guards lanes; each laneMetrics guards itself
	lanes map[string]*laneMetrics

	tenants *tenantSeries // guards itself

	providers atomic.Pointer[map[string]string] // base URL → gen_ai.provider.name (SetProviders)
	genai     genaiTable                        // guards itself
}

// New returns a bridge. Its metrics reach a reader through Produce
// (sdkmetric.WithProducer(b)); its spans go to o.TracerProvider.
func New(o Options) (*Bridge, error) {
	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := o.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	_, untraced := tp.(tracenoop.TracerProvider)
	return &Bridge{tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)), propagator: prop,
		untraced: untraced, lanes: map[string]*laneMetrics{}, tenants: newTenantSeries(o.MaxTenantSeries)}, nil
}

// now reads the watched limiter's clock, so that spans line up with the
// waits and exchanges it reports.
func (b *Bridge) now() time.Time {
	if lim := b.lim.Load(); lim != nil {
		return lim.Clock().Now()
	}
	return time.Now()
}

// UseSnapshots makes the gauges read the lanes from snap rather than from
// the watched limiter's Snapshot: for a caller that takes one snapshot per
// scrape and hands it to every producer (package telemetry does).
func (b *Bridge) UseSnapshots(snap func() limiter.Snapshot) { b.snaps.Store(&snap) }

// Watch makes the gauges report lim's lanes. Pass b.Observe to limiter.New
// as an observer first; the two steps are separate because each needs the
// other.
func (b *Bridge) Watch(lim *limiter.Limiter) { b.lim.Store(lim) }

// Observe is a limiter.Observer: pass it to limiter.New with
// limiter.WithObserver.
func (b *Bridge) Observe(ctx context.Context, e limiter.Event) {
	switch e.Kind {
	case limiter.Evicted:
		b.forget(e.Lane)
		return
	case limiter.Enqueued, limiter.Released:
		// Nothing to record: return at once, from a small frame. Enqueued
		// is told on the stack a call is about to wait on (docs/DESIGN.md
		// of lanes-exporter, "A queued call's stack").
		return
	}
	b.record(ctx, &e)
}

// record counts e in its lane's metrics and records its spans.
func (b *Bridge) record(ctx context.Context, ev *limiter.Event) {
	e := *ev
	m := b.metrics(e.Lane)
	switch e.Kind {
	case limiter.Acquired, limiter.TimedOut, limiter.Canceled, limiter.Refused:
		ctx = b.queueSpan(ctx, e)
		switch e.Kind {
		case limiter.Acquired:
			m.wait[e.Priority.Index()].record(ctx, seconds(e.Wait), b.now())
		case limiter.TimedOut:
			// A lane that times its callers out must not look fast.
			if e.Cause != limiter.CauseEstimate { // answered as it queued: no wait
				m.wait[e.Priority.Index()].record(ctx, seconds(e.Wait), b.now())
			}
			if e.Cause == limiter.CauseQueueTimeout {
				m.timeouts.Add(1)
			} else {
				m.giveUp(1, e.Priority)
			}
			b.recordGenAIRefusal(ctx, m, e, lanehttp.TimeoutCode(e.Cause))
		case limiter.Canceled:
			m.canceled.Add(1)
			if e.Position > 0 { // it had queued
				m.giveUp(0, e.Priority)
			}
		}
	case limiter.Exchanged:
		x := e.Exchange
		m.upstream[x.Outcome].Add(1)
		if x.Retry {
			m.retries.Add(1)
		}
		if x.FirstByte > 0 {
			m.first.record(ctx, x.FirstByte.Seconds(), b.now())
		}
		if tk := x.Tokens; tk != nil && (tk.Estimate > 0 || tk.Used != (limiter.Usage{})) {
			m.tokened.Store(true)
			m.tokens[0].Add(tk.Used.Prompt)
			m.tokens[1].Add(tk.Used.Completion)
			if r, ok := tk.ErrorRatio(); ok {
				m.estimate.record(ctx, r, b.now())
			}
		}
		b.recordGenAIExchange(ctx, m, e.Lane, x)
		b.upstreamSpan(ctx, e)
	}
}

// queueSpan records the queue wait that just ended as a child of the call
// span in ctx, and returns ctx with it, so that the wait sample's exemplar
// points at it.
func (b *Bridge) queueSpan(ctx context.Context, e limiter.Event) context.Context {
	call := trace.SpanFromContext(ctx)
	if info := announced(ctx); info != nil {
		// A call StartCall announced: its span opens now that the wait is
		// over (nothing of the tracer ran on the waiting stack).
		call = info.open(b)
		ctx = trace.ContextWithSpan(ctx, call)
	}
	if !call.IsRecording() {
		return ctx
	}
	now := b.now()
	_, model := limiter.SplitLaneKey(e.Lane)
	op := "chat"
	if info, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		op = info.op
	}
	call.SetName(op + " " + model) // the GenAI conventions' span name
	call.SetAttributes(semconv.GenAIRequestModel(model), attribute.String("llmlanes.lane", e.Lane),
		attribute.String("llmlanes.priority", e.Priority.String()))
	outcome := "granted"
	switch e.Kind {
	case limiter.TimedOut:
		outcome = "queue_timeout"
		if e.Cause != limiter.CauseQueueTimeout {
			outcome = "deadline"
		}
	case limiter.Canceled:
		outcome = "canceled"
	case limiter.Refused:
		outcome = "shutting_down"
	}
	ctx, span := b.tracer.Start(ctx, "llm.queue_wait", trace.WithTimestamp(now.Add(-e.Wait)), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("llmlanes.lane", e.Lane), attribute.String("llmlanes.priority", e.Priority.String()),
			attribute.Int("llmlanes.queue.position", e.Position), attribute.String("llmlanes.outcome", outcome)))
	if e.Tenant != "" {
		// The tenant as the lane tracks it: a name, default or other.
		call.SetAttributes(attribute.String("llmlanes.tenant", e.Tenant))
		span.SetAttributes(attribute.String("llmlanes.tenant", e.Tenant))
	}
	switch e.Kind {
	case limiter.TimedOut:
		code := lanehttp.TimeoutCode(e.Cause)
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, "no lane slot within the queue timeout or before the call's deadline")
		call.SetAttributes(semconv.ErrorTypeKey.String(code), attribute.String("llmlanes.outcome", outcome))
		call.SetStatus(codes.Error, "lane queue timeout")
	case limiter.Canceled:
		span.SetAttributes(semconv.ErrorTypeKey.String("canceled"))
	case limiter.Refused:
		span.SetAttributes(semconv.ErrorTypeKey.String(lanehttp.ShuttingDownCode))
		span.SetStatus(codes.Error, "the limiter is shutting down")
	}
	span.End(trace.WithTimestamp(now))
	return ctx
}

// upstreamSpan records the exchange that just ended as a child of the call
// span in ctx.
func (b *Bridge) upstreamSpan(ctx context.Context, e limiter.Event) {
	call := trace.SpanFromContext(ctx)
	if !call.IsRecording() {
		return
	}
	x := e.Exchange
	attrs := []attribute.KeyValue{attribute.String("llmlanes.lane", e.Lane), attribute.String("llmlanes.outcome", x.Outcome.String()),
		attribute.Bool("llmlanes.retry", x.Retry)}
	if info, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		attrs = append(attrs, info.attrs...) // the HTTP client attributes
	}
	_, span := b.tracer.Start(ctx, "llm.upstream", trace.WithTimestamp(x.Sent), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...))
	if x.Status != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(x.Status))
		call.SetAttributes(semconv.HTTPResponseStatusCode(x.Status))
	}
	if x.FirstByte > 0 {
		span.SetAttributes(attribute.Float64("llmlanes.first_byte_s", x.FirstByte.Seconds()))
	}
	if tk := x.Tokens; tk != nil {
		// The GenAI conventions' usage, and the lane's estimate beside it.
		t := []attribute.KeyValue{attribute.Int64("gen_ai.usage.input_tokens", tk.Used.Prompt),
			attribute.Int64("gen_ai.usage.output_tokens", tk.Used.Completion), attribute.Int64("llmlanes.tokens.estimate", tk.Estimate),
			attribute.Bool("llmlanes.tokens.from_usage", tk.FromUsage)}
		span.SetAttributes(t...)
		call.SetAttributes(t...)
	}
	call.SetAttributes(attribute.String("llmlanes.outcome", x.Outcome.String()))
	if et := errorType(x); et != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(et))
		span.SetStatus(codes.Error, x.Outcome.String())
		call.SetAttributes(semconv.ErrorTypeKey.String(et))
		call.SetStatus(codes.Error, x.Outcome.String())
	}
	span.End(trace.WithTimestamp(x.Sent.Add(x.Duration)))
}

// errorType names a failed exchange: with the project's codes (package
// lanehttp's table), the status of an error answer, or "" for an exchange
// that did not fail (a success, or a caller that gave up).
func errorType(x limiter.Exchange) string {
	switch x.Outcome {
	case limiter.OutcomeCanceled, limiter.OutcomeClientStall:
		return ""
	}
	return genaiErrorType(x)
}
