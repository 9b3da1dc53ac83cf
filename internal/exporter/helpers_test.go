package exporter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// newFront starts the exporter configured by yaml behind a loopback
// server; traced gives it a TracerProvider that records every span in the
// returned recorder (nil otherwise). Everything stops with the test.
func newFront(t *testing.T, yaml string, traced bool) (*httptest.Server, *Server, *tracetest.SpanRecorder) {
	t.Helper()
	var o Options
	var spans *tracetest.SpanRecorder
	if traced {
		spans = tracetest.NewSpanRecorder()
		o.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	}
	srv := newTestServerWith(t, yaml, o)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	return front, srv, spans
}

// holdingGateway answers every call with a stream whose headers come at
// once and whose end waits until release is closed.
func holdingGateway(release <-chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: [DONE]\n\n")
	}))
}
