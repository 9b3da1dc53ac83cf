package otelbridge

import (
	"strings"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Kind is what a metric is.
type Kind int

// The kinds of metric.
const (
	Gauge     Kind = iota // a value now
	Counter               // a cumulative, monotonic sum
	Histogram             // a cumulative explicit-bucket histogram
)

// A Def declares one metric the bridge (or package telemetry) produces: its
// OpenTelemetry name and unit, its kind, the attributes of its points and
// what it means. Produce makes its metrics from the table (Defs), and
// docs/OBSERVABILITY.md's table of metrics is generated from it, so a
// metric is said once.
type Def struct {
	Name        string // OpenTelemetry name, e.g. llm.queue.wait
	Unit        string // UCUM: s, 1, {call}; "" for none
	Kind        Kind
	Float       bool     // its points are float64 (a histogram's always are)
	Labels      []string // the attributes of its points
	Description string
	// Only says which lanes have it, when not all do: a family only
	// some lanes have is left out while no lane has a point of it.
	Only string
}

// PromName returns the name Prometheus scrapes d under, with prefix
// (metrics.prefix) in front, as the OpenTelemetry Prometheus exporter
// translates it: dots to underscores, the unit's suffix (_seconds for s,
// _ratio for 1; a {annotation} has none), and _total on a counter.
func (d Def) PromName(prefix string) string {
	n := strings.ReplaceAll(d.Name, ".", "_")
	switch d.Unit {
	case "s":
		n += "_seconds"
	case "1":
		if !strings.HasSuffix(n, "_ratio") {
			n += "_ratio"
		}
	}
	if d.Kind == Counter {
		n += "_total"
	}
	if prefix != "" {
		n = prefix + "_" + n
	}
	return n
}

// points are one metric's points, of whichever type its Def says.
type points struct {
	ints   []metricdata.DataPoint[int64]
	floats []metricdata.DataPoint[float64]
	hists  []metricdata.HistogramDataPoint[float64]
}

func (p *points) empty() bool { return len(p.ints)+len(p.floats)+len(p.hists) == 0 }

// metric returns d's metric with the points p.
func (d Def) metric(p *points) metricdata.Metrics {
	m := metricdata.Metrics{Name: d.Name, Unit: d.Unit, Description: d.Description}
	switch {
	case d.Kind == Histogram:
		m.Data = metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: p.hists}
	case d.Kind == Counter && d.Float:
		m.Data = metricdata.Sum[float64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: p.floats}
	case d.Kind == Counter:
		m.Data = metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: p.ints}
	case d.Float:
		m.Data = metricdata.Gauge[float64]{DataPoints: p.floats}
	default:
		m.Data = metricdata.Gauge[int64]{DataPoints: p.ints}
	}
	return m
}

// metrics returns the metrics of the table defs from pts (pts[i] are
// defs[i]'s points), leaving out the families only some lanes have that
// have no point.
func metrics(defs []Def, pts []points) []metricdata.Metrics {
	ms := make([]metricdata.Metrics, 0, len(defs))
	for i, d := range defs {
		if d.Only != "" && pts[i].empty() {
			continue
		}
		ms = append(ms, d.metric(&pts[i]))
	}
	return ms
}

// The lane metrics, by their place in laneDefs.
const (
	mQueueWait = iota
	mTimeouts
	mCancellations
	mGaveUp
	mUpstreamRequests
	mUpstreamRetries
	mFirstByte
	mInflight
	mQueueDepth
	mLimit
	mReserve
	mSaturated
	mOldestWait
	mAbandoned
	mTenantInflight
	mTenantQueueDepth
	mTenantService
	mTokens
	mEstimateError
	mBudgetRemaining
	mBudgetLimit
	mSharedUp
	mSharedHolders
	mSharedFiguresAge
	nLaneDefs
)

const (
	onlyTenants = "lanes that have seen a named tenant"
	onlyTokens  = "lanes whose calls reported tokens"
	onlyBudget  = "lanes with a token budget, or a provider's rate-limit headers"
	onlyShared  = "shared lanes"
	onlyGaveUp  = "lanes whose callers have given up on a queued call"
)

// laneDefs is the table of the lane metrics the bridge produces; read
// only.
var laneDefs = [nLaneDefs]Def{
	mQueueWait: {Name: "llm.queue.wait", Unit: "s", Kind: Histogram, Labels: []string{"lane", "priority"},
		Description: "Time model calls waited for a lane slot, by lane and class, until a grant (immediate grants count as 0) or a queue timeout (the whole wait)."},
	mTimeouts: {Name: "llm.queue.timeouts", Unit: "{timeout}", Kind: Counter, Labels: []string{"lane"},
		Description: "Model calls that gave up waiting for a lane slot after the queue timeout."},
	mCancellations: {Name: "llm.queue.cancellations", Unit: "{call}", Kind: Counter, Labels: []string{"lane"},
		Description: "Model calls whose caller went away (its context ended) while they waited for a lane slot; not in the wait histogram."},
	mGaveUp: {Name: "llm.queue.gave_up", Unit: "{call}", Kind: Counter, Labels: []string{"lane", "priority", "cause"}, Only: onlyGaveUp,
		Description: "Model calls that left the queue because their callers gave up, by class and cause: caller_gone (the caller went away) or deadline (answered before the client's stated timeout, at it or at once on the lane's estimate)."},
	mUpstreamRequests: {Name: "llm.upstream.requests", Unit: "{request}", Kind: Counter, Labels: []string{"lane", "outcome"},
		Description: "Exchanges with the upstream gateway, by lane and outcome."},
	mUpstreamRetries: {Name: "llm.upstream.retries", Unit: "{retry}", Kind: Counter, Labels: []string{"lane"},
		Description: "Exchanges that were retries of a call, as the transport recognised them (never from what the client claims)."},
	mFirstByte: {Name: "llm.upstream.first_byte", Unit: "s", Kind: Histogram, Labels: []string{"lane"},
		Description: "Time from sending a model call to the first byte of its response body (first token of a stream)."},
	mInflight: {Name: "llm.inflight", Unit: "{call}", Kind: Gauge, Labels: []string{"lane"},
		Description: "Model calls holding a lane slot."},
	mQueueDepth: {Name: "llm.queue.depth", Unit: "{call}", Kind: Gauge, Labels: []string{"lane", "priority"},
		Description: "Model calls waiting for a lane slot, by class."},
	mLimit: {Name: "llm.limit", Unit: "{call}", Kind: Gauge, Labels: []string{"lane"},
		Description: "The lane's configured limit (max_inflight)."},
	mReserve: {Name: "llm.reserve", Unit: "{call}", Kind: Gauge, Labels: []string{"lane"},
		Description: "Slots reserved for interactive calls, as clamped."},
	mSaturated: {Name: "llm.saturated", Kind: Gauge, Labels: []string{"lane"},
		Description: "1 when the lane's queue has been non-empty for 60 s or more, else 0."},
	mOldestWait: {Name: "llm.oldest_wait", Unit: "s", Kind: Gauge, Float: true, Labels: []string{"lane"},
		Description: "How long the lane's longest-waiting call has waited."},
	mAbandoned: {Name: "llm.abandoned_inflight", Unit: "{call}", Kind: Gauge, Labels: []string{"lane"},
		Description: "Slots held for calls whose callers left while the upstream still works on them (it does not stop the work when its client goes: cancel_propagates false): each is held until the upstream's answer ends."},
	mTenantInflight: {Name: "llm.tenant.inflight", Unit: "{call}", Kind: Gauge, Labels: []string{"lane", "tenant"}, Only: onlyTenants,
		Description: "Model calls holding a lane slot, by tenant."},
	mTenantQueueDepth: {Name: "llm.tenant.queue.depth", Unit: "{call}", Kind: Gauge, Labels: []string{"lane", "tenant"}, Only: onlyTenants,
		Description: "Model calls waiting for a lane slot, by tenant."},
	mTenantService: {Name: "llm.tenant.service", Unit: "s", Kind: Counter, Float: true, Labels: []string{"lane", "tenant"}, Only: onlyTenants,
		Description: "Slot-time a tenant's model calls have held in the lane (weights not applied), counted as each call ends: the service its fair share is measured in."},
	mTokens: {Name: "llm.tokens", Unit: "{token}", Kind: Counter, Labels: []string{"lane", "kind"}, Only: onlyTokens,
		Description: "Tokens the lane's model calls used, by kind (prompt, completion), as their answers' usage said (else as estimated from what was streamed), counted as each call ends."},
	mEstimateError: {Name: "llm.token.estimate_error_ratio", Unit: "1", Kind: Histogram, Labels: []string{"lane"}, Only: onlyTokens,
		Description: "How far a call's token estimate at admission was off: (used - estimate) / estimate."},
	mBudgetRemaining: {Name: "llm.token.budget.remaining", Unit: "{token}", Kind: Gauge, Labels: []string{"lane"}, Only: onlyBudget,
		Description: "Tokens the lane may still grant now: its tokens_per_minute budget's, else what the provider's rate-limit headers say remains."},
	mBudgetLimit: {Name: "llm.token.budget.limit", Unit: "{token}", Kind: Gauge, Labels: []string{"lane"}, Only: onlyBudget,
		Description: "The lane's tokens per minute: its tokens_per_minute, else the limit the provider's rate-limit headers announced."},
	mSharedUp: {Name: "llm.shared.up", Kind: Gauge, Labels: []string{"lane"}, Only: onlyShared,
		Description: "1 while a shared lane's store (Redis) is reachable, 0 while this process falls back or refuses calls."},
	mSharedHolders: {Name: "llm.shared.holders", Unit: "{call}", Kind: Gauge, Labels: []string{"lane", "process"}, Only: onlyShared,
		Description: "Slots of a shared lane held, by process."},
	mSharedFiguresAge: {Name: "llm.shared.figures_age", Unit: "s", Kind: Gauge, Float: true, Labels: []string{"lane"}, Only: onlyShared,
		Description: "How old a shared lane's global figures are: 0 when read for this scrape, more when the store (Redis) did not answer in time and the last ones read are shown."},
}

// Defs returns the table of the lane metrics the bridge produces (a copy).
func Defs() []Def { return append([]Def(nil), laneDefs[:]...) }

// Ints returns d's metric with the int64 points pts (a counter's or a
// gauge's), for a producer outside the bridge that declares its metrics
// with Defs too (package telemetry's classification gauges).
func (d Def) Ints(pts []metricdata.DataPoint[int64]) metricdata.Metrics {
	return d.metric(&points{ints: pts})
}
