package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/telemetry"
)

// Serving a Go service's lanes: metrics, the snapshot, the classification.
func Example() {
	tel, err := telemetry.New(telemetry.Options{Prefix: "protoagent"}) // default prefix: llmlanes
	if err != nil {
		panic(err)
	}
	defer tel.Shutdown(context.Background())
	lim, err := limiter.New(limiter.Config{MaxInflight: 6, InteractiveReserve: 1}, limiter.WithObserver(tel.Observe))
	if err != nil {
		panic(err)
	}
	tel.Watch(lim)
	srv := httptest.NewServer(tel.Handler()) // /metrics, /api/telemetry/llm-lanes, .../classification, /healthz
	defer srv.Close()
	client := &http.Client{Transport: tel.Bridge().Transport(&lanehttp.Transport{Limiter: lim})}
	_ = client // the service's model calls go through it

	slot, _ := lim.Acquire(context.Background(), "https://gw/v1|protolabs/smart")
	defer slot.Release()
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "protoagent_llm_inflight{") {
			fmt.Println(line)
		}
	}
	// Output: protoagent_llm_inflight{lane="https://gw/v1|protolabs/smart"} 1
}
