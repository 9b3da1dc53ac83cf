package lanehttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
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

// A proxy takes each model call's slot at the top of its handler, where a
// waiting call holds little, and hands the admitted request to its reverse
// proxy, whose round trip then sends it with that slot.
func ExampleTransport_Admit() {
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer gateway.Close()
	target, _ := url.Parse(gateway.URL)

	lim, _ := limiter.New(limiter.Config{MaxInflight: 4})
	lanes := &lanehttp.Transport{Limiter: lim}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: lanes,
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = lanes.Admit(r) // waits here for a slot (or is refused)
		defer lanehttp.Abandon(r)
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()

	res, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	lane := lim.Snapshot().Lanes[0]
	fmt.Println(res.StatusCode, string(body), "inflight", lane.Inflight, "ok", lane.Upstream.OK)
	// Output: 200 {"choices":[]} inflight 0 ok 1
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

func ExampleReconnect() {
	var attempts atomic.Int32
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if attempts.Add(1) == 1 {
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the first stream drops before any content
		}
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer gateway.Close()

	lim, _ := limiter.New(limiter.Config{MaxInflight: 4})
	client := &http.Client{Transport: &lanehttp.Transport{Limiter: lim}}
	rc := &lanehttp.Reconnect{Attempts: 3, Backoff: 10 * time.Millisecond}
	res, err := rc.Do(context.Background(), func(ctx context.Context) (*http.Response, error) {
		// Called once per attempt, with a context that keeps the call's
		// first arrival, so a reconnect does not lose its place in line.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"protolabs/smart","stream":true,"messages":[]}`))
		return client.Do(req)
	})
	if errors.Is(err, limiter.ErrQueueTimeout) {
		fmt.Println("the lane is saturated; not retried:", err)
		return
	}
	if err != nil {
		panic(err)
	}
	stream, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Print(string(stream))
	fmt.Println("attempts:", attempts.Load())
	// Output:
	// data: {"choices":[{"delta":{"content":"hello"}}]}
	//
	// data: [DONE]
	//
	// attempts: 2
}
