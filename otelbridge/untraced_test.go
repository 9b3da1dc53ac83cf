package otelbridge_test

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/llmlanes/llmlanes/otelbridge"
)

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// With the no-op TracerProvider, a call outside any trace goes to the base
// transport as it is (no span, no copy of the request), and a call inside
// one still hands its trace on in traceparent.
func TestUntracedPassesThrough(t *testing.T) {
	b, _ := otelbridge.New(otelbridge.Options{TracerProvider: tracenoop.NewTracerProvider(), Propagator: propagation.TraceContext{}})
	var got *http.Request
	tr := b.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	}))
	req, _ := http.NewRequest(http.MethodPost, "http://gw.example/v1/chat/completions", http.NoBody)
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got != req {
		t.Error("outside a trace, the request was copied on its way to the base transport")
	}

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	req, _ = http.NewRequestWithContext(trace.ContextWithSpanContext(context.Background(), sc), http.MethodPost, "http://gw.example/v1/chat/completions", http.NoBody)
	res, err = tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if want := "00-01000000000000000000000000000000-0200000000000000-01"; got.Header.Get("traceparent") != want {
		t.Errorf("traceparent %q, want %q", got.Header.Get("traceparent"), want)
	}
	if req.Header.Get("traceparent") != "" {
		t.Error("the caller's request was changed")
	}
}
