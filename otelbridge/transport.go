package otelbridge

import (
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Transport returns a RoundTripper that opens one span per request around
// base (normally a lanehttp.Transport) and ends it when the response body
// ends, so that the bridge's queue-wait and upstream spans are its children.
// Requests that are not model calls get a span too; it simply has no lane
// children.
func (b *Bridge) Transport(base http.RoundTripper) http.RoundTripper {
	return &transport{b: b, base: base}
}

type transport struct {
	b    *Bridge
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := trace.WithTimestamp(t.b.now())
	host, port := req.URL.Hostname(), req.URL.Port()
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("http.request.method", req.Method),
		attribute.String("server.address", host),
	}
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, attribute.Int("server.port", p))
	} else if req.URL.Scheme == "https" {
		attrs = append(attrs, attribute.Int("server.port", 443))
	} else if req.URL.Scheme == "http" {
		attrs = append(attrs, attribute.Int("server.port", 80))
	}
	ctx, span := t.b.tracer.Start(req.Context(), "llm.call", start, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	res, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("error.type", errType(err)))
		span.End(trace.WithTimestamp(t.b.now()))
		return nil, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", res.StatusCode))
	if res.StatusCode >= 400 {
		span.SetStatus(codes.Error, res.Status)
		// A synthesized queue timeout (503, x-should-retry: false) already
		// has error.type lane_queue_timeout from the bridge.
		if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("X-Should-Retry") != "false" {
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(res.StatusCode)))
		}
	}
	res.Body = &spanBody{ReadCloser: res.Body, end: func() { span.End(trace.WithTimestamp(t.b.now())) }}
	return res, nil
}

func errType(err error) string {
	type timeout interface{ Timeout() bool }
	if t, ok := err.(timeout); ok && t.Timeout() {
		return "timeout"
	}
	return "transport_error"
}

// spanBody ends the call span when the body ends.
type spanBody struct {
	io.ReadCloser
	once sync.Once
	end  func()
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.end)
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.end)
	return err
}
