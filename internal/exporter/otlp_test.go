package exporter

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/llmlanes/llmlanes/internal/otelsetup"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback: it speaks the
// real protocol (protobuf over POST /v1/traces) and keeps the spans.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("OTLP request %s %s %s", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
		}
		b, _ := io.ReadAll(req.Body)
		var msg coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &msg); err != nil {
			t.Errorf("OTLP body: %v", err)
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) byName() map[string]*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]*tracepb.Span{}
	for _, s := range r.spans {
		m[s.Name] = s
	}
	return m
}

// Traces out of the binary: with OTEL_EXPORTER_OTLP_ENDPOINT set, a proxied
// streaming call that arrives with a traceparent is exported over OTLP/HTTP
// as a call span whose parent is the caller's span, with the queue-wait and
// upstream spans as its children; the gateway receives the call span as
// its parent, and the wait histogram's exemplar names the trace.
func TestTracesExportedOverOTLP(t *testing.T) {
	rcv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "lanes-exporter-test")
	setup, err := otelsetup.FromEnv(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if !setup.Traces {
		t.Fatal("traces are off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	var gwTraceparent string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		gwTraceparent = r.Header.Get("Traceparent")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \""+up.URL+"/v1\"}]\n",
		Options{TracerProvider: setup.TracerProvider, Propagator: setup.Propagator})
	const traceID, callerSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest(http.MethodPost, h.base+"/proxy/gw/chat/completions", strings.NewReader(chat))
	req.Header.Set("Traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("stream %q", body)
	}
	om := metricsOpenMetrics(t, h.base)
	if err := setup.Shutdown(context.Background()); err != nil { // flushes the batch
		t.Fatal(err)
	}
	spans := rcv.byName()
	call, queue, upstream := spans["chat protolabs/smart"], spans["llm.queue_wait"], spans["llm.upstream"]
	if call == nil || queue == nil || upstream == nil {
		t.Fatalf("spans received: %v", keys(spans))
	}
	id := func(b []byte) string { return hex.EncodeToString(b) }
	if id(call.TraceId) != traceID || id(call.ParentSpanId) != callerSpan {
		t.Fatalf("call span in trace %s with parent %s, want the caller's %s/%s", id(call.TraceId), id(call.ParentSpanId), traceID, callerSpan)
	}
	for _, c := range []*tracepb.Span{queue, upstream} {
		if id(c.TraceId) != traceID || id(c.ParentSpanId) != id(call.SpanId) {
			t.Fatalf("%s is not a child of the call span", c.Name)
		}
	}
	if !strings.Contains(gwTraceparent, traceID) || !strings.Contains(gwTraceparent, id(call.SpanId)) {
		t.Fatalf("the gateway got traceparent %q, want the call span %s", gwTraceparent, id(call.SpanId))
	}
	if !strings.Contains(om, "llmlanes_llm_queue_wait_seconds_bucket{") || !strings.Contains(om, `trace_id="`+traceID+`"`) {
		t.Fatalf("no exemplar with the trace id in:\n%s", grepLines(om, "queue_wait_seconds_bucket"))
	}
}

func metricsOpenMetrics(t *testing.T, base string) string {
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func keys(m map[string]*tracepb.Span) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
