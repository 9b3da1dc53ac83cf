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

// waitBuckets are the queue-wait histogram's bucket bounds, in seconds (docs/DESIGN.md, "Metrics").
var waitBuckets = []float64{0.1, 0.5, 1, 5, 15, 30, 60, 120, 300}

// firstByteBuckets are the upstream time-to-first-byte bucket bounds.
var firstByteBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// estimateErrorBuckets are the token estimate error histogram's bounds:
// (used - estimate) / estimate, so -0.5 is a call that used half its
// estimate and 1 one that used twice it.
var estimateErrorBuckets = []float64{-0.9, -0.75, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2}

// giveUp counts a wait of class p whose caller gave up, for cause (0
// caller gone, 1 deadline).
func (m *laneMetrics) giveUp(cause int, p limiter.Priority) {
	m.gaveUp[cause][p.Index()].Add(1)
	m.gaveUpSeen.Store(true)
}

// laneMetrics is one lane's cumulative metrics.
type laneMetrics struct {
	start    time.Time // when the lane's series began
	missed   atomic.Bool
	lane     attribute.Set
	class    [3]attribute.Set
	outcome  []attribute.Set // by limiter.Outcome
	timeouts atomic.Int64
	canceled atomic.Int64
	// gaveUp counts the waits whose callers gave up, by cause (caller
	// gone, deadline) and class, once one did (gaveUpSeen).
	gaveUpSeen atomic.Bool
	gaveUp     [2][3]atomic.Int64
	cause      [2][3]attribute.Set
	retries    atomic.Int64
	upstream   []atomic.Int64 // by limiter.Outcome
	wait       [3]histogram   // by class
	first      histogram
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
		for c, name := range []string{"caller_gone", "deadline"} {
			m.cause[c][p.Index()] = attribute.NewSet(attribute.String("lane", lane), attribute.String("priority", p.String()), attribute.String("cause", name))
		}
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

	var pts [nLaneDefs]points
	started := make(map[string]time.Time, len(lanes))
	for _, m := range lanes {
		if v, ok := m.lane.Value("lane"); ok {
			started[v.AsString()] = m.start
		}
	}
	sum := func(i int, m *laneMetrics, attrs attribute.Set, v int64) {
		pts[i].ints = append(pts[i].ints, metricdata.DataPoint[int64]{Attributes: attrs, StartTime: m.start, Time: now, Value: v})
	}
	hist := func(i int, p metricdata.HistogramDataPoint[float64]) { pts[i].hists = append(pts[i].hists, p) }
	for _, m := range lanes {
		for c := range m.wait {
			hist(mQueueWait, m.wait[c].point(m.class[c], m.start, now))
		}
		hist(mFirstByte, m.first.point(m.lane, m.start, now))
		sum(mTimeouts, m, m.lane, m.timeouts.Load())
		sum(mCancellations, m, m.lane, m.canceled.Load())
		if m.gaveUpSeen.Load() {
			for c := range m.gaveUp {
				for p := range m.gaveUp[c] {
					sum(mGaveUp, m, m.cause[c][p], m.gaveUp[c][p].Load())
				}
			}
		}
		sum(mUpstreamRetries, m, m.lane, m.retries.Load())
		for o := range m.upstream {
			sum(mUpstreamRequests, m, m.outcome[o], m.upstream[o].Load())
		}
		if m.tokened.Load() {
			for k := range m.tokens {
				sum(mTokens, m, m.kind[k], m.tokens[k].Load())
			}
			hist(mEstimateError, m.estimate.point(m.lane, m.start, now))
		}
	}
	gauge := func(i int, attrs attribute.Set, v int64) {
		pts[i].ints = append(pts[i].ints, metricdata.DataPoint[int64]{Attributes: attrs, Time: now, Value: v})
	}
	fgauge := func(i int, attrs attribute.Set, start time.Time, v float64) {
		pts[i].floats = append(pts[i].floats, metricdata.DataPoint[float64]{Attributes: attrs, StartTime: start, Time: now, Value: v})
	}
	byLane := b.tenants.split(snap.Lanes, snap.GeneratedAt)
	for _, l := range snap.Lanes {
		a := attribute.NewSet(attribute.String("lane", l.Lane))
		inf, q := l.Inflight, l.QueuedByPriority
		if sh := l.Shared; sh != nil {
			// A shared lane's gauges are this process's share, so that a sum
			// across processes is the lane; the holders gauge has the rest.
			inf, q = sh.ProcessInflight, sh.ProcessQueued
		}
		gauge(mInflight, a, int64(inf))
		gauge(mLimit, a, int64(l.Limit))
		gauge(mReserve, a, int64(l.Reserve))
		gauge(mSaturated, a, boolInt(l.Saturated))
		fgauge(mOldestWait, a, time.Time{}, float64(l.OldestWait))
		gauge(mAbandoned, a, int64(l.Abandoned))
		for _, c := range []struct {
			p limiter.Priority
			n int
		}{{limiter.Interactive, q.Interactive}, {limiter.Default, q.Default}, {limiter.Bulk, q.Bulk}} {
			gauge(mQueueDepth, attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("priority", c.p.String())), int64(c.n))
		}
		if tk := l.Tokens; tk != nil && tk.Remaining != nil {
			gauge(mBudgetRemaining, a, *tk.Remaining)
			switch {
			case tk.TokensPerMinute > 0:
				gauge(mBudgetLimit, a, tk.TokensPerMinute)
			case tk.Provider != nil && tk.Provider.Tokens != nil && tk.Provider.Tokens.Limit > 0:
				gauge(mBudgetLimit, a, tk.Provider.Tokens.Limit)
			}
		}
		for _, tn := range byLane[l.Lane] {
			ta := attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("tenant", tn.Tenant))
			gauge(mTenantInflight, ta, int64(tn.Inflight))
			gauge(mTenantQueueDepth, ta, int64(tn.Queued))
			start, ok := started[l.Lane]
			if !ok {
				start = now
			}
			fgauge(mTenantService, ta, start, float64(tn.Service))
		}
		if sh := l.Shared; sh != nil {
			gauge(mSharedUp, a, boolInt(sh.State == limiter.BackendOK))
			fgauge(mSharedFiguresAge, a, time.Time{}, float64(sh.FiguresAge))
			procs := make([]string, 0, len(sh.Holders))
			for p := range sh.Holders {
				procs = append(procs, p)
			}
			sort.Strings(procs)
			for _, p := range procs {
				gauge(mSharedHolders, attribute.NewSet(attribute.String("lane", l.Lane), attribute.String("process", p)), int64(sh.Holders[p]))
			}
		}
	}
	ms := metrics(laneDefs[:], pts[:])
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
