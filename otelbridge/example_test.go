package otelbridge_test

import (
	"context"
	"fmt"
	"net/http"

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
	b.Watch(lim) // the gauges read lim's snapshot
	client := &http.Client{Transport: b.Transport(&lanehttp.Transport{Limiter: lim})}

	slot, _ := lim.Acquire(context.Background(), "https://gw/v1|protolabs/smart")
	slot.Release()
	fmt.Println(client.Transport != nil, lim.Snapshot().Lanes[0].Lane)
	// Output: true https://gw/v1|protolabs/smart
}
