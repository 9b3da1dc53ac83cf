package exporter

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// A refused base_url or target URL is never echoed with its user info or
// query values: not in the error, not in the reload reply, not in the log.
func TestConfigErrorsRedactURLs(t *testing.T) {
	for _, bad := range []string{
		"upstreams: [{name: gw, base_url: \"https://alice:s3cret-pass@gw.example/v1?api-key=sk-in-query\"}]\n",
		"upstreams: [{name: gw, base_url: \"ftp://alice:s3cret-pass@gw.example/v1\"}]\n",
		"upstreams: [{name: gw, base_url: \"https://gw.example/v1\"}]\ntargets: [{name: t, url: \"ftp://alice:s3cret-pass@x/?token=sk-in-query\"}]\n",
	} {
		_, err := ParseConfig("lanes.yaml", []byte(bad))
		if err == nil {
			t.Fatalf("accepted %s", bad)
		}
		for _, secret := range []string{"s3cret-pass", "sk-in-query"} {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error echoes %s: %v", secret, err)
			}
		}
	}
	// Through a reload, its reply and the log.
	var logs logbuf.Buffer
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n",
		Options{EnableLifecycle: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	os.WriteFile(h.srv.file, []byte("upstreams: [{name: gw, base_url: \"https://alice:s3cret-pass@gw.example/v1?api-key=sk-in-query\"}]\n"), 0o600)
	res, err := http.Post(h.base+"/-/reload", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), "upstreams[0].base_url") {
		t.Fatalf("reload: %d %s", res.StatusCode, b)
	}
	for _, secret := range []string{"s3cret-pass", "sk-in-query"} {
		if strings.Contains(string(b), secret) || strings.Contains(logs.String(), secret) {
			t.Fatalf("%s leaked: reply %s log %s", secret, b, logs.String())
		}
	}
}

// POST /-/reload only with --web.enable-lifecycle, and never for a request
// a web page could send (an Origin header, a simple content type).
func TestReloadGating(t *testing.T) {
	const cfg = "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n"
	off := newHostile(t, cfg, Options{})
	if res := reload(t, off.base, "", nil); res != 403 {
		t.Fatalf("without the lifecycle flag: %d", res)
	}
	on := newHostile(t, cfg, Options{EnableLifecycle: true})
	for _, c := range []struct {
		ct     string
		header map[string]string
		want   int
	}{
		{"", nil, 200},
		{"application/json", nil, 200},
		{"text/plain", nil, 415},
		{"application/x-www-form-urlencoded", nil, 415},
		{"multipart/form-data; boundary=x", nil, 415},
		{"application/json", map[string]string{"Origin": "http://evil.example"}, 403},
	} {
		if got := reload(t, on.base, c.ct, c.header); got != c.want {
			t.Errorf("content type %q, headers %v: %d, want %d", c.ct, c.header, got, c.want)
		}
	}
	res, _ := http.Get(on.base + "/-/reload")
	res.Body.Close()
	if res.StatusCode != 405 {
		t.Fatalf("GET /-/reload: %d", res.StatusCode)
	}
}

func reload(t *testing.T, base, ct string, header map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/-/reload", nil)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// Reloads in a burst do not make the exporter poll its targets in a burst.
func TestReloadsRateLimitTargetPolls(t *testing.T) {
	var polls int
	tgt := newCountingTarget(&polls)
	defer tgt.Close()
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM}]\ntargets: [{name: t, url: \""+tgt.URL+"\", interval: 1h}]\n",
		Options{EnableLifecycle: true})
	for range 20 {
		if code := reload(t, h.base, "", nil); code != 200 {
			t.Fatalf("reload: %d", code)
		}
	}
	time.Sleep(300 * time.Millisecond) // any poll the burst could have made has happened
	if n := tgt.count(); n > 2 {
		t.Fatalf("20 reloads in a burst made %d polls of the target", n)
	}
}

// A malformed body (bad chunking, cut short) is the client's fault: 400,
// never 502, on model calls (which it never reaches the gateway: they are
// read whole first) and on calls whose body streams through.
func TestMalformedBodyIs400(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n", Options{})
	for _, path := range []string{"/proxy/gw/chat/completions", "/proxy/gw/files"} {
		for name, body := range map[string]string{
			"bad chunk size":   "zz\r\n{}\r\n0\r\n\r\n",
			"cut mid-chunk":    "10\r\n{\"model\":",
			"no final chunk":   "2\r\n{}\r\n",
			"bad chunk ending": "2\r\n{}XX0\r\n\r\n",
		} {
			c, err := net.Dial("tcp", h.l.Addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%s", path, body)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				c.Close()
				t.Fatalf("%s, %s: no answer: %v", path, name, err)
			}
			b, _ := io.ReadAll(res.Body)
			c.Close()
			if res.StatusCode != 400 {
				t.Errorf("%s, %s: %d %s, want 400", path, name, res.StatusCode, b)
			}
		}
		if path == "/proxy/gw/chat/completions" && h.calls.Load() != 0 {
			t.Fatalf("%d malformed model calls reached the gateway", h.calls.Load())
		}
	}
}

// With no proxy timeouts in the file, the defaults bound a hung upstream:
// it is a gateway stall (504, counted as a stall, classified as the
// gateway's), not a canceled call.
func TestDefaultUpstreamTimeouts(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	up := newHangingUpstream(hang)
	defer up.Close()
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \""+up.URL+"/v1\"}]\nclassification: {upstream_errors: 1}\n", Options{Clock: clock})
	cfg := h.srv.Config()
	if time.Duration(cfg.Proxy.ResponseHeaderTimeout) != DefaultResponseHeaderTimeout || time.Duration(cfg.Proxy.StallTimeout) != DefaultStallTimeout {
		t.Fatalf("defaults not applied: %+v", cfg.Proxy)
	}
	done := make(chan *http.Response, 1)
	go func() {
		res, err := http.Post(h.base+"/proxy/gw/chat/completions", "application/json", strings.NewReader(chat))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	for deadline := time.Now().Add(10 * time.Second); len(h.srv.Limiter().Snapshot().Lanes) == 0 || h.srv.Limiter().Snapshot().Lanes[0].Inflight == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call never held its slot")
		}
	}
	// The header guard is armed just after the slot is held: move the clock
	// on until it has fired.
	var res *http.Response
	for i := 0; res == nil; i++ {
		clock.Advance(DefaultResponseHeaderTimeout)
		select {
		case res = <-done:
		case <-time.After(100 * time.Millisecond):
			if i > 100 {
				t.Fatal("the hung call never ended")
			}
		}
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 504 || !strings.Contains(string(b), "upstream_stall") || !strings.Contains(string(b), `gw|protolabs/smart`) || strings.Contains(string(b), up.URL) {
		t.Fatalf("hung upstream: %d %s", res.StatusCode, b)
	}
	l := h.srv.Limiter().Snapshot().Lanes[0]
	if l.Upstream == nil || l.Upstream.Stalls != 1 || l.Upstream.Canceled != 0 || l.Inflight != 0 {
		t.Fatalf("lane after the stall: %+v %+v", l, l.Upstream)
	}
	if c := h.srv.Telemetry().Classify(); len(c) != 1 || c[0].State != "gateway_degraded" {
		t.Fatalf("classification %+v", c)
	}
}

// Model ids: bounded in length, plain in characters, and, with a models
// list, only those allowed (exact ids or globs); none of the refused reach
// the gateway or make a lane.
func TestModelChecks(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM, models: [\"protolabs/*\", gpt-4o]}]\n", Options{})
	for model, want := range map[string]int{
		"protolabs/smart":              200,
		"gpt-4o":                       200,
		"gpt-4o-mini":                  403,
		"other/model":                  403,
		strings.Repeat("a", 257):       400,
		"protolabs/smart\\u0000evil":   400,
		"protolabs/smart|x":            400,
		"protolabs/smart with a space": 400,
	} {
		if code, b := postJSON(t, h.base+"/proxy/gw/chat/completions", `{"model":"`+model+`"}`); code != want {
			t.Errorf("model %.40q: %d %s, want %d", model, code, b, want)
		}
	}
	if n := h.srv.Limiter().Lanes(); n != 2 || h.calls.Load() != 2 {
		t.Fatalf("%d lanes, %d calls at the gateway: want 2 and 2", n, h.calls.Load())
	}
	if _, err := ParseConfig("x.yaml", []byte("upstreams: [{name: gw, base_url: \"https://gw/v1\", models: [\"[bad\"]}]\n")); err == nil ||
		!strings.Contains(err.Error(), "upstreams[0].models[0]") {
		t.Fatalf("a bad glob: %v", err)
	}
}

// /-/healthy answers while the process runs; /-/ready turns 503 as soon as
// shutdown begins, before the listener stops.
func TestHealthyAndReady(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n", Options{})
	for path, want := range map[string]int{"/-/healthy": 200, "/-/ready": 200, "/healthz": 200} {
		if code, _ := get(t, h.base+path); code != want {
			t.Fatalf("%s: %d", path, code)
		}
	}
	h.srv.Stop() // what Listener.Shutdown does first
	if code, body := get(t, h.base+"/-/ready"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Fatalf("/-/ready during shutdown: %d %s", code, body)
	}
	if code, _ := get(t, h.base+"/-/healthy"); code != 200 {
		t.Fatalf("/-/healthy during shutdown: %d", code)
	}
}

// net/http's log lines (an HTTP/2 client can make the server log one a
// frame) pass at most logBurst at once, then one a second, and the next
// line let through says how many were dropped.
func TestServerLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)
	l := log.New(newLimitedLog(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now }), "", 0)
	for i := range 75000 { // a flood within one instant
		l.Printf("http2: bad frame %d", i)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != logBurst {
		t.Fatalf("%d lines logged of 75,000 at once, want the burst, %d", lines, logBurst)
	}
	now = now.Add(time.Second) // a token back
	l.Printf("http2: one more")
	l.Printf("http2: and one too many")
	if lines := strings.Count(buf.String(), "\n"); lines != logBurst+1 || !strings.Contains(buf.String(), "dropped_before=74980") {
		t.Fatalf("after a second: %d lines, want %d, the last with the count dropped:\n%s", lines, logBurst+1, buf.String()[len(buf.String())-300:])
	}
}
