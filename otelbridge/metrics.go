package otelbridge

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlanes/llmlanes/limiter"
)

// The bridge keeps each lane's counters and histograms itself and hands
// them to OpenTelemetry readers as a metric Producer, instead of recording
// them with the SDK's instruments. The SDK cannot forget an attribute set
// of a synchronous instrument, and lanes come and go (a client picks the
// model, and idle lanes are evicted): kept here, a lane's series end when
// the lane does, and no lane can land in the SDK's cardinality overflow.

// waitBuckets are the queue-wait histogram's bucket bounds, in seconds (D8).
var waitBuckets = []float64{0.1, 0.5, 1, 5, 15, 30, 60, 120, 300}

// firstByteBuckets are the upstream time-to-first-byte bucket bounds.
var firstByteBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// estimateErrorBuckets are the token estimate error histogram's bounds:
// (used - estimate) / estimate, so -0.5 is a call that used half its
// estimate and 1 one that used twice it.
var estimateErrorBuckets = []float64{-0.9, -0.75, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2}

// laneMetrics is one lane's cumulative metrics.
type laneMetrics struct {
	start    time.Time // when the lane's series began
	missed   atomic.Bool
	lane     attribute.Set
	class    [3]attribute.Set
	outcome  []attribute.Set // by limiter.Outcome
	timeouts atomic.Int64
	canceled atomic.Int64
	retries  atomic.Int64
	upstream []atomic.Int64 // by limiter.Outcome
	wait     [3]histogram   // by class
	first    histogram
	// tokens counts the tokens the lane's calls used, prompt and
	// completion (kind), once one reported any (tokened); estimate is how
	// far their estimates were off.
	tokened  atomic.Bool
	kind     [2]attribute.Set
	tokens   [2]atomic.Int64
	estimate histogram
	genai    genaiBase // the lane's GenAI attributes
}

func newLaneMetrics(lane string, start time.Time) *laneMetrics {
	outcomes := limiter.Outcomes()
	m := &laneMetrics{start: start, lane: attribute.NewSet(attribute.String("lane", lane)),
		outcome: make([]attribute.Set, len(outcomes)), upstream: make([]atomic.Int64, len(outcomes)),
		genai: newGenAIBase(lane)}
	for _, p := range []limiter.Priority{limiter.Interactive, limiter.Default, limiter.Bulk} {
		m.class[p.Index()] = attribute.NewSet(attribute.String("lane", lane), attribute.String("priority", p.String()))
		m.wait[p.Index()].init(waitBuckets)
	}
	for _, o := range outcomes {
		m.outcome[o] = attribute.NewSet(attribute.String("lane", lane), attribute.String("outcome", o.String()))
	}
	m.first.init(firstByteBuckets)
	m.estimate.init(estimateErrorBuckets)
	for i, k := range []string{"prompt", "completion"} {
		m.kind[i] = attribute.NewSet(attribute.String("lane", lane), attribute.String("kind", k))
	}
	return m
}

// histogram is a cumulative explicit-bucket histogram whose buckets each
// keep the latest sampled exemplar.
type histogram struct {
	bounds    []float64
	mu        sync.Mutex
	counts    []uint64 // len(bounds)+1
	sum       float64
	count     uint64
	exemplars []metricdata.Exemplar[float64] // per bucket, made with the first; TraceID nil when none
}

func (h *histogram) init(bounds []float64) {
	h.bounds = bounds
	h.counts = make([]uint64, len(bounds)+1)
}

// record counts v; a sampled span in ctx becomes the bucket's exemplar.
func (h *histogram) record(ctx context.Context, v float64, now time.Time) {
	i := sort.SearchFloat64s(h.bounds, v) // bucket i holds (bounds[i-1], bounds[i]]
	sc := trace.SpanContextFromContext(ctx)
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.count++
	if sc.IsSampled() {
		if h.exemplars == nil {
			h.exemplars = make([]metricdata.Exemplar[float64], len(h.bounds)+1)
		}
		tid, sid := sc.TraceID(), sc.SpanID()
		e := &h.exemplars[i]
		e.Value, e.Time = v, now
		e.TraceID, e.SpanID = append(e.TraceID[:0], tid[:]...), append(e.SpanID[:0], sid[:]...)
	}
	h.mu.Unlock()
}

// point returns the histogram's data point.
func (h *histogram) point(attrs attribute.Set, start, now time.Time) metricdata.HistogramDataPoint[float64] {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := metricdata.HistogramDataPoint[float64]{Attributes: attrs, StartTime: start, Time: now,
		Count: h.count, Bounds: h.bounds, BucketCounts: append([]uint64(nil), h.counts...), Sum: h.sum}
	for _, e := range h.exemplars {
		if e.TraceID != nil {
			e.TraceID, e.SpanID = append([]byte(nil), e.TraceID...), append([]byte(nil), e.SpanID...)
			p.Exemplars = append(p.Exemplars, e)
		}
	}
	return p
}

// metrics returns the lane's state, making it on first use. Only lanes of
// the watched limiter have events, so these are bounded by its MaxLanes.
func (b *Bridge) metrics(lane string) *laneMetrics {
	b.mu.RLock()
	m := b.lanes[lane]
	b.mu.RUnlock()
	if m != nil {
		m.missed.Store(false)
		return m
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m = b.lanes[lane]; m == nil {
		m = newLaneMetrics(lane, b.now())
		b.lanes[lane] = m
	}
	return m
}

// forget drops a lane's series, and the GenAI series only it counted.
func (b *Bridge) forget(lane string) {
	b.mu.Lock()
	delete(b.lanes, lane)
	b.mu.Unlock()
	b.genai.forget(lane)
}

// Produce returns every lane's metrics: the gauges read from the watched
// limiter's snapshot (never summed from events, so they cannot drift), and
// the counters and histograms fed by its events. It implements
// go.opentelemetry.io/otel/sdk/metric.Producer: pass the bridge to a reader
// with metric.WithProducer. A lane evicted by the limiter (or missing from
// two snapshots in a row) has no series any more.
func (b *Bridge) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := b.now()
	var snap limiter.Snapshot
	if f := b.snaps.Load(); f != nil {
		snap = (*f)()
	} else if lim := b.lim.Load(); lim != nil {
		snap = lim.Snapshot()
	}
	live := make(map[string]bool, len(snap.Lanes))
	for _, l := range snap.Lanes {
		live[l.Lane] = true
	}
	b.mu.Lock()
	keys := make([]string, 0, len(b.lanes))
	for k, m := range b.lanes {
		switch {
		case live[k]:
			m.missed.Store(false)
		case m.missed.Swap(true): // an event raced the lane's eviction
			delete(b.lanes, k)
			b.genai.forget(k) // lock order: b.mu, then genai.mu
			continue
		}
		keys = append(keys, k)
	}
	lanes := make([]*laneMetrics, 0, len(keys))
	sort.Strings(keys)
	for _, k := range keys {
		lanes = append(lanes, b.lanes[k])
	}
	b.mu.Unlock()

	var (
		wait, first                          []metricdata.HistogramDataPoint[float64]
		timeouts, canceled, retries, ups     []metricdata.DataPoint[int64]
		inflight, depth, limit, reserve, sat []metricdata.DataPoint[int64]
		oldest, sharedAge                    []metricdata.DataPoint[float64]
		holders, sharedUp                    []metricdata.DataPoint[int64]
		tenantIn, tenantQ                    []metricdata.DataPoint[int64]
		tenantService                        []metricdata.DataPoint[float64]
		tokens, budget, budgetLimit          []metricdata.DataPoint[int64]
		estimate                             []metricdata.HistogramDataPoint[float64]
	)
	started := make(map[string]time.Time, len(lanes))
	for _, m := range lanes {
		if v, ok := m.lane.Value("lane"); ok {
			started[v.AsString()] = m.start
		}
	}
	sum := func(dst *[]metricdata.DataPoint[int64], m *laneMetrics, attrs attribute.Set, v int64) {
		*dst = append(*dst, metricdata.DataPoint[int64]{Attributes: attrs, StartTime: m.start, Time: now, Value: v})
	}
	for _, m := range lanes {
		for c := range m.wait {
			wait = append(wait, m.wait[c].point(m.class[c], m.start, now))
		}
		first = append(first, m.first.point(m.lane, m.start, now))
		sum(&timeouts, m, m.lane, m.timeouts.Load())
		sum(&canceled, m, m.lane, m.canceled.Load())
		sum(&retries, m, m.lane, m.retries.Load())
		for o := range m.upstream {
			sum(&ups, m, m.outcome[o], m.upstream[o].Load())
		}
		if m.tokened.Load() {
			for k := range m.tokens {
				sum(&tokens, m, m.kind[k], m.tokens[k].Load())
			}
			estimate = append(estimate, m.estimate.point(m.lane, m.start, now))
		}
	}
	gauge := func(dst *[]metricdata.DataPoint[int64], attrs attribute.Set, v int64) {
		*dst = append(*dst, metricdata.DataPoint[int64]{Attributes: attrs, Time: now, Value: v})
	}
	byLane := b.tenants.split(snap.Lanes)
	for _, l := range snap.Lanes {
		a := attribute.NewSet(attribute.String("lane", l.Lane))
		inf, q := l.Inflight, l.QueuedByPriority
		if sh := l.Shared; sh != nil {
			// A shared lane's gauges are this process's share, so that a sum
			// across processes is the lane; the holders gauge has the rest.
			inf, q = sh.ProcessInflight, sh.ProcessQueued
		}
		gauge(&inflight, a, int64(inf))
		gauge(&limit, a, int64(l.Limit))
		gauge(&reserve, a, int64(l.Reserve))
		gauge(&sat, a, boolInt(l.Saturated))
		oldest = append(oldest, metricdata.DataPoint[float64]{Attributes: a, Time: now, Value: float64(l.OldestWait)})
		for _, c := range []struct {
			p limiter.Priority
			n int
		}{{limiter.Interactive, q.Interactive}, {limiter.Default, q.Default}, {limiter.Bulk, q.Bulk}} {
			gauge(&depth, attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("priority", c.p.String())), int64(c.n))
		}
		if tk := l.Tokens; tk != nil && tk.Remaining != nil {
			gauge(&budget, a, *tk.Remaining)
			switch {
			case tk.TokensPerMinute > 0:
				gauge(&budgetLimit, a, tk.TokensPerMinute)
			case tk.Provider != nil && tk.Provider.Tokens != nil && tk.Provider.Tokens.Limit > 0:
				gauge(&budgetLimit, a, tk.Provider.Tokens.Limit)
			}
		}
		for _, tn := range byLane[l.Lane] {
			ta := attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("tenant", tn.Tenant))
			gauge(&tenantIn, ta, int64(tn.Inflight))
			gauge(&tenantQ, ta, int64(tn.Queued))
			start, ok := started[l.Lane]
			if !ok {
				start = now
			}
			tenantService = append(tenantService, metricdata.DataPoint[float64]{Attributes: ta, StartTime: start, Time: now, Value: float64(tn.Service)})
		}
		if sh := l.Shared; sh != nil {
			gauge(&sharedUp, a, boolInt(sh.State == limiter.BackendOK))
			sharedAge = append(sharedAge, metricdata.DataPoint[float64]{Attributes: a, Time: now, Value: float64(sh.FiguresAge)})
			procs := make([]string, 0, len(sh.Holders))
			for p := range sh.Holders {
				procs = append(procs, p)
			}
			sort.Strings(procs)
			for _, p := range procs {
				gauge(&holders, attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("process", p)), int64(sh.Holders[p]))
			}
		}
	}
	counter := func(name, unit, desc string, pts []metricdata.DataPoint[int64]) metricdata.Metrics {
		return metricdata.Metrics{Name: name, Unit: unit, Description: desc,
			Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: pts}}
	}
	hist := func(name, unit, desc string, pts []metricdata.HistogramDataPoint[float64]) metricdata.Metrics {
		return metricdata.Metrics{Name: name, Unit: unit, Description: desc,
			Data: metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: pts}}
	}
	igauge := func(name, unit, desc string, pts []metricdata.DataPoint[int64]) metricdata.Metrics {
		return metricdata.Metrics{Name: name, Unit: unit, Description: desc, Data: metricdata.Gauge[int64]{DataPoints: pts}}
	}
	ms := []metricdata.Metrics{
		hist("llm.queue.wait", "s", "Time model calls waited for a lane slot, by lane and class, until a grant (immediate grants count as 0) or a queue timeout (the whole wait).", wait),
		counter("llm.queue.timeouts", "{timeout}", "Model calls that gave up waiting for a lane slot after the queue timeout.", timeouts),
		counter("llm.queue.cancellations", "{call}", "Model calls whose caller went away (its context ended) while they waited for a lane slot; not in the wait histogram.", canceled),
		counter("llm.upstream.requests", "{request}", "Exchanges with the upstream gateway, by lane and outcome.", ups),
		counter("llm.upstream.retries", "{retry}", "Exchanges that were retries of a call, as the transport recognised them (never from what the client claims).", retries),
		hist("llm.upstream.first_byte", "s", "Time from sending a model call to the first byte of its response body (first token of a stream).", first),
		igauge("llm.inflight", "{call}", "Model calls holding a lane slot.", inflight),
		igauge("llm.queue.depth", "{call}", "Model calls waiting for a lane slot, by class.", depth),
		igauge("llm.limit", "{call}", "The lane's configured limit (max_inflight).", limit),
		igauge("llm.reserve", "{call}", "Slots reserved for interactive calls, as clamped.", reserve),
		igauge("llm.saturated", "", "1 when the lane's queue has been non-empty for 60 s or more, else 0.", sat),
		{Name: "llm.oldest_wait", Unit: "s", Description: "How long the lane's longest-waiting call has waited.",
			Data: metricdata.Gauge[float64]{DataPoints: oldest}},
	}
	if len(tenantIn) > 0 { // lanes that have seen a named tenant only
		ms = append(ms,
			igauge("llm.tenant.inflight", "{call}", "Model calls holding a lane slot, by tenant.", tenantIn),
			igauge("llm.tenant.queue.depth", "{call}", "Model calls waiting for a lane slot, by tenant.", tenantQ),
			metricdata.Metrics{Name: "llm.tenant.service", Unit: "s", Description: "Slot-time a tenant's model calls have held in the lane (weights not applied), counted as each call ends: the service its fair share is measured in.",
				Data: metricdata.Sum[float64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: tenantService}})
	}
	if len(tokens) > 0 { // lanes whose calls reported tokens only
		ms = append(ms,
			counter("llm.tokens", "{token}", "Tokens the lane's model calls used, by kind (prompt, completion), as their answers' usage said (else as estimated from what was streamed), counted as each call ends.", tokens),
			hist("llm.token.estimate_error_ratio", "1", "How far a call's token estimate at admission was off: (used - estimate) / estimate.", estimate))
	}
	if len(budget) > 0 {
		ms = append(ms, igauge("llm.token.budget.remaining", "{token}", "Tokens the lane may still grant now: its tokens_per_minute budget's, else what the provider's rate-limit headers say remains.", budget))
		if len(budgetLimit) > 0 {
			ms = append(ms, igauge("llm.token.budget.limit", "{token}", "The lane's tokens per minute: its tokens_per_minute, else the limit the provider's rate-limit headers announced.", budgetLimit))
		}
	}
	if len(sharedUp) > 0 { // shared lanes only: no empty families otherwise
		ms = append(ms,
			igauge("llm.shared.up", "", "1 while a shared lane's store (Redis) is reachable, 0 while this process falls back or refuses calls.", sharedUp),
			igauge("llm.shared.holders", "{call}", "Slots of a shared lane held, by process.", holders),
			metricdata.Metrics{Name: "llm.shared.figures_age", Unit: "s", Description: "How old a shared lane's global figures are: 0 when read for this scrape, more when the store (Redis) did not answer in time and the last ones read are shown.",
				Data: metricdata.Gauge[float64]{DataPoints: sharedAge}})
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName}, Metrics: ms}}, nil
}

func boolInt(v bool) int64 {
	if v {
		return 1
	}
	return 0
}

// seconds returns d in seconds, never below 0.
func seconds(d time.Duration) float64 { return math.Max(0, d.Seconds()) }
