package otelbridge_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
	"github.com/llmlanes/llmlanes/otelbridge"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

var t0 = time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)

type rig struct {
	t      *testing.T
	clock  *limitertest.Clock
	lim    *limiter.Limiter
	rec    *tracetest.SpanRecorder
	b      *otelbridge.Bridge
	lt     *lanehttp.Transport
	client *http.Client
	gw     *httptest.Server
	queued chan struct{}
	lane   string
	tenant string // the calls' tenant, if not ""
	mu     sync.Mutex
	tp     string // the last traceparent the gateway saw
}

func (r *rig) traceparent() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tp
}

// newRig: a limiter of one slot on a fake clock, the bridge recording spans,
// and a loopback gateway whose work takes 2 s of fake time; handle may take
// over a request.
func newRig(t *testing.T, tr func(*lanehttp.Transport), handle func(w http.ResponseWriter, r *http.Request) bool) *rig {
	r := &rig{t: t, clock: limitertest.NewClock(t0), rec: tracetest.NewSpanRecorder(), queued: make(chan struct{}, 10)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	b, err := otelbridge.New(otelbridge.Options{TracerProvider: tp, Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	r.lim, _ = limiter.New(limiter.Config{MaxInflight: 1}, limiter.WithClock(r.clock), limiter.WithObserver(b.Observe),
		limiter.WithObserver(func(_ context.Context, e limiter.Event) {
			if e.Kind == limiter.Enqueued {
				r.queued <- struct{}{}
			}
		}))
	b.Watch(r.lim)
	done := make(chan struct{})
	r.gw = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.tp = req.Header.Get("Traceparent")
		r.mu.Unlock()
		if handle != nil && handle(w, req) {
			return
		}
		r.clock.Advance(2 * time.Second)
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(func() { close(done); r.gw.Close() })
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	lt := &lanehttp.Transport{Limiter: r.lim, Base: base, CancelPropagates: true} // the test gateway stops when its client goes
	if tr != nil {
		tr(lt)
	}
	r.client = &http.Client{Transport: b.Transport(lt)}
	r.b, r.lt = b, lt
	r.lane = r.gw.URL + "/v1|protolabs/smart"
	return r
}

// call makes a bulk model call that has to queue behind a held slot for
// wait (fake time) or, with wait 0, gets a slot at once.
func (r *rig) call(wait time.Duration) (int, error) {
	var held limiter.Slot
	if wait > 0 {
		held, _ = r.lim.Acquire(context.Background(), r.lane)
	}
	type out struct {
		code int
		err  error
	}
	ch := make(chan out, 1)
	go func() {
		ctx := limiter.WithPriority(context.Background(), limiter.Bulk)
		if r.tenant != "" {
			ctx = limiter.WithTenant(ctx, r.tenant)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.gw.URL+"/v1/chat/completions?api-key=sk-secret", strings.NewReader(`{"model":"protolabs/smart"}`))
		res, err := r.client.Do(req)
		if err != nil {
			ch <- out{0, err}
			return
		}
		_, err = io.ReadAll(res.Body)
		res.Body.Close()
		ch <- out{res.StatusCode, err}
	}()
	if wait > 0 {
		<-r.queued
		r.clock.Advance(wait)
		held.Release()
	}
	select {
	case o := <-ch:
		return o.code, o.err
	case <-time.After(10 * time.Second):
		r.t.Fatal("the call never ended")
		return 0, nil
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func byName(t *testing.T, spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = s
	}
	return m
}

// A call that names a tenant: its call and queue-wait spans carry it; one
// that names none carries no tenant attribute.
func TestSpansCarryTenant(t *testing.T) {
	for _, tenant := range []string{"board-a", ""} {
		r := newRig(t, nil, nil)
		r.tenant = tenant
		if code, err := r.call(time.Second); err != nil || code != 200 {
			t.Fatalf("call: %d %v", code, err)
		}
		spans := byName(t, r.rec.Ended())
		for _, name := range []string{"chat protolabs/smart", "llm.queue_wait"} {
			got, ok := attrs(spans[name])["llmlanes.tenant"]
			if tenant == "" && ok {
				t.Errorf("%s: llmlanes.tenant %v on a call that names none", name, got.AsString())
			}
			if tenant != "" && got.AsString() != tenant {
				t.Errorf("%s: llmlanes.tenant %q, want %q", name, got.AsString(), tenant)
			}
		}
	}
}

// 3. A call span with its queue-wait and upstream children.
func TestCallSpanHasQueueAndUpstreamChildren(t *testing.T) {
	r := newRig(t, nil, nil)
	if code, err := r.call(5 * time.Second); err != nil || code != 200 {
		t.Fatalf("call: %d %v", code, err)
	}
	spans := byName(t, r.rec.Ended())
	call, queue, up := spans["chat protolabs/smart"], spans["llm.queue_wait"], spans["llm.upstream"]
	if call == nil || queue == nil || up == nil || len(spans) != 3 {
		t.Fatalf("spans %v", keys(spans))
	}
	for _, c := range []sdktrace.ReadOnlySpan{queue, up} {
		if c.Parent().SpanID() != call.SpanContext().SpanID() || c.SpanContext().TraceID() != call.SpanContext().TraceID() {
			t.Fatalf("%s is not a child of the call span", c.Name())
		}
	}
	if !queue.StartTime().Equal(t0) || !queue.EndTime().Equal(t0.Add(5*time.Second)) {
		t.Fatalf("queue span %v .. %v, want the 5 s wait from t0", queue.StartTime(), queue.EndTime())
	}
	if up.StartTime().Before(queue.EndTime()) {
		t.Fatalf("upstream span starts %v, before the queue wait ends %v", up.StartTime(), queue.EndTime())
	}
	if d := up.EndTime().Sub(up.StartTime()); d != 2*time.Second {
		t.Fatalf("upstream span lasts %v, want the gateway's 2 s", d)
	}
	if call.StartTime().After(queue.StartTime()) || call.EndTime().Before(up.EndTime()) {
		t.Fatal("the call span does not cover its children")
	}
	ca, qa, ua := attrs(call), attrs(queue), attrs(up)
	for k, want := range map[attribute.Key]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "protolabs/smart",
		"http.request.method": "POST", "server.address": "127.0.0.1", "http.response.status_code": int64(200),
		"url.full": r.gw.URL + "/v1/chat/completions?api-key=REDACTED", "llmlanes.lane": r.lane,
		"llmlanes.priority": "bulk", "llmlanes.outcome": "ok",
	} {
		if got := ca[k].AsInterface(); got != want {
			t.Errorf("call %s = %v, want %v", k, got, want)
		}
	}
	for k, want := range map[attribute.Key]any{"llmlanes.lane": r.lane, "llmlanes.priority": "bulk",
		"llmlanes.queue.position": int64(1), "llmlanes.outcome": "granted"} {
		if got := qa[k].AsInterface(); got != want {
			t.Errorf("queue %s = %v, want %v", k, got, want)
		}
	}
	if ua["http.response.status_code"].AsInt64() != 200 || ua["llmlanes.outcome"].AsString() != "ok" ||
		ua["http.request.method"].AsString() != "POST" || ua["server.address"].AsString() != "127.0.0.1" ||
		ua["url.full"].AsString() != ca["url.full"].AsString() || ua["server.port"].AsInt64() == 0 {
		t.Errorf("upstream attrs %v", ua)
	}
	if call.InstrumentationScope().SchemaURL != semconv.SchemaURL {
		t.Errorf("schema URL %q", call.InstrumentationScope().SchemaURL)
	}
	// The gateway received the call span's context as traceparent.
	if got, want := r.traceparent(), call.SpanContext().SpanID().String(); !strings.Contains(got, want) ||
		!strings.Contains(got, call.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q, want the call span %s", got, want)
	}
	if _, ok := ca["error.type"]; ok || call.Status().Code == codes.Error {
		t.Errorf("successful call marked as an error")
	}
}

func TestQueueTimeoutSpan(t *testing.T) {
	r := newRig(t, nil, nil)
	if code, err := r.call(limiter.DefaultQueueTimeout); err != nil || code != 503 {
		t.Fatalf("call: %d %v", code, err)
	}
	spans := byName(t, r.rec.Ended())
	call, queue := spans["chat protolabs/smart"], spans["llm.queue_wait"]
	if call == nil || queue == nil || spans["llm.upstream"] != nil {
		t.Fatalf("spans %v", keys(spans))
	}
	for _, s := range []sdktrace.ReadOnlySpan{call, queue} {
		if s.Status().Code != codes.Error || attrs(s)["error.type"].AsString() != "lane_queue_timeout" {
			t.Fatalf("%s: status %v error.type %q", s.Name(), s.Status(), attrs(s)["error.type"].AsString())
		}
	}
	if d := queue.EndTime().Sub(queue.StartTime()); d != limiter.DefaultQueueTimeout {
		t.Fatalf("queue span %v", d)
	}
}

func TestStallSpan(t *testing.T) {
	var r *rig
	r = newRig(t, func(tr *lanehttp.Transport) { tr.StallTimeout = 10 * time.Second }, func(w http.ResponseWriter, req *http.Request) bool {
		before := r.clock.Pending()
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		// Once the client has the headers, its stall guard is armed; then
		// 10 s of silence pass.
		for deadline := time.Now().Add(10 * time.Second); r.clock.Pending() == before && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		// and the client reads, waiting for the body (else it is the
		// client that stalls).
		for deadline := time.Now().Add(10 * time.Second); !inBodyRead() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		r.clock.Advance(10 * time.Second)
		select {
		case <-req.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	})
	if _, err := r.call(0); err == nil || !strings.Contains(err.Error(), "sent no response body") {
		t.Fatalf("call err %v, want a stall", err)
	}
	spans := byName(t, r.rec.Ended())
	up, call := spans["llm.upstream"], spans["chat protolabs/smart"]
	if up == nil || attrs(up)["error.type"].AsString() != "upstream_stall" || up.Status().Code != codes.Error {
		t.Fatalf("upstream span %v", up)
	}
	if attrs(call)["error.type"].AsString() != "upstream_stall" {
		t.Fatalf("call error.type %v", attrs(call)["error.type"])
	}
}

// Without a recording span (no SDK, or not sampled) the bridge makes none.
func TestNoSpansWithoutRecordingParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	b, _ := otelbridge.New(otelbridge.Options{TracerProvider: tp})
	b.Observe(context.Background(), limiter.Event{Kind: limiter.Acquired, Lane: "l|m", Wait: time.Second})
	b.Observe(context.Background(), limiter.Event{Kind: limiter.Exchanged, Lane: "l|m", Exchange: limiter.Exchange{Status: 200}})
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans without a call span", n)
	}
}

func keys(m map[string]sdktrace.ReadOnlySpan) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// Operations are named by what they are: an embeddings call is not chat.
func TestOperationNames(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	b, _ := otelbridge.New(otelbridge.Options{TracerProvider: tp})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer gw.Close()
	for path, want := range map[string][2]string{
		"/v1/embeddings":       {"embeddings", "openai"},
		"/v1/completions":      {"text_completion", "openai"},
		"/v1/responses":        {"chat", "openai"},
		"/v1/messages":         {"chat", "anthropic"},
		"/v1/chat/completions": {"chat", "openai"},
	} {
		c := &http.Client{Transport: b.Transport(http.DefaultTransport)}
		res, err := c.Post(gw.URL+path, "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		ended := rec.Ended()
		a := attrs(ended[len(ended)-1])
		if a["gen_ai.operation.name"].AsString() != want[0] || a["gen_ai.provider.name"].AsString() != want[1] {
			t.Errorf("%s: operation %q provider %q, want %v", path, a["gen_ai.operation.name"].AsString(), a["gen_ai.provider.name"].AsString(), want)
		}
	}
	c := &http.Client{Transport: b.Transport(http.DefaultTransport, otelbridge.WithProviderName("groq"))}
	res, _ := c.Post(gw.URL+"/openai/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	res.Body.Close()
	if a := attrs(rec.Ended()[len(rec.Ended())-1]); a["gen_ai.provider.name"].AsString() != "groq" {
		t.Errorf("provider %v", a["gen_ai.provider.name"])
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// A call whose slot is taken ahead of its round trip (a proxy's Admit),
// with its call span announced first (StartCall): the same three spans as a
// call that waits inside the Transport, the call span from the
// announcement to the end of the response, the queue wait and the
// exchange its children; and EndCall ends the span of a call that went no
// further.
func TestStartCallAheadOfAdmit(t *testing.T) {
	r := newRig(t, nil, nil)
	held, _ := r.lim.Acquire(context.Background(), r.lane)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"protolabs/smart"}`))
		req = r.lt.Admit(r.b.StartCall(req.WithContext(limiter.WithPriority(context.Background(), limiter.Bulk))))
		defer otelbridge.EndCall(req)
		defer lanehttp.Abandon(req)
		res, err := r.client.Do(req)
		if err == nil {
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		done <- err
	}()
	<-r.queued
	r.clock.Advance(5 * time.Second)
	held.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	spans := byName(t, r.rec.Ended())
	call, queue, up := spans["chat protolabs/smart"], spans["llm.queue_wait"], spans["llm.upstream"]
	if call == nil || queue == nil || up == nil || len(spans) != 3 {
		t.Fatalf("spans %v", keys(spans))
	}
	for _, c := range []sdktrace.ReadOnlySpan{queue, up} {
		if c.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Fatalf("%s is not a child of the call span", c.Name())
		}
	}
	if !call.StartTime().Equal(t0) || !queue.StartTime().Equal(t0) || !call.EndTime().Equal(up.EndTime()) {
		t.Fatalf("call %v..%v, queue from %v, upstream to %v", call.StartTime(), call.EndTime(), queue.StartTime(), up.EndTime())
	}
	if ca := attrs(call); ca["server.address"].AsString() != "127.0.0.1" || ca["http.response.status_code"].AsInt64() != 200 {
		t.Fatalf("the call span lacks the round trip's HTTP attributes: %v", ca)
	}

	// Admitted, then abandoned: its two spans end, no more.
	req, _ := http.NewRequest(http.MethodPost, r.gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"protolabs/smart"}`))
	req = r.lt.Admit(r.b.StartCall(req))
	lanehttp.Abandon(req)
	otelbridge.EndCall(req)
	otelbridge.EndCall(req) // once
	if n := len(r.rec.Ended()); n != 5 {
		t.Fatalf("%d spans ended, want 3 + the abandoned call's 2", n)
	}
}

// inBodyRead reports whether a goroutine is blocked reading a lane
// transport's response body.
func inBodyRead() bool {
	buf := make([]byte, 1<<20)
	return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("lanehttp.(*exchange).read("))
}
