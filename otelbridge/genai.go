package otelbridge

import (
	"context"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// The OpenTelemetry GenAI semantic conventions' client metrics (v1.41.0,
// package genaiconv: their names, units, descriptions and attributes), so
// that dashboards and alerts written for them (Envoy AI Gateway's,
// agentgateway's) see the calls through llmlanes:
//
//	gen_ai.client.operation.duration               histogram, s: the call as its caller sees it,
//	                                               from the start of its wait for a slot to the
//	                                               end of its answer; error.type on failure
//	gen_ai.client.token.usage                      histogram, {token}: input and output
//	                                               (gen_ai.token.type), from the settled usage
//	gen_ai.client.operation.time_to_first_chunk    histogram, s: streamed calls, from sending
//	gen_ai.client.operation.time_per_output_chunk  histogram, s: streamed calls, each chunk
//	                                               after the first
//
// with gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
// server.address and server.port. The bridge keeps them as it keeps its
// own (a lane's series end with the lane) and hands them over through a
// Producer of their own (GenAIProducer), so that an exporter may name them
// as the conventions do, without the lane metrics' prefix. The
// conventions have no name for the time queued; the lane metrics keep it
// (llm.queue.wait).

// The conventions' advised bucket bounds.
var (
	genaiDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genaiTokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	genaiChunkBuckets    = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
)

// genaiKey is what tells the GenAI series apart: their attributes. Two
// lanes may share one (the same model on two paths of one host): their
// calls are one series, as the conventions see them.
type genaiKey struct {
	op, provider, model, address string
	port                         int
	errType                      string // "" for success, and for the token series
}

// genaiTable is the bridge's GenAI series. Each remembers the lanes whose
// calls it counts, and ends when the last of them is evicted, so that the
// series stay bounded by the limiter's lanes.
type genaiTable struct {
	mu     sync.Mutex
	series map[genaiKey]*genaiSeries
}

type genaiSeries struct {
	start      time.Time
	lanes      map[string]struct{}
	attrs      attribute.Set // the duration's, the chunks'
	duration   histogram
	tokens     *[2]histogram // whole numbers, produced as int64; nil until a call reports usage
	tokenAttrs [2]attribute.Set
	chunks     *[2]histogram // time to the first chunk, per chunk after it; nil until a stream
}

// genaiBase is a lane's request model and server, read from its key once,
// when the lane's metrics are made, so that an event parses no URL.
type genaiBase struct {
	model, address string
	port           int
}

func newGenAIBase(key string) genaiBase {
	base, model := limiter.SplitLaneKey(key)
	g := genaiBase{model: model}
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		g.address = u.Hostname()
		var err error
		if g.port, err = strconv.Atoi(u.Port()); err != nil {
			g.port = 443
			if u.Scheme == "http" {
				g.port = 80
			}
		}
	}
	return g
}

// get returns the series of k, counting lane in it; under t.mu.
func (t *genaiTable) get(k genaiKey, lane string, now time.Time) *genaiSeries {
	s := t.series[k]
	if s == nil {
		attrs := []attribute.KeyValue{semconv.GenAIOperationNameKey.String(k.op), semconv.GenAIProviderNameKey.String(k.provider),
			semconv.GenAIRequestModel(k.model)}
		if k.address != "" {
			attrs = append(attrs, semconv.ServerAddress(k.address), semconv.ServerPort(k.port))
		}
		if k.errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
		}
		s = &genaiSeries{start: now, lanes: map[string]struct{}{}, attrs: attribute.NewSet(attrs...)}
		s.duration.init(genaiDurationBuckets)
		if t.series == nil {
			t.series = map[genaiKey]*genaiSeries{}
		}
		t.series[k] = s
	}
	if _, ok := s.lanes[lane]; !ok {
		s.lanes[lane] = struct{}{}
	}
	return s
}

// forget ends the series that no lane but lane counted.
func (t *genaiTable) forget(lane string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, s := range t.series {
		delete(s.lanes, lane)
		if len(s.lanes) == 0 {
			delete(t.series, k)
		}
	}
}

// SetProviders names the GenAI provider (gen_ai.provider.name) of the
// lanes of each base URL, as limiter.CanonicalBase spells it: "openai",
// "anthropic", "azure.ai.openai", ... Lanes of other base URLs are
// "anthropic" for Anthropic's Messages API and "openai" for the rest
// (OpenAI-compatible gateways), as the spans are.
func (b *Bridge) SetProviders(byBase map[string]string) {
	m := make(map[string]string, len(byBase))
	for base, p := range byBase {
		m[limiter.CanonicalBase(base)] = p
	}
	b.providers.Store(&m)
}

// genaiNames returns the operation and provider of a call of lane with
// request path path ("" when not known: then the call span's, if any, else
// chat).
func (b *Bridge) genaiNames(ctx context.Context, lane, path string) (op, provider string) {
	op = "chat"
	switch {
	case path != "":
		if kv := operation(path); kv.Valid() {
			op = kv.Value.AsString()
		}
	default:
		if info, ok := ctx.Value(callInfoKey{}).(*callInfo); ok && info.gen != nil {
			op = info.op
		}
	}
	base, _ := limiter.SplitLaneKey(lane)
	if m := b.providers.Load(); m != nil {
		if p, ok := (*m)[base]; ok {
			return op, p
		}
	}
	return op, providerByPath(path)
}

// genaiErrorType names a failed exchange with the project's error codes
// (package lanehttp's table), or the HTTP status of an error answer, one
// of the statuses gateways answer with (errorStatuses; any other is
// "_OTHER", as the conventions say, so that a gateway that makes up
// statuses cannot make up series); "" for a success.
func genaiErrorType(x limiter.Exchange) string {
	switch x.Outcome {
	case limiter.OutcomeOK:
		return ""
	case limiter.OutcomeStall:
		return lanehttp.UpstreamStallCode
	case limiter.OutcomeTransportError:
		return lanehttp.UpstreamUnreachableCode
	}
	if x.Status != 0 {
		if slices.Contains(errorStatuses, x.Status) {
			return strconv.Itoa(x.Status)
		}
		return "_OTHER"
	}
	return x.Outcome.String()
}

// errorStatuses are the error statuses error.type names as such.
var errorStatuses = []int{400, 401, 402, 403, 404, 408, 409, 413, 422, 429, 499, 500, 502, 503, 504, 529}

// recordGenAIExchange records a call that reached the gateway. A call its
// caller gave up (canceled, or stopped reading) is no operation that ended:
// it is not recorded.
func (b *Bridge) recordGenAIExchange(ctx context.Context, m *laneMetrics, lane string, x limiter.Exchange) {
	if x.Outcome == limiter.OutcomeCanceled || x.Outcome == limiter.OutcomeClientStall {
		return
	}
	var call limiter.ExchangeCall
	if x.Call != nil {
		call = *x.Call
	}
	op, provider := b.genaiNames(ctx, lane, call.Path)
	model, address, port := m.genai.model, m.genai.address, m.genai.port
	began := call.Began
	if began.IsZero() {
		began = x.Sent
	}
	now := b.now()
	t := &b.genai
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.get(genaiKey{op, provider, model, address, port, genaiErrorType(x)}, lane, now)
	s.duration.record(ctx, seconds(x.Sent.Add(x.Duration).Sub(began)), now)
	if tk := x.Tokens; tk != nil && tk.Used != (limiter.Usage{}) {
		ok := t.get(genaiKey{op, provider, model, address, port, ""}, lane, now) // no error.type on usage
		if ok.tokens == nil {
			ok.tokens = new([2]histogram)
			for i, tt := range []genaiconv.TokenTypeAttr{genaiconv.TokenTypeInput, genaiconv.TokenTypeOutput} {
				ok.tokens[i].init(genaiTokenBuckets)
				kv := append(ok.attrs.ToSlice(), semconv.GenAITokenTypeKey.String(string(tt)))
				ok.tokenAttrs[i] = attribute.NewSet(kv...)
			}
		}
		ok.tokens[0].record(ctx, float64(tk.Used.Prompt), now)
		ok.tokens[1].record(ctx, float64(tk.Used.Completion), now)
	}
	if call.Stream && x.FirstByte > 0 {
		if s.chunks == nil {
			s.chunks = new([2]histogram)
			s.chunks[0].init(genaiDurationBuckets)
			s.chunks[1].init(genaiChunkBuckets)
		}
		s.chunks[0].record(ctx, x.FirstByte.Seconds(), now)
		// Each chunk after the first: the chunks' mean spacing, so that
		// the count and the sum are exact (the transport times the first
		// and the last read, not each chunk).
		if n := call.Chunks - 1; n > 0 && call.LastByte > x.FirstByte {
			s.chunks[1].recordN((call.LastByte-x.FirstByte).Seconds()/float64(n), uint64(n))
		}
	}
}

// recordGenAIRefusal records a call its lane refused after a wait (a queue
// timeout): the caller's operation failed, with the project's code.
func (b *Bridge) recordGenAIRefusal(ctx context.Context, m *laneMetrics, e limiter.Event, code string) {
	op, provider := b.genaiNames(ctx, e.Lane, "")
	model, address, port := m.genai.model, m.genai.address, m.genai.port
	now := b.now()
	t := &b.genai
	t.mu.Lock()
	defer t.mu.Unlock()
	t.get(genaiKey{op, provider, model, address, port, code}, e.Lane, now).duration.record(ctx, seconds(e.Wait), now)
}

// GenAIProducer returns a metric Producer of the GenAI client metrics
// alone (the bridge's own Produce leaves them out): give it to a reader
// whose names must be the conventions', such as a Prometheus exporter with
// no namespace.
func (b *Bridge) GenAIProducer() sdkmetric.Producer { return genaiProducer{b} }

type genaiProducer struct{ b *Bridge }

func (p genaiProducer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	b := p.b
	now := b.now()
	var dur, first, per []metricdata.HistogramDataPoint[float64]
	var tok []metricdata.HistogramDataPoint[int64]
	t := &b.genai
	t.mu.Lock()
	keys := make([]genaiKey, 0, len(t.series))
	for k := range t.series {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	for _, k := range keys {
		s := t.series[k]
		if s.duration.count > 0 {
			dur = append(dur, s.duration.point(s.attrs, s.start, now))
		}
		if s.tokens != nil {
			for i := range s.tokens {
				tok = append(tok, s.tokens[i].pointInt(s.tokenAttrs[i], s.start, now))
			}
		}
		if s.chunks != nil {
			first = append(first, s.chunks[0].point(s.attrs, s.start, now))
			per = append(per, s.chunks[1].point(s.attrs, s.start, now))
		}
	}
	t.mu.Unlock()
	var ms []metricdata.Metrics
	hist := func(name, unit, desc string, pts []metricdata.HistogramDataPoint[float64]) {
		if len(pts) > 0 {
			ms = append(ms, metricdata.Metrics{Name: name, Unit: unit, Description: desc,
				Data: metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: pts}})
		}
	}
	var d genaiconv.ClientOperationDuration
	hist(d.Name(), d.Unit(), d.Description(), dur)
	if len(tok) > 0 {
		var u genaiconv.ClientTokenUsage
		ms = append(ms, metricdata.Metrics{Name: u.Name(), Unit: u.Unit(), Description: u.Description(),
			Data: metricdata.Histogram[int64]{Temporality: metricdata.CumulativeTemporality, DataPoints: tok}})
	}
	var f genaiconv.ClientOperationTimeToFirstChunk
	hist(f.Name(), f.Unit(), f.Description(), first)
	var c genaiconv.ClientOperationTimePerOutputChunk
	hist(c.Name(), c.Unit(), c.Description(), per)
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName, SchemaURL: semconv.SchemaURL}, Metrics: ms}}, nil
}

func (a genaiKey) less(b genaiKey) bool {
	switch {
	case a.model != b.model:
		return a.model < b.model
	case a.address != b.address:
		return a.address < b.address
	case a.port != b.port:
		return a.port < b.port
	case a.op != b.op:
		return a.op < b.op
	case a.provider != b.provider:
		return a.provider < b.provider
	}
	return a.errType < b.errType
}

// recordN counts v n times, as n samples of one value.
func (h *histogram) recordN(v float64, n uint64) {
	i := sort.SearchFloat64s(h.bounds, v)
	h.mu.Lock()
	h.counts[i] += n
	h.sum += v * float64(n)
	h.count += n
	h.mu.Unlock()
}

// pointInt returns the data point of a histogram of whole numbers.
func (h *histogram) pointInt(attrs attribute.Set, start, now time.Time) metricdata.HistogramDataPoint[int64] {
	h.mu.Lock()
	defer h.mu.Unlock()
	return metricdata.HistogramDataPoint[int64]{Attributes: attrs, StartTime: start, Time: now,
		Count: h.count, Bounds: h.bounds, BucketCounts: append([]uint64(nil), h.counts...), Sum: int64(h.sum)}
}

// GenAIDefs returns the GenAI conventions' client metrics that
// GenAIProducer produces, as Defs (their names, units and descriptions
// are genaiconv's), for the documentation: each is a histogram, with no
// prefix in Prometheus whatever metrics.prefix is.
func GenAIDefs() []Def {
	labels := []string{"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "server.address", "server.port"}
	var (
		d genaiconv.ClientOperationDuration
		u genaiconv.ClientTokenUsage
		f genaiconv.ClientOperationTimeToFirstChunk
		c genaiconv.ClientOperationTimePerOutputChunk
	)
	def := func(name, unit, desc string, extra ...string) Def {
		return Def{Name: name, Unit: unit, Kind: Histogram, Description: desc, Labels: append(slices.Clone(labels), extra...)}
	}
	return []Def{
		def(d.Name(), d.Unit(), d.Description(), "error.type"),
		def(u.Name(), u.Unit(), u.Description(), "gen_ai.token.type"),
		def(f.Name(), f.Unit(), f.Description()),
		def(c.Name(), c.Unit(), c.Description()),
	}
}
