// Package otelsetup sets lanes-exporter's OpenTelemetry up from the standard
// OTEL_* environment variables, and leaves it off, at no cost, when none
// asks for it.
//
// Traces are on when OTEL_TRACES_EXPORTER names an exporter (otlp, console;
// "none" is off) or an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); the exporter, protocol (http/protobuf
// or grpc), endpoint, headers and sampler come from the usual variables.
// Metrics also go over OTLP, beside the Prometheus endpoint, when
// OTEL_METRICS_EXPORTER is "otlp" or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is
// set. Propagation follows OTEL_PROPAGATORS (default: W3C trace context and
// baggage). The resource is service.name lanes-exporter and its version,
// with OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES on top.
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Setup is what lanes-exporter's telemetry takes.
type Setup struct {
	TracerProvider  trace.TracerProvider // a no-op one when traces are off
	Propagator      propagation.TextMapPropagator
	MetricExporters []sdkmetric.Exporter // empty when OTLP metrics are off
	Traces          bool                 // traces are exported
	shutdown        []func(context.Context) error
}

// Shutdown flushes and stops what FromEnv started.
func (s *Setup) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range s.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// FromEnv reads the environment and sets up what it asks for.
func FromEnv(ctx context.Context, version string) (*Setup, error) {
	getenv := os.Getenv
	s := &Setup{TracerProvider: noop.NewTracerProvider(), Propagator: autoprop.NewTextMapPropagator()}
	tracesOn := exporterNamed(getenv("OTEL_TRACES_EXPORTER")) ||
		(getenv("OTEL_TRACES_EXPORTER") == "" && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""))
	metricsOn := getenv("OTEL_METRICS_EXPORTER") == "otlp" ||
		(getenv("OTEL_METRICS_EXPORTER") == "" && getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "")
	if !tracesOn && !metricsOn {
		return s, nil
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName("lanes-exporter"), semconv.ServiceVersion(version)),
		resource.WithFromEnv()) // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	if tracesOn {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		s.TracerProvider, s.Traces = tp, true
		s.shutdown = append(s.shutdown, tp.Shutdown)
	}
	if metricsOn {
		var exp sdkmetric.Exporter
		proto := getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
		if proto == "" {
			proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch proto {
		case "", "http/protobuf":
			exp, err = otlpmetrichttp.New(ctx)
		case "grpc":
			exp, err = otlpmetricgrpc.New(ctx)
		default:
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc", proto)
		}
		if err != nil {
			return nil, fmt.Errorf("OTLP metrics: %w", err)
		}
		s.MetricExporters = append(s.MetricExporters, exp)
	}
	return s, nil
}

func exporterNamed(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && v != "none"
}
