package exporter

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// hostile is an exporter on loopback (a real listener, with the server's
// connection limits) in front of an upstream that answers at once.
type hostile struct {
	t     *testing.T
	srv   *Server
	l     *Listener
	base  string
	up    *httptest.Server
	calls atomic.Int64 // requests that reached the upstream
}

func newHostile(t *testing.T, yaml string, o Options) *hostile {
	t.Helper()
	h := &hostile{t: t}
	h.up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[]}`)
	}))
	t.Cleanup(h.up.Close)
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte(strings.ReplaceAll(yaml, "UPSTREAM", h.up.URL+"/v1")), 0o600)
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	o.File = file
	if o.Base == nil {
		base := &http.Transport{MaxIdleConnsPerHost: 64}
		t.Cleanup(base.CloseIdleConnections)
		o.Base = base
	}
	if h.srv, err = New(cfg, o); err != nil {
		t.Fatal(err)
	}
	if h.l, err = Start(h.srv, "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	h.base = "http://" + h.l.Addr
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.l.Shutdown(ctx)
	})
	return h
}

// heap returns the bytes of heap objects live at a collection it runs
// (not counting what other goroutines allocate after it).
func heap() uint64 {
	// Twice: buffers put back in a sync.Pool survive one collection (the
	// pool's victim cache); what calls hold is what is left after two.
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Clients choose the model: 20,000 distinct names (250 bytes each) make at
// most max_lanes lanes; the rest get lane_limit_reached and never reach the
// gateway. Memory, /metrics and its scrape stay bounded, the real lane's
// series are all there, and nothing falls into an overflow series.
func TestManyModelNamesBounded(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\nlimits: {max_lanes: 1000}\n", Options{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	post := func(model string) (int, string) {
		res, err := client.Post(h.base+"/proxy/gw/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","messages":[]}`))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	if code, body := post("protolabs/smart"); code != 200 {
		t.Fatalf("the real lane: %d %s", code, body)
	}
	before := heap()
	const names = 20000
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= names; i = next.Add(1) {
				name := fmt.Sprintf("attacker/%06d-%s", i, strings.Repeat("x", 250-16))
				switch code, body := post(name); {
				case code == 200:
					ok.Add(1)
				case code == 503 && strings.Contains(body, `"lane_limit_reached"`):
					refused.Add(1)
				default:
					t.Errorf("%s: %d %s", name[:16], code, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 999 || refused.Load() != names-999 || h.calls.Load() != 1000 {
		t.Fatalf("%d granted, %d refused, %d reached the gateway; want 999 (the lane limit), %d, 1000", ok.Load(), refused.Load(), h.calls.Load(), names-999)
	}
	grew := int64(heap()) - int64(before)
	start := time.Now()
	res, err := client.Get(h.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	scrape := time.Since(start)
	// The lane metrics and the GenAI conventions' (three histograms a lane
	// of calls, the conventions' 14 buckets, with the model in every line)
	// are bounded apart, so that neither can grow unseen behind the other.
	genai := 0
	for _, line := range strings.SplitAfter(string(metrics), "\n") {
		if strings.HasPrefix(line, "gen_ai_") || strings.HasPrefix(line, "# HELP gen_ai_") || strings.HasPrefix(line, "# TYPE gen_ai_") {
			genai += len(line)
		}
	}
	lanes := len(metrics) - genai
	t.Logf("1,000 lanes of 250-byte models: heap +%.1f MiB (%.1f KiB a lane), /metrics %.1f MiB (%.1f MiB of lane metrics, %.1f MiB of GenAI metrics) scraped in %s",
		float64(grew)/(1<<20), float64(grew)/1000/1024, float64(len(metrics))/(1<<20), float64(lanes)/(1<<20), float64(genai)/(1<<20), scrape)
	const heapBound, metricsBound, genaiBound = 32 << 20, 40 << 20, 24 << 20
	if grew > heapBound || lanes > metricsBound || genai > genaiBound {
		t.Fatalf("heap grew %d bytes (bound %d), /metrics has %d bytes of lane metrics (bound %d) and %d of GenAI metrics (bound %d)",
			grew, heapBound, lanes, metricsBound, genai, genaiBound)
	}
	if genai == 0 {
		t.Fatal("/metrics has no GenAI metrics")
	}
	// The scrape fits Prometheus' default 10 s scrape timeout (the bound is
	// scaled under the race detector, which slows the exposition down).
	if scrape > 10*time.Second*raceSlowdown {
		t.Fatalf("/metrics took %s", scrape)
	}
	lane := `lane="` + h.up.URL + `/v1|protolabs/smart"`
	for _, m := range []string{"llmlanes_llm_inflight{", "llmlanes_llm_queue_wait_seconds_bucket{", "llmlanes_llm_upstream_requests_total{", "llmlanes_llm_lane_state{"} {
		if !containsSeries(string(metrics), m, lane) {
			t.Errorf("/metrics lacks %s for the real lane", m)
		}
	}
	if strings.Contains(string(metrics), "overflow") {
		t.Fatal("a series fell into an overflow bucket")
	}
}

func containsSeries(metrics, prefix, label string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, prefix) && strings.Contains(line, label) {
			return true
		}
	}
	return false
}

// Idle lanes leave the snapshot and every metric after lane_idle_ttl (fake
// clock).
func TestIdleLanesLeaveMetrics(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	h := newHostile(t, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\nlimits: {lane_idle_ttl: 10m}\n", Options{Clock: clock})
	postJSON(t, h.base+"/proxy/gw/chat/completions", `{"model":"passing/by","messages":[]}`)
	_, metrics := get(t, h.base+"/metrics")
	if !strings.Contains(metrics, "passing/by") || h.srv.Limiter().Lanes() != 1 {
		t.Fatal("the lane is not there to begin with")
	}
	clock.Advance(9 * time.Minute)
	if _, metrics = get(t, h.base+"/metrics"); !strings.Contains(metrics, "passing/by") {
		t.Fatal("the lane left before its TTL")
	}
	clock.Advance(3 * time.Minute)
	_, metrics = get(t, h.base+"/metrics")
	_, snap := get(t, h.base+"/api/telemetry/llm-lanes")
	if strings.Contains(metrics, "passing/by") || strings.Contains(snap, "passing/by") || h.srv.Limiter().Lanes() != 0 {
		t.Fatalf("the idle lane is still there:\n%s", metrics)
	}
}

// 2,000 idle keep-alive connections are closed after server.idle_timeout,
// and /healthz answers all along.
func TestIdleConnectionsClosed(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\nserver: {idle_timeout: 1s}\n", Options{})
	const n = 2000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", h.l.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		// One request, then the connection idles, kept alive.
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns { // every one answered
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("healthz on an idle connection: %v", err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	if code, _ := get(t, h.base+"/healthz"); code != 200 {
		t.Fatalf("healthz beside %d idle connections: %d", n, code)
	}
	// The server closes each idle one: a read returns EOF.
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	if closed != n {
		t.Fatalf("%d of %d idle connections closed by the server", closed, n)
	}
	if code, _ := get(t, h.base+"/healthz"); code != 200 {
		t.Fatal("healthz after the idle connections went")
	}
}

// uploadStalled sends a body that declares size bytes, sends all but the
// last, and then stalls until stop closes; it returns the status the
// exporter answered, 0 if it answered none.
func uploadStalled(addr string, size int64, stop <-chan struct{}) int {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return -1
	}
	defer c.Close()
	go func() { <-stop; c.Close() }()
	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "POST /proxy/gw/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	// One buffer for the whole body (the JSON's start, then "a"s), so
	// that the heap the test measures is the exporter's, not garbage of
	// its own clients.
	chunk := bytes.Repeat([]byte("a"), 32<<10)
	copy(chunk, `{"model":"m","x":"`)
	var sent int64
	for sent < size-1 {
		n := min(int64(len(chunk)), size-1-sent)
		if _, err := c.Write(chunk[:n]); err != nil {
			break // the exporter answered and closed
		}
		if sent == 0 {
			copy(chunk, bytes.Repeat([]byte("a"), 18))
		}
		sent += n
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// 40 uploads of 32 MiB that stop one byte short hold no more than
// limits.max_queued_bytes (the least that admits one body of
// max_body_bytes: 64 MiB and 64 KiB) between them: the declared length is never
// allocated, bodies are counted as they arrive, and past the budget the
// rest are refused (503, retryable); proxy.body_read_timeout ends the
// stalled ones and gives their bytes back.
func TestStalledUploadsBounded(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n"+
		"limits: {max_queued_bytes: 67174400}\nproxy: {body_read_timeout: 3s}\n", Options{})
	before := heap()
	stop := make(chan struct{})
	codes := make(chan int, 40)
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			c := uploadStalled(h.l.Addr, 32<<20, stop)
			if c != 503 {
				t.Logf("upload: %d after %s", c, time.Since(start))
			}
			codes <- c
		}()
	}
	// Wait until every upload is either refused or stalled: the refused
	// have answers, and the budget holds what the stalled ones sent.
	var refused int
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if len(codes)+countFull(h) >= 40 || time.Now().After(deadline) {
			break
		}
	}
	peak := int64(heap()) - int64(before)
	wg.Wait() // the read timeout ends the stalled ones
	close(stop)
	close(codes)
	for c := range codes {
		switch c {
		case 503:
			refused++
		case 408: // the body read timed out
		case 0: // the exporter closed the connection, and the answer was lost with it
		default:
			t.Errorf("an upload got %d", c)
		}
	}
	t.Logf("40 stalled 32 MiB uploads: heap +%.1f MiB at the peak, %d refused at the budget", float64(peak)/(1<<20), refused)
	// The bound: the budget, plus 16 MiB for connections and the test's
	// own clients.
	if peak > 64<<20+16<<20 {
		t.Fatalf("heap grew %d bytes with a 64 MiB budget", peak)
	}
	if refused < 30 {
		t.Fatalf("only %d uploads refused: the budget did not hold", refused)
	}
	// Everything given back: a normal call still goes through.
	if !h.srv.queued.TryAcquire(64 << 20) {
		t.Fatal("the queued-bytes budget was not given back")
	}
	h.srv.queued.Release(64 << 20)
	if h.calls.Load() != 0 {
		t.Fatal("a truncated upload reached the gateway")
	}
}

// countFull reports 40 when the exporter's byte budget is nearly all taken,
// which is when every upload that got in has stalled.
func countFull(h *hostile) int {
	if h.srv.queued.TryAcquire(1 << 20) {
		h.srv.queued.Release(1 << 20)
		return 0
	}
	return 40
}

// 3,000 streamed calls that bypass the lanes (a path that is not a model
// call), each sending its body while the upstream has started to answer,
// with the limiter off and on: none is cut, and every body arrives whole.
func TestBypassStreamsNotCut(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answer at once, then read the body, as a streaming upload API may
		// (this upstream, a Go server too, needs full duplex for it).
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		if n, _ := io.Copy(io.Discard, r.Body); n != 4096 {
			fmt.Fprintf(w, "data: body of %d bytes\n\n", n)
			return
		}
		for i := range 4 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	for _, limit := range []int{0, 4} {
		t.Run(fmt.Sprintf("max_inflight=%d", limit), func(t *testing.T) {
			h := newHostile(t, fmt.Sprintf("limiter: {max_inflight: %d}\nupstreams: [{name: gw, base_url: %q}]\n", limit, up.URL+"/v1"), Options{})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			defer client.CloseIdleConnections()
			var cut atomic.Int64
			var wg sync.WaitGroup
			next := atomic.Int64{}
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= 3000 {
						pr, pw := io.Pipe() // a chunked body, sent while the answer comes
						go func() {
							pw.Write(bytes.Repeat([]byte("x"), 2048))
							time.Sleep(time.Millisecond)
							pw.Write(bytes.Repeat([]byte("y"), 2048))
							pw.Close()
						}()
						res, err := client.Post(h.base+"/proxy/gw/uploads/stream", "application/octet-stream", pr)
						if err != nil {
							cut.Add(1)
							continue
						}
						b, err := io.ReadAll(res.Body)
						res.Body.Close()
						if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
							if cut.Add(1) == 1 {
								t.Logf("first failure: %q %v", b, err)
							}
						}
					}
				}()
			}
			wg.Wait()
			if n := cut.Load(); n != 0 {
				t.Fatalf("%d of 3,000 streams were cut or lost body bytes", n)
			}
		})
	}
}

// countingTarget is a snapshot endpoint that counts its polls.
type countingTarget struct {
	*httptest.Server
	mu sync.Mutex
	n  *int
}

func newCountingTarget(n *int) *countingTarget {
	c := &countingTarget{n: n}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		*c.n++
		c.mu.Unlock()
		io.WriteString(w, `{"enabled":true,"generated_at":"2026-09-28T09:00:00Z","lanes":[]}`)
	}))
	return c
}

func (c *countingTarget) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.n
}

// newHangingUpstream never answers until hang closes.
func newHangingUpstream(hang chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
}

// A client that stops reading its stream through the proxy does not hold
// its slot for ever: once the stream's data backs up for
// proxy.stall_timeout the client is let go, the rest of the answer is read
// and discarded (the upstream does not stop the work), and an answer that
// never ends is cut at response_header_timeout plus stall_timeout from the
// send: the upstream call ends, the slot is free for the next caller, and
// the outcome is client_stall, not a gateway fault.
func TestClientThatStopsReadingFreesSlot(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	gone := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
		for {
			if _, err := w.Write(chunk); err != nil {
				close(gone)
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	h := newHostile(t, "limiter: {max_inflight: 1}\nupstreams: [{name: gw, base_url: \""+up.URL+"/v1\"}]\nproxy: {stall_timeout: 30s}\n", Options{Clock: clock})
	c, err := net.Dial("tcp", h.l.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","stream":true}`
	fmt.Fprintf(c, "POST /proxy/gw/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.Read(make([]byte, 1024)) // the stream starts; then the client reads no more
	lane := func() limiter.LaneSnapshot { return h.srv.Limiter().Snapshot().Lanes[0] }
	// The stream backs up: the proxy's goroutine is stuck writing to the
	// client (seen twice in a row), and no more is read from the upstream.
	proxyStuck := func() bool {
		buf := make([]byte, 4<<20)
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			if bytes.Contains(g, []byte("httputil.(*ReverseProxy).copyResponse")) && bytes.Contains(g, []byte("net/http.(*response).Write(")) {
				return true
			}
		}
		return false
	}
	for deadline, seen := time.Now().Add(20*time.Second), 0; seen < 2; time.Sleep(50 * time.Millisecond) {
		if lane().Inflight == 1 && proxyStuck() {
			seen++
		} else {
			seen = 0
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream never backed up")
		}
	}
	// Move the clock on until the exchange ends (once, if the proxy was
	// stuck; more if data still trickled through at first).
	for i := 0; ; i++ {
		clock.Advance(30 * time.Second)
		select {
		case <-gone: // the upstream call was canceled
		case <-time.After(200 * time.Millisecond):
			if i < 50 {
				continue
			}
			t.Fatal("the slot was never freed")
		}
		break
	}
	// The upstream call ends before its slot is given back (the drain's
	// read fails, then the exchange finishes); the exchange is reported
	// just after the slot is given back.
	for deadline := time.Now().Add(10 * time.Second); (lane().Inflight != 0 || lane().Upstream == nil) && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
	}
	if l := lane(); l.Inflight != 0 || l.Upstream == nil || l.Upstream.ClientStalls != 1 || l.Upstream.Stalls != 0 {
		t.Fatalf("after the client stopped reading: %+v %+v", l, l.Upstream)
	}
}

// A client whose base URL is /proxy/<upstream>/v1/ in front of an upstream
// whose base_url ends in /v1 sends /v1/v1/...: the upstream's bare 404 is
// answered with one that says what was forwarded where, and how to fix
// the base URL. Any other 404 passes through as the upstream sent it.
func TestDoubledPathSays404(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/chat/completions" {
			io.WriteString(w, `{"choices":[]}`)
			return
		}
		http.Error(w, "404 page not found", http.StatusNotFound)
	}))
	defer up.Close()
	h := newHostile(t, "limiter: {max_inflight: 1}\nupstreams: [{name: gw, base_url: \""+up.URL+"/v1\"}]\n", Options{})
	code, body := postJSON(t, "http://"+h.l.Addr+"/proxy/gw/v1/chat/completions", `{"model":"m"}`)
	if code != 404 || !strings.Contains(body, "upstream_path_not_found") || !strings.Contains(body, "/v1/v1/chat/completions") ||
		!strings.Contains(body, "/proxy/gw/ (without /v1)") {
		t.Fatalf("doubled /v1: %d %s, want our 404 naming the path and the fix", code, body)
	}
	if code, body := postJSON(t, "http://"+h.l.Addr+"/proxy/gw/nothing/here", `{"model":"m"}`); code != 404 || !strings.Contains(body, "404 page not found") {
		t.Fatalf("another 404: %d %s, want the upstream's own", code, body)
	}
	if code, _ := postJSON(t, "http://"+h.l.Addr+"/proxy/gw/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("the right path: %d", code)
	}
}

// A call whose shared slot is lost before its answer's headers (Redis
// unreachable past the lease) is answered with the lane's own code,
// lane_slot_lost (503, retryable), not the gateway's upstream_unreachable.
func TestLostSlotHasItsOwnCode(t *testing.T) {
	r := redistest.Start(t)
	r.WaitUptime(time.Second) // no grant in a Redis' first lease
	proxy := redistest.NewProxy(t, r.Addr())
	release := make(chan struct{})
	defer close(release)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		select { // no headers until the call is stopped
		case <-req.Context().Done():
		case <-release:
		}
	}))
	defer up.Close()
	h := newHostile(t, fmt.Sprintf("limiter: {max_inflight: 1}\nupstreams: [{name: gw, base_url: %q}]\nshared: {redis_url: %q, lease_ttl: 1s, on_redis_down: closed}\n",
		up.URL+"/v1", "redis://"+proxy.Addr()), Options{})
	done := make(chan string, 1)
	go func() {
		code, body := postJSON(t, "http://"+h.l.Addr+"/proxy/gw/chat/completions", `{"model":"m"}`)
		done <- fmt.Sprint(code, " ", body)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ls := h.srv.Limiter().Snapshot().Lanes; len(ls) == 1 && ls[0].Shared != nil && ls[0].Shared.ProcessInflight == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never held its slot")
		}
	}
	proxy.Block()
	select {
	case got := <-done:
		if !strings.HasPrefix(got, "503 ") || !strings.Contains(got, "lane_slot_lost") {
			t.Fatalf("a lost slot: %s, want 503 lane_slot_lost", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the call was never stopped")
	}
}
