package lanehttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

func ExampleTransport() {
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[{"message":{"content":"hello"}}]}`)
	}))
	defer gateway.Close()

	lim, _ := limiter.New(limiter.Config{MaxInflight: 4, InteractiveReserve: 1})
	client := &http.Client{Transport: &lanehttp.Transport{
		Limiter:               lim,
		ResponseHeaderTimeout: time.Minute, // counted from when the slot is held
		StallTimeout:          time.Minute,
	}}

	ctx := limiter.WithPriority(context.Background(), limiter.Interactive)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"protolabs/smart","messages":[]}`))
	res, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(res.Body) // the slot is released at the end of the body
	res.Body.Close()

	lane := lim.Snapshot().Lanes[0]
	fmt.Println(string(body))
	fmt.Println(strings.TrimPrefix(lane.Lane, gateway.URL), "inflight", lane.Inflight, "ok", lane.Upstream.OK)
	// Output:
	// {"choices":[{"message":{"content":"hello"}}]}
	// /v1|protolabs/smart inflight 0 ok 1
}

func ExampleQueueTimeoutFrom() {
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1, QueueTimeout: time.Millisecond})
	gateway := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer gateway.Close()
	lane := gateway.URL + "/v1|m"
	held, _ := lim.Acquire(context.Background(), lane) // the only slot is taken
	defer held.Release()

	client := &http.Client{Transport: &lanehttp.Transport{Limiter: lim}}
	res, err := client.Post(gateway.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	qe, ok := lanehttp.QueueTimeoutFrom(res)
	fmt.Println(res.StatusCode, res.Header.Get("X-Should-Retry"), ok, qe.Lane == lane, qe.Position)
	// Output: 503 false true true 1
}
