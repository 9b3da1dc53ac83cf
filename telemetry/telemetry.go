package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/otelbridge"
)

// DefaultPrefix is the metric name prefix when Options.Prefix is empty.
const DefaultPrefix = "llmlanes"

var prefixRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// ValidatePrefix reports whether p can start Prometheus metric names.
func ValidatePrefix(p string) error {
	if !prefixRE.MatchString(p) {
		return fmt.Errorf("metric prefix %q: want letters, digits and underscores, not starting with a digit", p)
	}
	return nil
}

// Options configures New.
type Options struct {
	// Prefix starts every lane metric's name: llmlanes (the default) gives
	// llmlanes_llm_inflight; protoagent gives protoagent_llm_inflight.
	Prefix string
	// Thresholds tune classification; the zero value means
	// classify.DefaultThresholds.
	Thresholds classify.Thresholds
	// TracerProvider receives the bridge's spans; nil means the global one.
	TracerProvider trace.TracerProvider
	// Propagator carries traces to the gateway; nil means the global one.
	Propagator propagation.TextMapPropagator
	// MetricExporters, if any, receive every lane metric too (OTLP, say),
	// through periodic readers, beside the Prometheus exposition.
	MetricExporters []sdkmetric.Exporter
	// Registry receives the collectors; nil means a new one, with the Go
	// and process collectors.
	Registry *prometheus.Registry
	// MaxTenantSeries bounds the tenant metrics' (lane, tenant) series
	// across all lanes (otelbridge.Options.MaxTenantSeries); 0 means
	// otelbridge.DefaultMaxTenantSeries.
	MaxTenantSeries int
}

// Telemetry serves a limiter's lanes. Create it with New, pass Observe to
// limiter.New, then Watch the limiter.
type Telemetry struct {
	reg        *prometheus.Registry
	mp         *sdkmetric.MeterProvider
	bridge     *otelbridge.Bridge
	lim        atomic.Pointer[limiter.Limiter]
	thresholds atomic.Pointer[classify.Thresholds]
	sources    atomic.Pointer[func() []Source]
	upstreams  atomic.Pointer[map[string]string] // name → base URL, spelt as limiter.BaseKey spells it
	metrics    http.Handler
	// A scrape takes one snapshot, pinned for its producers and collectors
	// (lane gauges, lane states, budgets) while it runs: with shared lanes,
	// one read of the store per scrape. scrape serializes scrapes.
	scrape sync.Mutex
	pinned atomic.Pointer[limiter.Snapshot]
}

// SetUpstreams names the upstreams this process calls: name → base URL.
// Classification then names each lane's upstream, answers lookups by
// ?upstream=&model=, and reports a lane of a configured upstream that has
// had no call as idle instead of unknown.
func (t *Telemetry) SetUpstreams(ups map[string]string) {
	m := make(map[string]string, len(ups))
	for name, base := range ups {
		m[name] = limiter.CanonicalBase(base)
	}
	t.upstreams.Store(&m)
}

func (t *Telemetry) upstreamList() map[string]string {
	if m := t.upstreams.Load(); m != nil {
		return *m
	}
	return nil
}

// upstreamOf returns the name of the configured upstream that lane calls.
func (t *Telemetry) upstreamOf(lane string) string {
	base, _ := limiter.SplitLaneKey(lane)
	for name, b := range t.upstreamList() {
		if b == base {
			return name
		}
	}
	return ""
}

// Source is another process's snapshot (a lanes-exporter target), to be
// classified beside this process's lanes.
type Source struct {
	Name     string           // the target's name
	Up       bool             // the last poll succeeded
	Error    string           // why the last poll failed
	Snapshot limiter.Snapshot // the last good snapshot
}

// SetSources makes classification also cover the lanes of the snapshots f
// returns (each classified lane names its target).
func (t *Telemetry) SetSources(f func() []Source) { t.sources.Store(&f) }

func (t *Telemetry) sourceList() []Source {
	if f := t.sources.Load(); f != nil {
		return (*f)()
	}
	return nil
}

// New sets up the registry, the OpenTelemetry meter provider exporting to
// it, and the bridge.
func New(o Options) (*Telemetry, error) {
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	th := o.Thresholds
	if th == (classify.Thresholds{}) {
		th = classify.DefaultThresholds()
	}
	if err := th.Validate(); err != nil {
		return nil, fmt.Errorf("telemetry: classification thresholds: %w", err)
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	b, err := otelbridge.New(otelbridge.Options{TracerProvider: o.TracerProvider, Propagator: o.Propagator, MaxTenantSeries: o.MaxTenantSeries})
	if err != nil {
		return nil, err
	}
	t := &Telemetry{reg: reg, bridge: b}
	t.thresholds.Store(&th)
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	b.UseSnapshots(t.Snapshot)
	// Every lane metric comes from a Producer (the bridge's, and the lane
	// states'), not from SDK instruments, so that an evicted lane's series
	// end with it; the meter provider is what the reader needs to collect.
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithNamespace(prefix),
		otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(),
		otelprom.WithProducer(b), otelprom.WithProducer(stateProducer{t}))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	// The GenAI conventions' client metrics keep their own names, with no
	// prefix: dashboards written for the conventions find them.
	genai, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(),
		otelprom.WithProducer(b.GenAIProducer()))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithReader(genai)}
	for _, e := range o.MetricExporters {
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(e,
			sdkmetric.WithProducer(b), sdkmetric.WithProducer(stateProducer{t}), sdkmetric.WithProducer(b.GenAIProducer()))))
	}
	t.mp = sdkmetric.NewMeterProvider(opts...)
	return t, nil
}

// stateProducer produces the lane-state gauges: for each of this process's
// lanes, 1 for its current state and 0 for the others, and 1 for each
// reason that holds and 0 for the others. They are stable series (no
// sentence in a label), so dashboards and alert rules can use them; the
// hold text stays in the JSON routes and on the status page.
type stateProducer struct{ t *Telemetry }

func (p stateProducer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := time.Now()
	var state, reason []metricdata.DataPoint[int64]
	for _, c := range p.t.Classify() {
		if c.Target != "" {
			continue // targets' states are exported with their other series
		}
		for _, s := range classify.States() {
			state = append(state, metricdata.DataPoint[int64]{Time: now, Value: boolInt(c.State == s),
				Attributes: attribute.NewSet(attribute.String("lane", c.Lane), attribute.String("state", string(s)))})
		}
		for _, r := range classify.Reasons() {
			reason = append(reason, metricdata.DataPoint[int64]{Time: now, Value: boolInt(slices.Contains(c.Reasons, r)),
				Attributes: attribute.NewSet(attribute.String("lane", c.Lane), attribute.String("reason", r))})
		}
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: otelbridge.ScopeName}, Metrics: []metricdata.Metrics{
		classDefs[0].Ints(state), classDefs[1].Ints(reason),
	}}}, nil
}

// classDefs declares the classification gauges: the lane's state, and its
// reasons; read only.
var classDefs = []otelbridge.Def{
	{Name: "llm.lane.state", Kind: otelbridge.Gauge, Labels: []string{"lane", "state"},
		Description: "Lane classification: 1 for the lane's current state (idle, healthy, local_queue, gateway_degraded), 0 for the others."},
	{Name: "llm.lane.reason", Kind: otelbridge.Gauge, Labels: []string{"lane", "reason"},
		Description: "1 for each classification reason that holds for the lane (every reason of the classification route, classify.Reasons), 0 for the others."},
}

// Defs returns the table of the metrics package telemetry produces beside
// the bridge's (otelbridge.Defs): the classification gauges (a copy).
func Defs() []otelbridge.Def { return append([]otelbridge.Def(nil), classDefs...) }

func boolInt(v bool) int64 {
	if v {
		return 1
	}
	return 0
}

// Observe is the limiter.Observer to pass to limiter.New.
func (t *Telemetry) Observe(ctx context.Context, e limiter.Event) { t.bridge.Observe(ctx, e) }

// Watch makes the routes and gauges report lim.
func (t *Telemetry) Watch(lim *limiter.Limiter) {
	t.lim.Store(lim)
	t.bridge.Watch(lim)
}

// Bridge returns the OpenTelemetry bridge, for its Transport.
func (t *Telemetry) Bridge() *otelbridge.Bridge { return t.bridge }

// Registry returns the Prometheus registry, to add collectors to it.
func (t *Telemetry) Registry() *prometheus.Registry { return t.reg }

// SetThresholds replaces the classification thresholds (hot reload).
func (t *Telemetry) SetThresholds(th classify.Thresholds) error {
	if err := th.Validate(); err != nil {
		return err
	}
	t.thresholds.Store(&th)
	return nil
}

// Shutdown stops the meter provider.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.mp.Shutdown(ctx) }

// Snapshot returns the watched limiter's snapshot (off when none is
// watched); during a scrape of /metrics, the one that scrape took.
func (t *Telemetry) Snapshot() limiter.Snapshot {
	if p := t.pinned.Load(); p != nil {
		return *p
	}
	if lim := t.lim.Load(); lim != nil {
		return lim.Snapshot()
	}
	return limiter.Snapshot{}
}

// serveMetrics answers a scrape from one snapshot, pinned while it runs.
func (t *Telemetry) serveMetrics(w http.ResponseWriter, r *http.Request) {
	t.scrape.Lock()
	defer t.scrape.Unlock()
	snap := t.Snapshot()
	t.pinned.Store(&snap)
	defer t.pinned.Store(nil)
	t.metrics.ServeHTTP(w, r)
}

// Classify classifies every lane of the snapshot, then every lane of the
// sources' last snapshots.
func (t *Telemetry) Classify() []classify.Classification {
	th := *t.thresholds.Load()
	out := t.ClassifyLanes(t.Snapshot())
	for _, src := range t.sourceList() {
		for _, l := range src.Snapshot.Lanes {
			c := classify.Lane(l, th)
			c.Upstream, c.Target = t.upstreamOf(l.Lane), src.Name
			out = append(out, c)
		}
	}
	return out
}

// ClassifyLanes classifies every lane of s, a snapshot of the watched
// limiter's, with the thresholds in force.
func (t *Telemetry) ClassifyLanes(s limiter.Snapshot) []classify.Classification {
	th := *t.thresholds.Load()
	out := make([]classify.Classification, 0, len(s.Lanes))
	for _, l := range s.Lanes {
		c := classify.Lane(l, th)
		c.Upstream = t.upstreamOf(l.Lane)
		out = append(out, c)
	}
	return out
}

// Paths of the routes.
const (
	MetricsPath        = "/metrics"
	SnapshotPath       = "/api/telemetry/llm-lanes"
	ClassificationPath = "/api/telemetry/llm-lanes/classification"
	HealthPath         = "/healthz"
)

// Register adds the routes to mux.
func (t *Telemetry) Register(mux *http.ServeMux) {
	mux.Handle(MetricsPath, readOnly(http.HandlerFunc(t.serveMetrics)))
	mux.Handle(SnapshotPath, readOnly(http.HandlerFunc(t.serveSnapshot)))
	mux.Handle(ClassificationPath, readOnly(http.HandlerFunc(t.serveClassification)))
	mux.Handle(HealthPath, readOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})))
}

// Handler returns a mux with the routes.
func (t *Telemetry) Handler() http.Handler {
	mux := http.NewServeMux()
	t.Register(mux)
	return mux
}

func (t *Telemetry) serveSnapshot(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, t.Snapshot())
}

// serveClassification answers with every lane's classification, or one
// lane's: by key (?lane=, with &target= for another process's lane) or by
// configured upstream and model (?upstream=&model=). A lane of a configured
// upstream that has had no call is idle, not unknown.
func (t *Telemetry) serveClassification(w http.ResponseWriter, r *http.Request) {
	s := t.Snapshot()
	srcs := t.sourceList()
	if !s.Enabled && len(srcs) == 0 {
		writeJSON(w, http.StatusOK, classify.Report{Version: classify.Version})
		return
	}
	th := *t.thresholds.Load()
	q := r.URL.Query()
	lane, target := q.Get("lane"), q.Get("target")
	if up, model := q.Get("upstream"), q.Get("model"); up != "" || model != "" {
		base, ok := t.upstreamList()[up]
		switch {
		case lane != "":
			writeJSON(w, http.StatusBadRequest, classify.ErrorBody{Version: classify.Version, Error: "give either lane, or upstream and model"})
			return
		case up == "" || model == "":
			writeJSON(w, http.StatusBadRequest, classify.ErrorBody{Version: classify.Version, Error: "give both upstream and model"})
			return
		case !ok:
			writeJSON(w, http.StatusNotFound, classify.ErrorBody{Version: classify.Version, Error: fmt.Sprintf("no upstream named %q is configured", up)})
			return
		}
		lane = base + "|" + model
	}
	if lane == "" {
		rep := classify.Report{Version: classify.Version, Enabled: s.Enabled, GeneratedAt: s.GeneratedAt, Thresholds: th.JSON(), Lanes: t.Classify()}
		if rep.GeneratedAt.IsZero() {
			rep.GeneratedAt = time.Now().UTC().Truncate(time.Second)
		}
		for _, src := range srcs {
			rep.Targets = append(rep.Targets, classify.TargetStatus{Name: src.Name, Up: src.Up, Error: src.Error})
		}
		writeJSON(w, http.StatusOK, rep)
		return
	}
	for _, c := range t.Classify() {
		if c.Lane == lane && c.Target == target {
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
	// A lane of this process that calls a configured upstream but has had
	// no call yet.
	if name := t.upstreamOf(lane); name != "" && target == "" && s.Enabled {
		c := classify.IdleLane(lane, t.lim.Load().Config().MaxInflight, th)
		c.Upstream = name
		writeJSON(w, http.StatusOK, c)
		return
	}
	writeJSON(w, http.StatusNotFound, classify.ErrorBody{Version: classify.Version, Error: fmt.Sprintf("no lane %q (target %q)", lane, target)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// readOnly answers 405 to anything but GET and HEAD: the telemetry routes
// change nothing.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only route: use GET", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}
