package exporter

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

// memUse returns the Go-accounted memory in use (live heap and goroutine
// stacks) and the process's resident set, after a collection that returns
// free memory to the system.
func memUse() (goBytes, rss float64) {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b, _ := os.ReadFile("/proc/self/statm")
	f := strings.Fields(string(b))
	if len(f) > 1 {
		pages, _ := strconv.ParseFloat(f[1], 64)
		rss = pages * float64(os.Getpagesize())
	}
	return float64(m.HeapInuse + m.StackInuse), rss
}

// BenchmarkMemory reports what lanes-exporter holds per lane (1,000 lanes
// of distinct 40-byte models), per idle keep-alive connection (2,000), and
// per call queued behind a held slot with a 1 KiB body (2,000) and a 1 MiB
// body (100): Go's memory in use (KiB/...) and the process's resident set
// (RSS-KiB/...). Clients share the process but are raw connections or
// small; the queued calls' figures include each client request's own copy
// of its body, so they are upper bounds for the exporter.
func BenchmarkMemory(b *testing.B) {
	b.Run("per-lane/1000-lanes", func(b *testing.B) {
		for b.Loop() {
			h := newBenchHostile(b, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n")
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
			g0, r0 := memUse()
			for i := range 1000 {
				res, err := client.Post(h.base+"/proxy/gw/chat/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"model":"vendor/model-%030d"}`, i)))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			g1, r1 := memUse()
			b.ReportMetric((g1-g0)/1000/1024, "KiB/lane")
			b.ReportMetric((r1-r0)/1000/1024, "RSS-KiB/lane")
			client.CloseIdleConnections()
			h.close()
		}
	})
	b.Run("per-idle-connection/2000-connections", func(b *testing.B) {
		for b.Loop() {
			h := newBenchHostile(b, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n")
			g0, r0 := memUse()
			conns := make([]net.Conn, 0, 2000)
			for range 2000 {
				c, err := net.Dial("tcp", h.l.Addr)
				if err != nil {
					b.Fatal(err)
				}
				io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
				res, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				conns = append(conns, c)
			}
			g1, r1 := memUse()
			b.ReportMetric((g1-g0)/2000/1024, "KiB/conn")
			b.ReportMetric((r1-r0)/2000/1024, "RSS-KiB/conn")
			for _, c := range conns {
				c.Close()
			}
			h.close()
		}
	})
	for _, c := range []struct {
		name   string
		body   int
		queued int
	}{{"queued-call/1KiB-body", 1 << 10, 2000}, {"queued-call/1MiB-body", 1 << 20, 100}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				queuedBodies(b, c.body, c.queued)
			}
		})
	}
}

func queuedBodies(b *testing.B, size, n int) {
	release := make(chan struct{})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-release
	}))
	defer gw.Close()
	cfg, _ := ParseConfig("b.yaml", []byte(fmt.Sprintf("limiter: {max_inflight: 1, queue_timeout: 1h}\nupstreams: [{name: gw, base_url: %q}]\nlimits: {max_queued_bytes: 1073741824}\n", gw.URL+"/v1")))
	srv, _ := New(cfg, Options{})
	defer srv.Shutdown(context.Background())
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	ct := &http.Transport{MaxIdleConnsPerHost: n + 1}
	defer ct.CloseIdleConnections()
	client := &http.Client{Transport: ct}
	url := front.URL + "/proxy/gw/chat/completions"
	body := `{"model":"m","pad":"` + strings.Repeat("x", size-len(`{"model":"m","pad":""}`)) + `"}`
	go client.Post(url, "application/json", strings.NewReader(body)) // holds the slot
	queuedNow := func() int {
		s := srv.Limiter().Snapshot()
		if len(s.Lanes) == 0 {
			return -1
		}
		return s.Lanes[0].Queued
	}
	for deadline := time.Now().Add(time.Minute); queuedNow() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the holder never got its slot")
		}
	}
	g0, r0 := memUse()
	ctx, cancel := context.WithCancel(context.Background())
	wg := queueCalls(b, ctx, client, url, body, n, queuedNow)
	g1, r1 := memUse()
	b.ReportMetric((g1-g0)/float64(n)/1024, "KiB/queued")
	b.ReportMetric((r1-r0)/float64(n)/1024, "RSS-KiB/queued")
	cancel()
	wg.Wait()
	close(release) // before the servers close: the holder's call ends
}

// benchHostile is newHostile for a benchmark: closed by the caller.
type benchHostile struct {
	l    *Listener
	base string
	up   *httptest.Server
}

func newBenchHostile(b *testing.B, yaml string) *benchHostile {
	h := &benchHostile{}
	h.up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[]}`)
	}))
	cfg, err := ParseConfig("b.yaml", []byte(strings.ReplaceAll(yaml, "UPSTREAM", h.up.URL+"/v1")))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if h.l, err = Start(srv, "127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	h.base = "http://" + h.l.Addr
	return h
}

func (h *benchHostile) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.l.Shutdown(ctx)
	h.up.Close()
}
