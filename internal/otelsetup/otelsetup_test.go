package otelsetup

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"
)

func TestOffByDefault(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(k, "")
	}
	s, err := FromEnv(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.TracerProvider.(noop.TracerProvider); !ok || s.Traces || len(s.MetricExporters) != 0 {
		t.Fatalf("with nothing configured: %+v", s)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if s, _ := FromEnv(context.Background(), "test"); s.Traces {
		t.Fatal("OTEL_TRACES_EXPORTER=none turned traces on")
	}
}

func TestMetricsOverOTLP(t *testing.T) {
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	s, err := FromEnv(context.Background(), "test")
	if err != nil || len(s.MetricExporters) != 1 || s.Traces {
		t.Fatalf("%+v %v", s, err)
	}
	s.MetricExporters[0].Shutdown(context.Background())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	if _, err := FromEnv(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("a bad protocol: %v", err)
	}
}
