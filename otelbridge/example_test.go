package otelbridge_test

import (
	"context"
	"fmt"
	"net/http"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
)

// The wiring of the package documentation: the bridge observes the
// limiter's events, watches its snapshot for the gauges, and opens a span
// per call around a lane transport.
func Example() {
	b, err := otelbridge.New(otelbridge.Options{}) // the global providers
	if err != nil {
		panic(err)
	}
	lim, err := limiter.New(limiter.Config{MaxInflight: 6, InteractiveReserve: 1}, limiter.WithObserver(b.Observe))
	if err != nil {
		panic(err)
	}
	b.Watch(lim)                                                   // the gauges read lim's snapshot
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(b)) // or a periodic reader of an exporter
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	client := &http.Client{Transport: b.Transport(&lanehttp.Transport{Limiter: lim})}
	_ = client // the service's model calls go through it

	slot, _ := lim.Acquire(context.Background(), "https://gw/v1|protolabs/smart")
	slot.Release()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "llm.queue.wait" {
				for _, p := range h.DataPoints {
					if p.Count > 0 {
						c, _ := p.Attributes.Value("priority")
						fmt.Println(m.Name, c.AsString(), p.Count)
					}
				}
			}
		}
	}
	// Output: llm.queue.wait default 1
}
