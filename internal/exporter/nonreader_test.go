package exporter

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// handlers counts the goroutines serving proxied calls.
func handlers() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "exporter.(*Server).serveProxy(")
}

// bigAnswers is a gateway whose every answer streams 32 MiB; calls counts
// the calls it has begun to answer.
func bigAnswers(t *testing.T) (gw *httptest.Server, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	gw = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
		for range 512 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(gw.Close)
	return gw, calls
}

// waitCalls waits until the gateway has begun to answer n calls in all.
func waitCalls(t *testing.T, calls *atomic.Int64, n int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); calls.Load() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway began %d answers of %d", calls.Load(), n)
		}
	}
}

// waitHandlers waits until n handlers run, or fails after limit.
func waitHandlers(t *testing.T, what string, ok func(n int) bool, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for ; !ok(handlers()); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > limit {
			t.Fatalf("%s: %d handlers after %s", what, handlers(), limit)
		}
	}
	return time.Since(start)
}

// Clients that never read release their handlers: a write that cannot
// complete within proxy.write_timeout fails, the handler returns, and its
// goroutines and buffers go with it. HTTP/1.1 clients that stop reading
// 32 MiB answers, and an HTTP/2 client that keeps its window at zero for
// 200 streams: every handler gone within write_timeout (1 s here) of the
// answers backing up, and the lane's slots free. A client that reads
// slowly, for longer than write_timeout in all, is not cut.
func TestClientsThatNeverReadAreReleased(t *testing.T) {
	gw, calls := bigAnswers(t)
	// The gateway stops an answer when its client goes (its write fails):
	// cancel_propagates, so that 200 abandoned answers of 32 MiB are not
	// read to their ends.
	h := newHostile(t, "limiter: {max_inflight: 400}\nupstreams: [{name: gw, base_url: \""+gw.URL+"/v1\", cancel_propagates: true}]\n"+
		"proxy: {write_timeout: 1s}\n", Options{})
	body := `{"model":"m","stream":true}`
	base := handlers()

	t.Run("HTTP/1.1, 20 connections", func(t *testing.T) {
		for range 20 {
			c, err := net.Dial("tcp", h.l.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /proxy/gw/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			// and never reads
		}
		// Every call's answer has begun (a handler writes it); then every
		// handler returns though no client has read or closed. Waiting for
		// all 20 to run at once would race write_timeout on a loaded machine.
		waitCalls(t, calls, 20)
		took := waitHandlers(t, "released", func(n int) bool { return n <= base }, 30*time.Second)
		t.Logf("20 non-reading HTTP/1.1 clients: handlers released %s after the last answer began", took.Round(10*time.Millisecond))
	})

	t.Run("HTTP/1.1, a slow reader", func(t *testing.T) {
		// 32 MiB, far more than the sockets' buffers take, read at 64 KiB
		// every 10 ms: several write_timeouts in all, and none of its
		// writes waits long.
		req, _ := http.NewRequest("POST", h.base+"/proxy/gw/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		start, buf := time.Now(), make([]byte, 64<<10)
		var got int
		for {
			n, err := io.ReadFull(res.Body, buf)
			got += n
			if err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if want := 512 * (64<<10 + 8); got != want {
			t.Fatalf("a slow reader got %d bytes of %d in %s: cut", got, want, time.Since(start))
		}
		t.Logf("a slow reader read its answer in %s, uncut", time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("HTTP/2, zero window, 200 streams", func(t *testing.T) {
		c := dialH2(t, h.l.Addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}) // and never grants a window
		before := calls.Load()
		for range 200 {
			c.post("/proxy/gw/chat/completions", []byte(body), true, contentLength(len(body))...)
		}
		waitCalls(t, calls, before+200)
		took := waitHandlers(t, "released", func(n int) bool { return n <= base }, 30*time.Second)
		t.Logf("200 zero-window streams: handlers released %s after the last answer began", took.Round(10*time.Millisecond))
	})

	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if l := h.srv.Limiter().Snapshot().Lanes; len(l) == 1 && l[0].Inflight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held: %+v", h.srv.Limiter().Snapshot().Lanes)
		}
	}
}
