package otelbridge

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlanes/llmlanes/limiter"
)

// ScopeName is the instrumentation scope of the bridge's meter and tracer.
const ScopeName = "github.com/llmlanes/llmlanes/otelbridge"

// waitBuckets are the queue-wait histogram's bucket bounds, in seconds (D8).
var waitBuckets = []float64{0.1, 0.5, 1, 5, 15, 30, 60, 120, 300}

// firstByteBuckets are the upstream time-to-first-byte bucket bounds.
var firstByteBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// Options configures New. Zero values take the global providers.
type Options struct {
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
}

// Bridge records a limiter's lanes as OpenTelemetry metrics and spans.
type Bridge struct {
	tracer trace.Tracer
	lim    atomic.Pointer[limiter.Limiter]

	wait      metric.Float64Histogram
	timeouts  metric.Int64Counter
	canceled  metric.Int64Counter
	upstream  metric.Int64Counter
	retries   metric.Int64Counter
	firstByte metric.Float64Histogram

	mu    sync.RWMutex
	lanes map[string]*laneOpts
}

// New creates the bridge's instruments.
func New(o Options) (*Bridge, error) {
	mp, tp := o.MeterProvider, o.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	b := &Bridge{tracer: tp.Tracer(ScopeName), lanes: map[string]*laneOpts{}}
	var errs []error
	note := func(err error) { errs = append(errs, err) }
	var err error
	b.wait, err = m.Float64Histogram("llm.queue.wait", metric.WithUnit("s"),
		metric.WithDescription("Time model calls waited for a lane slot, by lane and class, until a grant (immediate grants count as 0) or a queue timeout (the whole wait)."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	note(err)
	b.timeouts, err = m.Int64Counter("llm.queue.timeouts", metric.WithUnit("{timeout}"),
		metric.WithDescription("Model calls that gave up waiting for a lane slot after the queue timeout."))
	note(err)
	b.canceled, err = m.Int64Counter("llm.queue.cancellations", metric.WithUnit("{call}"),
		metric.WithDescription("Model calls whose caller went away (its context ended) while they waited for a lane slot; not in the wait histogram."))
	note(err)
	b.upstream, err = m.Int64Counter("llm.upstream.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Exchanges with the upstream gateway, by lane and outcome."))
	note(err)
	b.retries, err = m.Int64Counter("llm.upstream.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Exchanges that an SDK marked as retries (X-Stainless-Retry-Count above 0)."))
	note(err)
	b.firstByte, err = m.Float64Histogram("llm.upstream.first_byte", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a model call to the first byte of its response body (first token of a stream)."),
		metric.WithExplicitBucketBoundaries(firstByteBuckets...))
	note(err)

	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		note(err)
		return g
	}
	inflight := gauge("llm.inflight", "{call}", "Model calls holding a lane slot.")
	depth := gauge("llm.queue.depth", "{call}", "Model calls waiting for a lane slot, by class.")
	limit := gauge("llm.limit", "{call}", "The lane's configured limit (max_inflight).")
	reserve := gauge("llm.reserve", "{call}", "Slots reserved for interactive calls, as clamped.")
	saturated := gauge("llm.saturated", "", "1 when the lane's queue has been non-empty for 60 s or more, else 0.")
	oldest, err := m.Float64ObservableGauge("llm.oldest_wait", metric.WithUnit("s"),
		metric.WithDescription("How long the lane's longest-waiting call has waited."))
	note(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		lim := b.lim.Load()
		if lim == nil {
			return nil
		}
		for _, l := range lim.Snapshot().Lanes {
			lo := b.opts(l.Lane)
			o.ObserveInt64(inflight, int64(l.Inflight), lo.laneObs...)
			o.ObserveInt64(limit, int64(l.Limit), lo.laneObs...)
			o.ObserveInt64(reserve, int64(l.Reserve), lo.laneObs...)
			o.ObserveInt64(saturated, boolInt(l.Saturated), lo.laneObs...)
			o.ObserveFloat64(oldest, float64(l.OldestWait), lo.laneObs...)
			q := l.QueuedByPriority
			o.ObserveInt64(depth, int64(q.Interactive), lo.classObs[limiter.Interactive.Index()]...)
			o.ObserveInt64(depth, int64(q.Default), lo.classObs[limiter.Default.Index()]...)
			o.ObserveInt64(depth, int64(q.Bulk), lo.classObs[limiter.Bulk.Index()]...)
		}
		return nil
	}, inflight, depth, limit, reserve, saturated, oldest)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// now reads the watched limiter's clock, so that spans line up with the
// waits and exchanges it reports.
func (b *Bridge) now() time.Time {
	if lim := b.lim.Load(); lim != nil {
		return lim.Clock().Now()
	}
	return time.Now()
}

// Watch makes the gauges report lim's lanes. Pass b.Observe to limiter.New
// as an observer first; the two steps are separate because each needs the
// other.
func (b *Bridge) Watch(lim *limiter.Limiter) { b.lim.Store(lim) }

func boolInt(v bool) int64 {
	if v {
		return 1
	}
	return 0
}

// laneOpts are a lane's attribute sets, made once, as ready-made option
// slices: building attributes or a variadic slice per event would allocate
// on every model call.
type laneOpts struct {
	zeroed   sync.Once // the lane's counters exist from its first event, at 0
	lane     []metric.AddOption
	laneRec  []metric.RecordOption
	laneObs  []metric.ObserveOption
	class    [3][]metric.RecordOption
	classObs [3][]metric.ObserveOption
	outcome  [8][]metric.AddOption
}

func (b *Bridge) opts(lane string) *laneOpts {
	b.mu.RLock()
	o := b.lanes[lane]
	b.mu.RUnlock()
	if o != nil {
		return o
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if o = b.lanes[lane]; o != nil {
		return o
	}
	o = &laneOpts{}
	l := metric.WithAttributeSet(attribute.NewSet(attribute.String("lane", lane)))
	o.lane, o.laneRec, o.laneObs = []metric.AddOption{l}, []metric.RecordOption{l}, []metric.ObserveOption{l}
	for _, p := range []limiter.Priority{limiter.Interactive, limiter.Default, limiter.Bulk} {
		c := metric.WithAttributeSet(attribute.NewSet(attribute.String("lane", lane), attribute.String("priority", p.String())))
		o.class[p.Index()], o.classObs[p.Index()] = []metric.RecordOption{c}, []metric.ObserveOption{c}
	}
	for _, oc := range limiter.Outcomes() {
		o.outcome[oc] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("lane", lane), attribute.String("outcome", oc.String())))}
	}
	b.lanes[lane] = o
	return o
}

// Observe is a limiter.Observer: pass it to limiter.New with
// limiter.WithObserver.
func (b *Bridge) Observe(ctx context.Context, e limiter.Event) {
	lo := b.opts(e.Lane)
	lo.zeroed.Do(func() {
		// Counters that exist from a lane's first event let rate() and
		// dashboards work before the first timeout, retry or failure.
		bg := context.Background()
		b.timeouts.Add(bg, 0, lo.lane...)
		b.canceled.Add(bg, 0, lo.lane...)
		b.retries.Add(bg, 0, lo.lane...)
		for _, oc := range limiter.Outcomes() {
			b.upstream.Add(bg, 0, lo.outcome[oc]...)
		}
	})
	switch e.Kind {
	case limiter.Acquired, limiter.TimedOut, limiter.Canceled:
		ctx = b.queueSpan(ctx, e)
		switch e.Kind {
		case limiter.Acquired:
			b.wait.Record(ctx, e.Wait.Seconds(), lo.class[e.Priority.Index()]...)
		case limiter.TimedOut:
			// A lane that times its callers out must not look fast.
			b.wait.Record(ctx, e.Wait.Seconds(), lo.class[e.Priority.Index()]...)
			b.timeouts.Add(ctx, 1, lo.lane...)
		case limiter.Canceled:
			b.canceled.Add(ctx, 1, lo.lane...)
		}
	case limiter.Exchanged:
		x := e.Exchange
		b.upstream.Add(ctx, 1, lo.outcome[x.Outcome]...)
		if x.Retry {
			b.retries.Add(ctx, 1, lo.lane...)
		}
		if x.FirstByte > 0 {
			b.firstByte.Record(ctx, x.FirstByte.Seconds(), lo.laneRec...)
		}
		b.upstreamSpan(ctx, e)
	}
}

// queueSpan records the queue wait that just ended as a child of the call
// span in ctx, and returns ctx with it, so that the wait sample's exemplar
// points at it.
func (b *Bridge) queueSpan(ctx context.Context, e limiter.Event) context.Context {
	call := trace.SpanFromContext(ctx)
	if !call.IsRecording() {
		return ctx
	}
	now := b.now()
	_, model := limiter.SplitLaneKey(e.Lane)
	call.SetName("chat " + model)
	call.SetAttributes(attribute.String("gen_ai.request.model", model), attribute.String("llmlanes.lane", e.Lane),
		attribute.String("llmlanes.priority", e.Priority.String()))
	outcome := "granted"
	switch e.Kind {
	case limiter.TimedOut:
		outcome = "queue_timeout"
	case limiter.Canceled:
		outcome = "canceled"
	}
	ctx, span := b.tracer.Start(ctx, "llm.queue_wait", trace.WithTimestamp(now.Add(-e.Wait)), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("llmlanes.lane", e.Lane), attribute.String("llmlanes.priority", e.Priority.String()),
			attribute.Int("llmlanes.queue.position", e.Position), attribute.String("llmlanes.outcome", outcome)))
	switch e.Kind {
	case limiter.TimedOut:
		span.SetAttributes(attribute.String("error.type", "lane_queue_timeout"))
		span.SetStatus(codes.Error, "no lane slot within the queue timeout")
		call.SetAttributes(attribute.String("error.type", "lane_queue_timeout"), attribute.String("llmlanes.outcome", "queue_timeout"))
		call.SetStatus(codes.Error, "lane queue timeout")
	case limiter.Canceled:
		span.SetAttributes(attribute.String("error.type", "canceled"))
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
	_, span := b.tracer.Start(ctx, "llm.upstream", trace.WithTimestamp(x.Sent), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("llmlanes.lane", e.Lane), attribute.String("llmlanes.outcome", x.Outcome.String()),
			attribute.Bool("llmlanes.retry", x.Retry)))
	if x.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", x.Status))
		call.SetAttributes(attribute.Int("http.response.status_code", x.Status))
	}
	if x.FirstByte > 0 {
		span.SetAttributes(attribute.Float64("llmlanes.first_byte_s", x.FirstByte.Seconds()))
	}
	call.SetAttributes(attribute.String("llmlanes.outcome", x.Outcome.String()))
	if et := errorType(x); et != "" {
		span.SetAttributes(attribute.String("error.type", et))
		span.SetStatus(codes.Error, x.Outcome.String())
		call.SetAttributes(attribute.String("error.type", et))
		call.SetStatus(codes.Error, x.Outcome.String())
	}
	span.End(trace.WithTimestamp(x.Sent.Add(x.Duration)))
}

// errorType names a failed exchange per the HTTP conventions: the status
// code for an error response, otherwise a short class.
func errorType(x limiter.Exchange) string {
	switch x.Outcome {
	case limiter.OutcomeOK, limiter.OutcomeCanceled:
		return ""
	case limiter.OutcomeStall:
		return "lane_stall"
	case limiter.OutcomeTransportError:
		return "transport_error"
	}
	if x.Status != 0 {
		return strconv.Itoa(x.Status)
	}
	return x.Outcome.String()
}
