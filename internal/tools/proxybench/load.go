package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// body is every measured call's request: a short streamed chat completion.
const body = `{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// loadResult is what a load generator prints, as one JSON line.
type loadResult struct {
	Calls   int     `json:"calls"`
	Errors  int     `json:"errors"`
	Seconds float64 `json:"seconds"`
	P50us   float64 `json:"p50_us,omitempty"`
	P99us   float64 `json:"p99_us,omitempty"`
	WaitMs  float64 `json:"wait_ms,omitempty"`
}

func client(h2 bool, conns int) *http.Client {
	t := &http.Transport{MaxIdleConnsPerHost: conns, DisableCompression: true, IdleConnTimeout: time.Minute}
	if h2 {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
		t.HTTP2 = &http.HTTP2Config{StrictMaxConcurrentRequests: false}
	}
	return &http.Client{Transport: t}
}

// call makes one call and reads the whole answer; it fails unless the
// answer is a 200 with the four events.
func call(ctx context.Context, c *http.Client, url, priority string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if priority != "" {
		req.Header.Set("X-LLM-Priority", priority)
	}
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		return fmt.Errorf("status %d: %.200s", res.StatusCode, b)
	}
	return nil
}

func percentile(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(float64(len(sorted)-1)*p)].Nanoseconds()) / 1e3
}

// runLatency makes n sequential calls on one connection: latency as one
// caller sees it.
func runLatency(url string, n int, h2 bool) (loadResult, error) {
	c := client(h2, 1)
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		t := time.Now()
		if err := call(context.Background(), c, url, ""); err != nil {
			return loadResult{}, err
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	return loadResult{Calls: n, Seconds: time.Since(start).Seconds(), P50us: percentile(lat, .5), P99us: percentile(lat, .99)}, nil
}

// runThroughput keeps conc callers busy for d: calls per second.
func runThroughput(url string, conc int, d time.Duration, h2 bool) (loadResult, error) {
	c := client(h2, conc)
	var calls, errs atomic.Int64
	var first atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := call(context.Background(), c, url, "")
				if err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				calls.Add(1)
			}
		})
	}
	wg.Wait()
	r := loadResult{Calls: int(calls.Load()), Errors: int(errs.Load()), Seconds: time.Since(start).Seconds()}
	if r.Errors > 0 {
		return r, fmt.Errorf("%d calls failed, the first: %v", r.Errors, first.Load())
	}
	return r, nil
}

// runQueue sends one call that holds the slot, then n more that queue
// behind it, prints {"calls": n} and keeps them all open until its
// standard input closes.
func runQueue(url string, n int, h2 bool) error {
	c := client(h2, n+1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"?hold=1", strings.NewReader(body))
	if err != nil {
		return err
	}
	res, err := c.Do(holder)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var wg sync.WaitGroup
	for range n {
		// A call whose connection could not be made (thousands of
		// streams open connections in a burst) is sent again: the figure
		// needs n calls queued, and a lost one would leave the proxy
		// short of them until the wait gives up.
		wg.Go(func() {
			for ctx.Err() == nil && call(ctx, c, url+"?hold=1", "") != nil {
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	json.NewEncoder(os.Stdout).Encode(loadResult{Calls: n})
	io.Copy(io.Discard, os.Stdin)
	cancel()
	wg.Wait()
	return nil
}

// runPriority fills the lane with bulk calls of ms milliseconds each plus
// a backlog, prints {"calls": backlog} and waits for a line on its
// standard input (the lane has queued the backlog); then it times one
// interactive call: its wait behind the backlog.
func runPriority(url string, limit, backlog, ms int) (loadResult, error) {
	c := client(false, limit+backlog+1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range limit + backlog {
		wg.Go(func() { call(ctx, c, fmt.Sprintf("%s?ms=%d", url, ms), "bulk") })
	}
	json.NewEncoder(os.Stdout).Encode(loadResult{Calls: backlog})
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return loadResult{}, err
	}
	t := time.Now()
	if err := call(context.Background(), c, url, "interactive"); err != nil {
		return loadResult{}, err
	}
	return loadResult{Calls: 1, WaitMs: float64(time.Since(t).Microseconds()) / 1e3}, nil
}
