package exporter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

func benchProxy(b *testing.B, upstream string, limit int) (front string, stop func()) {
	cfg, err := ParseConfig("b.yaml", []byte(fmt.Sprintf("limiter: {max_inflight: %d}\nupstreams: [{name: gw, base_url: %q}]\n", limit, upstream)))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(cfg, Options{Base: &http.Transport{MaxIdleConnsPerHost: 1024}})
	if err != nil {
		b.Fatal(err)
	}
	f := httptest.NewServer(srv.Handler())
	return f.URL + "/proxy/gw", func() { f.Close(); srv.Shutdown(context.Background()) }
}

// BenchmarkProxy measures what the proxy adds to one streamed chat
// completion against a gateway that answers at once: latency percentiles
// of sequential calls, direct and through the proxy (lanes on, uncontended).
func BenchmarkProxy(b *testing.B) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer gw.Close()
	proxy, stop := benchProxy(b, gw.URL+"/v1", 64)
	defer stop()
	body := `{"model":"protolabs/smart","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	run := func(b *testing.B, url string) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
		var lat []time.Duration
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			res, err := client.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			lat = append(lat, time.Since(start))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		client.CloseIdleConnections()
	}
	b.Run("latency/direct", func(b *testing.B) { run(b, gw.URL+"/v1/chat/completions") })
	b.Run("latency/proxy", func(b *testing.B) { run(b, proxy+"/chat/completions") })
}

// BenchmarkProxyThroughput runs 32 concurrent clients against the
// simulator (capacity 32, 10 tokens of 2 ms), direct and through the proxy
// with a lane of 32: calls per second, and the ratio.
func BenchmarkProxyThroughput(b *testing.B) {
	sim := gatewaysim.New(gatewaysim.Config{Capacity: 32, TokenTime: 2 * time.Millisecond, Tokens: 10, PropagateDisconnect: true})
	gw := httptest.NewServer(sim)
	defer gw.Close()
	defer sim.Close()
	proxy, stop := benchProxy(b, gw.URL+"/v1", 32)
	defer stop()
	body := `{"model":"m","stream":true}`
	run := func(b *testing.B, url string) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		b.SetParallelism(16) // 32 goroutines on 2 CPUs
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				res, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
		client.CloseIdleConnections()
	}
	b.Run("calls/direct", func(b *testing.B) { run(b, gw.URL+"/v1/chat/completions") })
	b.Run("calls/proxy", func(b *testing.B) { run(b, proxy+"/chat/completions") })
}

// BenchmarkQueuedMemory queues calls behind a held slot and reports the
// memory (heap and goroutine stacks) per queued call: 10,000 over HTTP/2
// (cleartext, one connection) and 4,000 over HTTP/1.1, a connection each
// (10,000 would need more file descriptors than this machine allows).
// Client and proxy share the process, so the figures include the client's
// side of each call too: upper bounds for the proxy.
func BenchmarkQueuedMemory(b *testing.B) {
	b.Run("h2c-10000", func(b *testing.B) { queuedMemory(b, 10000, true) })
	b.Run("http1-4000", func(b *testing.B) { queuedMemory(b, 4000, false) })
}

func queuedMemory(b *testing.B, queued int, h2c bool) {
	release := make(chan struct{})
	gw := holdingGateway(release)
	defer gw.Close()
	defer close(release)
	cfg, _ := ParseConfig("b.yaml", []byte(fmt.Sprintf("limiter: {max_inflight: 1, queue_timeout: 1h}\nupstreams: [{name: gw, base_url: %q}]\n", gw.URL+"/v1")))
	srv, _ := New(cfg, Options{})
	defer srv.Shutdown(context.Background())
	front := httptest.NewUnstartedServer(srv.Handler())
	ct := &http.Transport{MaxIdleConnsPerHost: queued}
	if h2c {
		front.Config.Protocols = new(http.Protocols)
		front.Config.Protocols.SetHTTP1(true)
		front.Config.Protocols.SetUnencryptedHTTP2(true)
		front.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 2 * queued}
		ct.Protocols = new(http.Protocols)
		ct.Protocols.SetUnencryptedHTTP2(true)
	}
	front.Start()
	defer front.Close()
	defer ct.CloseIdleConnections()
	client := &http.Client{Transport: ct}
	url := front.URL + "/proxy/gw/chat/completions"
	body := `{"model":"m","stream":true}`
	holder, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Body.Close()
	lane := gw.URL + "/v1|m"
	queuedNow := func() int {
		for _, l := range srv.Limiter().Snapshot().Lanes {
			if l.Lane == lane {
				return l.Queued
			}
		}
		return 0
	}
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(context.Background())
		wg := queueCalls(b, ctx, client, url, body, queued, queuedNow)
		runtime.GC()
		runtime.ReadMemStats(&after)
		inuse := func(m runtime.MemStats) float64 { return float64(m.HeapInuse + m.StackInuse) }
		b.ReportMetric((inuse(after)-inuse(before))/float64(queued)/1024, "KiB/queued")
		cancel()
		wg.Wait()
	}
}

// queueCalls starts n calls to url and returns once n calls are queued
// (queuedNow); cancel ctx, then wait on the group, to end them.
func queueCalls(b *testing.B, ctx context.Context, client *http.Client, url, body string, n int, queuedNow func() int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if res, err := client.Do(req); err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
	}
	for deadline := time.Now().Add(2 * time.Minute); queuedNow() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d queued", queuedNow(), n)
		}
	}
	return &wg
}
