package otelbridge

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmlanes/llmlanes/internal/redact"
)

// TransportOption configures Transport.
type TransportOption func(*transport)

// WithProviderName sets the calls' gen_ai.provider.name ("openai",
// "anthropic", ...); by default it is "anthropic" for /messages and
// "openai" for the rest (OpenAI-compatible gateways).
func WithProviderName(name string) TransportOption {
	return func(t *transport) { t.provider = name }
}

// Transport returns a RoundTripper that opens one span per request around
// base (normally a lanehttp.Transport), as a child of the span in the
// request's context, and ends it when the response body ends, so that the
// bridge's queue-wait and upstream spans are its children. It injects the
// call span's context into the request's headers with the bridge's
// propagator (W3C traceparent by default), so the gateway's own spans join
// the trace. Requests that are not model calls get a span too; it simply
// has no lane children.
func (b *Bridge) Transport(base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	t := &transport{b: b, base: base}
	for _, o := range opts {
		o(t)
	}
	return t
}

type transport struct {
	b        *Bridge
	base     http.RoundTripper
	provider string
}

// callInfo is what the upstream span needs to know of the request; it
// rides in the context from the call span to the bridge's events.
type callInfo struct {
	attrs []attribute.KeyValue // HTTP client attributes of the request
	op    string               // its GenAI operation name, or the method

	// A call StartCall announced: its span opens late (see open), from
	// these, and a round trip or EndCall takes it once.
	parent context.Context      // the context the span is a child of
	start  time.Time            // when the call began
	gen    []attribute.KeyValue // its GenAI attributes
	once   sync.Once
	span   trace.Span
	taken  atomic.Bool
}

// open starts the announced call's span, once, as of when the call began,
// and returns it.
func (c *callInfo) open(b *Bridge) trace.Span {
	c.once.Do(func() {
		_, c.span = b.tracer.Start(c.parent, c.op, trace.WithTimestamp(c.start), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(c.gen...))
	})
	return c.span
}

type callInfoKey struct{}

// operation names a request by what it is, with the GenAI conventions'
// operation names; "" for a request that is no model operation. OpenAI's
// Responses API and Anthropic's Messages API are chat.
func operation(path string) attribute.KeyValue {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"), strings.HasSuffix(path, "/responses"), strings.HasSuffix(path, "/messages"):
		return semconv.GenAIOperationNameChat
	case strings.HasSuffix(path, "/completions"):
		return semconv.GenAIOperationNameTextCompletion
	case strings.HasSuffix(path, "/embeddings"):
		return semconv.GenAIOperationNameEmbeddings
	}
	return attribute.KeyValue{}
}

// StartCall announces the call span of req ahead of its round trip: for a
// proxy that waits for a call's slot before the round trip
// (lanehttp.Transport.Admit), so that the queue-wait span is still a child
// of the call span, as it is when the call waits inside the Transport. The
// span opens once the wait is over, as of when StartCall was called: nothing
// of the tracer runs before the wait, on the stack the call waits on (see
// docs/DESIGN.md, "A queued call's stack"). The Transport then takes the
// span over: it adds the HTTP attributes of the request it sends and ends
// the span with the response; EndCall ends it if no round trip did.
// Without a recording tracer and with no trace in req's context, it returns
// req as it is, at no cost.
func (b *Bridge) StartCall(req *http.Request, opts ...TransportOption) *http.Request {
	if b.untraced && !trace.SpanContextFromContext(req.Context()).IsValid() {
		return req
	}
	t := &transport{b: b}
	for _, o := range opts {
		o(t)
	}
	name, gen := t.names(req)
	info := &callInfo{op: name, parent: req.Context(), start: b.now(), gen: gen}
	return req.WithContext(context.WithValue(req.Context(), callInfoKey{}, info))
}

// EndCall ends the call span StartCall announced for req, if it opened and
// no round trip took it (the call went no further); it does nothing for any
// other request.
func EndCall(req *http.Request) {
	if info, ok := req.Context().Value(callInfoKey{}).(*callInfo); ok && info.parent != nil && info.taken.CompareAndSwap(false, true) && info.span != nil {
		info.span.End()
	}
}

// announced returns the call StartCall announced in ctx, if its span is
// not taken yet.
func announced(ctx context.Context) *callInfo {
	if info, ok := ctx.Value(callInfoKey{}).(*callInfo); ok && info.parent != nil && !info.taken.Load() {
		return info
	}
	return nil
}

// names returns the name of the call span of req and its GenAI
// attributes.
func (t *transport) names(req *http.Request) (string, []attribute.KeyValue) {
	if op := operation(req.URL.Path); op.Valid() {
		provider := t.provider
		if provider == "" {
			provider = providerByPath(req.URL.Path)
		}
		return op.Value.AsString(), []attribute.KeyValue{op, semconv.GenAIProviderNameKey.String(provider)}
	}
	return req.Method, nil
}

// providerByPath is the GenAI provider of a call to path when none is
// configured: anthropic for Anthropic's Messages API, openai for the rest
// (OpenAI-compatible gateways).
func providerByPath(path string) string {
	if strings.HasSuffix(strings.TrimSuffix(path, "/"), "/messages") {
		return "anthropic"
	}
	return "openai"
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	started := announced(req.Context())
	if started != nil && !started.taken.CompareAndSwap(false, true) {
		started = nil // taken meanwhile: this round trip opens its own
	}
	if started == nil && t.b.untraced && !trace.SpanContextFromContext(req.Context()).IsValid() {
		return t.base.RoundTrip(req) // no span, no trace to hand on: spare the call the attributes
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	p, err := strconv.Atoi(port)
	if err != nil {
		p = 80
		if req.URL.Scheme == "https" {
			p = 443
		}
	}
	httpAttrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.ServerAddress(host),
		semconv.ServerPort(p),
		semconv.URLFull(redact.URL(req.URL)),
	}
	var ctx context.Context
	var span trace.Span
	if started != nil {
		// The span StartCall announced (open already if the call waited):
		// the request's HTTP attributes join it.
		span = started.open(t.b)
		ctx = trace.ContextWithSpan(req.Context(), span)
		span.SetAttributes(httpAttrs...)
		started.attrs = httpAttrs
	} else {
		name, attrs := t.names(req)
		ctx, span = t.b.tracer.Start(req.Context(), name, trace.WithTimestamp(t.b.now()), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(append(attrs, httpAttrs...)...))
		ctx = context.WithValue(ctx, callInfoKey{}, &callInfo{attrs: httpAttrs, op: name})
	}
	out := req.WithContext(ctx)
	if span.SpanContext().IsValid() {
		out.Header = req.Header.Clone() // a RoundTripper must not change the caller's request
		t.b.propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
	}
	res, err := t.base.RoundTrip(out)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(errType(err)))
		span.End(trace.WithTimestamp(t.b.now()))
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(res.StatusCode))
	if res.StatusCode >= 400 {
		span.SetStatus(codes.Error, res.Status)
		// A synthesized refusal (503, x-should-retry: false) already has
		// its error.type (lane_queue_timeout) from the bridge.
		if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("X-Should-Retry") != "false" {
			span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(res.StatusCode)))
		}
	}
	sb := &spanBody{ReadCloser: res.Body, end: func() { span.End(trace.WithTimestamp(t.b.now())) }}
	if rw, ok := res.Body.(io.ReadWriteCloser); ok && res.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection's body is the connection, both ways, and
		// the caller writes to it (httputil.ReverseProxy insists): keep
		// the Write.
		res.Body = &upgradedBody{sb, rw}
		return res, nil
	}
	res.Body = sb
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

// upgradedBody is a spanBody that can be written too: the body of a 101
// response.
type upgradedBody struct {
	*spanBody
	w io.Writer
}

func (b *upgradedBody) Write(p []byte) (int, error) { return b.w.Write(p) }
