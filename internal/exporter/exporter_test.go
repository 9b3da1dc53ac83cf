package exporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// upstreamLog is a loopback gateway that records what reaches it; hold
// makes streams wait after their first chunk until closed.
type upstreamLog struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string // X-Test-Call of each request, in arrival order
	hdrs []http.Header
	hold chan struct{}
	gone chan string // requests whose client went away
	done chan struct{}
}

func newUpstream(t *testing.T) *upstreamLog {
	u := &upstreamLog{hold: make(chan struct{}), gone: make(chan string, 100), done: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("X-Test-Call")
		u.mu.Lock()
		u.seen = append(u.seen, id)
		u.hdrs = append(u.hdrs, r.Header.Clone())
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		if strings.HasPrefix(id, "long") {
			select {
			case <-u.hold:
			case <-r.Context().Done():
				u.gone <- id
				return
			case <-u.done:
				return
			}
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(func() { close(u.done); u.srv.Close() })
	return u
}

func (u *upstreamLog) ids() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

type proxyRig struct {
	t      *testing.T
	up     *upstreamLog
	srv    *Server
	front  *httptest.Server
	clock  *limitertest.Clock
	queued chan struct{}
	hits   atomic.Int64 // requests that reached the proxy
}

func newProxy(t *testing.T, yaml string) *proxyRig {
	t.Helper()
	r := &proxyRig{t: t, up: newUpstream(t), clock: limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)), queued: make(chan struct{}, 100)}
	yaml = strings.ReplaceAll(yaml, "UPSTREAM", r.up.srv.URL+"/v1")
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte(yaml), 0o600)
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	r.srv, err = New(cfg, Options{File: file, Clock: r.clock, Base: base, EnableLifecycle: true, Observers: []limiter.Observer{
		func(_ context.Context, e limiter.Event) {
			if e.Kind == limiter.Enqueued {
				r.queued <- struct{}{}
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	r.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		r.srv.Handler().ServeHTTP(w, req)
	}))
	t.Cleanup(func() { r.front.Close(); r.srv.Shutdown(context.Background()) })
	return r
}

func (r *proxyRig) file() string { return r.srv.file }

// lane returns the proxy's lane for model m.
func (r *proxyRig) lane(m string) string { return r.up.srv.URL + "/v1|" + m }

func (r *proxyRig) snapshot(m string) limiter.LaneSnapshot {
	for _, l := range r.srv.Limiter().Snapshot().Lanes {
		if l.Lane == r.lane(m) {
			return l
		}
	}
	return limiter.LaneSnapshot{}
}

// waitQueued waits for the next call to queue, and checks that n calls
// now wait in the lane.
func (r *proxyRig) waitQueued(m string, n int) {
	r.t.Helper()
	select {
	case <-r.queued:
	case <-time.After(10 * time.Second):
		r.t.Fatal("no call queued")
	}
	if q := r.snapshot(m).Queued; q != n {
		r.t.Fatalf("queued %d, want %d", q, n)
	}
}

// post sends a chat completion through the proxy.
func (r *proxyRig) post(ctx context.Context, path, id, priority, body string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-secret-key")
	req.Header.Set("X-Test-Call", id)
	if priority != "" {
		req.Header.Set(PriorityHeader, priority)
	}
	return http.DefaultClient.Do(req)
}

// oneSlot is a lane of one slot in front of the rig's upstream, which stops
// a call's work when its client goes (cancel_propagates).
const oneSlot = `
limiter: {max_inflight: 1, queue_timeout: 300s, interactive_reserve: 0}
upstreams:
  - {name: gw, base_url: UPSTREAM, capacity: 4, cancel_propagates: true}
`

const chat = `{"model":"protolabs/smart","stream":true,"messages":[]}`

// holdSlot starts a stream that holds the rig's one slot (its upstream
// answers a call named long* until r.up.hold closes), and returns it once
// its first chunk came.
func (r *proxyRig) holdSlot() *http.Response {
	r.t.Helper()
	long, err := r.post(context.Background(), "/proxy/gw/chat/completions", "long", "", chat)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { long.Body.Close() })
	long.Body.Read(make([]byte, 64))
	return long
}

// 1. Priority end to end through the proxy.
func TestProxyPriority(t *testing.T) {
	r := newProxy(t, oneSlot)
	long, err := r.post(context.Background(), "/proxy/gw/chat/completions", "long", "default", chat)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()
	buf := make([]byte, 64)
	long.Body.Read(buf) // the first chunk: the stream holds the slot
	var wg sync.WaitGroup
	start := func(id, p string, n int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.post(context.Background(), "/proxy/gw/chat/completions", id, p, chat)
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
		r.waitQueued("protolabs/smart", n)
	}
	start("bulk1", "bulk", 1)
	start("bulk2", "bulk", 2)
	start("bulk3", "bulk", 3)
	start("chat", "interactive", 4)
	close(r.up.hold)
	io.Copy(io.Discard, long.Body)
	wg.Wait()
	if got := strings.Join(r.up.ids(), ","); got != "long,chat,bulk1,bulk2,bulk3" {
		t.Fatalf("upstream order %s", got)
	}
	for _, h := range r.up.hdrs {
		if h.Get(PriorityHeader) != "" {
			t.Fatal("X-LLM-Priority reached the upstream")
		}
		if h.Get("Authorization") != "Bearer sk-secret-key" {
			t.Fatalf("credentials not forwarded: %q", h.Get("Authorization"))
		}
	}
}

// 2. A queue timeout through the proxy with openai-go: one 503, not retried.
// The held call's stall guard is longer than the queue timeout: the one
// Advance below must fire the waiter's deadline alone (with the default
// 120 s stall timeout it would also end the held call, and which of the
// two the lane saw first would depend on goroutine scheduling).
func TestProxyQueueTimeoutWithOpenAI(t *testing.T) {
	r := newProxy(t, oneSlot+"proxy: {stall_timeout: 1h, response_header_timeout: 1h}\n")
	long, err := r.post(context.Background(), "/proxy/gw/chat/completions", "long", "", chat)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()
	long.Body.Read(make([]byte, 64))
	hitsBefore := r.hits.Load()
	done := make(chan error, 1)
	go func() {
		c := openai.NewClient(option.WithBaseURL(r.front.URL+"/proxy/gw/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(2))
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "protolabs/smart",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		done <- err
	}()
	r.waitQueued("protolabs/smart", 1)
	r.clock.Advance(300 * time.Second)
	var err2 error
	select {
	case err2 = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never ended (retried into the queue?)")
	}
	var apiErr *openai.Error
	// The client sees the upstream's configured name, not its address.
	if !errors.As(err2, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != "lane_queue_timeout" ||
		!strings.Contains(apiErr.Message, `"gw|protolabs/smart"`) || strings.Contains(apiErr.RawJSON(), r.up.srv.URL) ||
		apiErr.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("err %v", err2)
	}
	// Retry-After: with no hold time known yet, one queue timeout; the
	// message names the wait, the position and the setting to change.
	if got := apiErr.Response.Header.Get("Retry-After"); got != "300" {
		t.Fatalf("Retry-After %q, want 300", got)
	}
	for _, s := range []string{"waiting 5m0s", "position 1 of 1", "raise max_inflight (now 1)", "queue_timeout"} {
		if !strings.Contains(apiErr.Message, s) {
			t.Fatalf("message %q lacks %q", apiErr.Message, s)
		}
	}
	if n := r.hits.Load() - hitsBefore; n != 1 {
		t.Fatalf("%d requests reached the proxy, want 1 (no retry)", n)
	}
	close(r.up.hold)
}

// 3. A client that disconnects mid-stream frees its slot and the upstream
// sees the disconnect.
func TestProxyClientDisconnect(t *testing.T) {
	r := newProxy(t, oneSlot)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := r.post(ctx, "/proxy/gw/chat/completions", "long-gone", "", chat)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Read(make([]byte, 64))
	if l := r.snapshot("protolabs/smart"); l.Inflight != 1 {
		t.Fatalf("inflight %d", l.Inflight)
	}
	cancel()
	res.Body.Close()
	select {
	case id := <-r.up.gone:
		if id != "long-gone" {
			t.Fatalf("gone %s", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never saw the client go")
	}
	for deadline := time.Now().Add(10 * time.Second); r.snapshot("protolabs/smart").Inflight != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("slot not freed")
		}
	}
}

// 4. Reload: a raised limit admits queued calls; a broken file is refused
// and the old limits hold.
func TestProxyReload(t *testing.T) {
	r := newProxy(t, oneSlot)
	long, _ := r.post(context.Background(), "/proxy/gw/chat/completions", "long", "", chat)
	defer long.Body.Close()
	long.Body.Read(make([]byte, 64))
	var wg sync.WaitGroup
	for i, id := range []string{"w1", "w2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.post(context.Background(), "/proxy/gw/chat/completions", id, "", chat)
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
		r.waitQueued("protolabs/smart", i+1)
	}
	// A broken file: refused, the old limit holds.
	os.WriteFile(r.file(), []byte("limiter: {max_inflight: -2}\nupstreams: []\n"), 0o600)
	res, _ := http.Post(r.front.URL+"/-/reload", "", nil)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), "limiter.max_inflight") || !strings.Contains(string(b), r.file()) {
		t.Fatalf("bad reload: %d %s", res.StatusCode, b)
	}
	if l := r.snapshot("protolabs/smart"); l.Limit != 1 || l.Queued != 2 {
		t.Fatalf("after a refused reload: %+v", l)
	}
	_, metrics := get(t, r.front.URL+"/metrics")
	if !strings.Contains(metrics, "llmlanes_config_last_reload_successful 0") {
		t.Fatal("refused reload not in the metric")
	}
	// A good file raising the limit admits both waiters at once.
	os.WriteFile(r.file(), []byte(strings.Replace(strings.ReplaceAll(oneSlot, "UPSTREAM", r.up.srv.URL+"/v1"), "max_inflight: 1", "max_inflight: 3", 1)), 0o600)
	if err := r.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // both finished while "long" still holds its slot
	if l := r.snapshot("protolabs/smart"); l.Limit != 3 || l.Inflight != 1 {
		t.Fatalf("after reload: %+v", l)
	}
	_, metrics = get(t, r.front.URL+"/metrics")
	if !strings.Contains(metrics, "llmlanes_config_last_reload_successful 1") {
		t.Fatal("successful reload not in the metric")
	}
	close(r.up.hold)
}

// 5. Bad input gets a 4xx JSON error and never reaches any gateway.
func TestProxyBadInput(t *testing.T) {
	evil := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a request reached a host that is not an upstream") }))
	defer evil.Close()
	r := newProxy(t, `
limiter: {max_inflight: 2}
upstreams: [{name: gw, base_url: UPSTREAM}]
proxy: {max_body_bytes: 1024}
`)
	host := strings.TrimPrefix(evil.URL, "http://")
	for _, tc := range []struct {
		name, path, priority, body string
		status                     int
		code                       string
	}{
		{"malformed JSON", "/proxy/gw/chat/completions", "", `{"model":`, 400, "invalid_json"},
		{"no JSON", "/proxy/gw/chat/completions", "", `model=x`, 400, "invalid_json"},
		{"no body", "/proxy/gw/chat/completions", "", ``, 400, "invalid_json"},
		{"missing model", "/proxy/gw/chat/completions", "", `{"messages":[]}`, 400, "missing_model"},
		{"oversized body", "/proxy/gw/chat/completions", "", `{"model":"m","x":"` + strings.Repeat("x", 2000) + `"}`, 413, "request_too_large"},
		{"unknown priority", "/proxy/gw/chat/completions", "urgent", chat, 400, "invalid_priority"},
		{"unknown upstream", "/proxy/nope/chat/completions", "", chat, 404, "unknown_upstream"},
		{"a host as upstream", "/proxy/" + host + "/chat/completions", "", chat, 404, "unknown_upstream"},
		{"dot segments", "/proxy/gw/%2e%2e/%2e%2e/chat/completions", "", chat, 400, "invalid_path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := r.post(context.Background(), tc.path, tc.name, tc.priority, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var e struct {
				Error struct{ Code, Message string }
			}
			if res.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Fatalf("%d %s", res.StatusCode, b)
			}
			if strings.Contains(string(b), "sk-secret") {
				t.Fatal("credentials echoed")
			}
		})
	}
	if ids := r.up.ids(); len(ids) != 0 {
		t.Fatalf("the upstream received %v", ids)
	}
	// An absolute URL in the path stays on the upstream's host.
	res, _ := r.post(context.Background(), "/proxy/gw/"+evil.URL+"/chat/completions", "abs", "", chat)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// postJSON posts body to url as JSON and returns the status and the
// whole answer.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The routes and the status page are served beside the proxy.
func TestRoutesAndStatusPage(t *testing.T) {
	r := newProxy(t, oneSlot)
	res, _ := r.post(context.Background(), "/proxy/gw/chat/completions", "x", "", chat)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	for path, want := range map[string]string{
		"/":                        "<title>llmlanes — lanes</title>",
		"/healthz":                 "ok",
		"/api/telemetry/llm-lanes": `"lane":"` + r.lane("protolabs/smart") + `"`,
		"/api/telemetry/llm-lanes/classification": `"state":"healthy"`,
		"/metrics": `llmlanes_llm_inflight{lane="` + r.lane("protolabs/smart") + `"} 0`,
	} {
		code, body := get(t, r.front.URL+path)
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("%s: %d lacks %q", path, code, want)
		}
	}
	if _, body := get(t, r.front.URL+"/"); strings.Contains(body, "<script src") || strings.Contains(body, "<link") || strings.Contains(body, "https://") {
		t.Error("the status page loads something from elsewhere")
	}
	if code, _ := get(t, r.front.URL+"/-/reload"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /-/reload: %d", code)
	}
}

// newTestServer builds a server from a configuration, with its own
// connection pool to the upstreams, closed with the test.
func newTestServer(t *testing.T, yaml string) *Server {
	t.Helper()
	return newTestServerWith(t, yaml, Options{})
}

// newTestServerWith is newTestServer with options (o.Base is set here).
func newTestServerWith(t *testing.T, yaml string, o Options) *Server {
	t.Helper()
	cfg, err := ParseConfig("lanes.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	o.Base = base
	srv, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}
