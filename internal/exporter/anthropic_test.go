package exporter

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// anthropicCall is one message an Anthropic client sends through the proxy.
type anthropicCall struct {
	ID        string `json:"id"`
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int64  `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	Tenant    string `json:"tenant,omitempty"`
	Priority  string `json:"priority,omitempty"`
	Timeout   int    `json:"timeout,omitempty"` // the client's timeout in seconds; 0: the SDK's default
}

// anthropicResult is how it ended, as the client reports it.
type anthropicResult struct {
	OK      bool   `json:"ok"`
	Status  int    `json:"status"`
	Input   int64  `json:"input"`
	Output  int64  `json:"output"`
	Text    string `json:"text"`
	Message string `json:"message"`
}

// anthropicClient sends c to the proxy at base (the SDK's base URL) with
// its official SDK, two retries allowed.
type anthropicClient func(t *testing.T, base string, c anthropicCall) anthropicResult

// goAnthropic is github.com/anthropics/anthropic-sdk-go (v2).
func goAnthropic(t *testing.T, base string, c anthropicCall) anthropicResult {
	opts := []option.RequestOption{option.WithHeader("X-Test-Call", c.ID)}
	if c.Timeout > 0 {
		opts = append(opts, option.WithRequestTimeout(time.Duration(c.Timeout)*time.Second))
	}
	if c.Tenant != "" {
		opts = append(opts, option.WithHeader(TenantHeader, c.Tenant))
	}
	if c.Priority != "" {
		opts = append(opts, option.WithHeader(PriorityHeader, c.Priority))
	}
	client := anthropic.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-ant-go-test"), option.WithMaxRetries(2))
	params := anthropic.MessageNewParams{Model: anthropic.Model(c.Model), MaxTokens: c.MaxTokens,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(c.Prompt))}}
	ctx := context.Background()
	fail := func(err error) anthropicResult {
		r := anthropicResult{Message: err.Error()}
		if e, ok := err.(*anthropic.Error); ok {
			r.Status = e.StatusCode
		}
		return r
	}
	if !c.Stream {
		m, err := client.Messages.New(ctx, params, opts...)
		if err != nil {
			return fail(err)
		}
		r := anthropicResult{OK: true, Input: m.Usage.InputTokens, Output: m.Usage.OutputTokens}
		for _, b := range m.Content {
			r.Text += b.Text
		}
		return r
	}
	stream := client.Messages.NewStreaming(ctx, params, opts...)
	defer stream.Close()
	r := anthropicResult{OK: true}
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "message_start":
			r.Input = ev.Message.Usage.InputTokens
		case "content_block_delta":
			r.Text += ev.Delta.Text
		case "message_delta":
			r.Output = ev.Usage.OutputTokens
		}
	}
	if err := stream.Err(); err != nil {
		return fail(err)
	}
	return r
}

// nodeAnthropic is the official Node SDK (@anthropic-ai/sdk, pinned beside
// the OpenAI one and installed by make tools).
func nodeAnthropic(t *testing.T, base string, c anthropicCall) anthropicResult {
	spec, _ := json.Marshal(c)
	cmd := exec.Command("node", "anthropic.mjs", base, string(spec))
	cmd.Dir = nodeSDK
	out, _ := cmd.Output() // a failed call exits 1, its JSON printed
	var r anthropicResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Errorf("node anthropic.mjs %s: %q: %v", spec, out, err)
	}
	return r
}

// anthropicRig is lanes-exporter in front of gatewaysim speaking the
// Messages API (1,000 tokens a minute, so its answers carry Anthropic's
// rate-limit headers), on a fake clock, with a gateway that can hold a
// call, answer a call's first attempt 429 with retry-after, or say that
// no tokens remain.
type anthropicRig struct {
	clock *limitertest.Clock
	srv   *Server
	base  string // the SDKs' base URL: the proxy's route to the upstream
	hold  chan struct{}

	mu      sync.Mutex
	atProxy map[string]int // attempts by X-Test-Call
	atGW    map[string]int
	leaked  []string // lanes-exporter's headers the gateway saw
}

func newAnthropicRig(t *testing.T) *anthropicRig {
	r := &anthropicRig{clock: limitertest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)), hold: make(chan struct{}),
		atProxy: map[string]int{}, atGW: map[string]int{}}
	sim := gatewaysim.New(gatewaysim.Config{Capacity: 8, TokenTime: time.Millisecond, Tokens: 5, TokensPerMinute: 1000, Seed: 1})
	sim.SetClock(r.clock.Now)
	t.Cleanup(sim.Close)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := req.Header.Get("X-Test-Call")
		r.mu.Lock()
		r.atGW[id]++
		n := r.atGW[id]
		for _, h := range []string{TenantHeader, PriorityHeader} {
			if req.Header.Get(h) != "" {
				r.leaked = append(r.leaked, h)
			}
		}
		r.mu.Unlock()
		switch {
		case id == "hold":
			<-r.hold
		case id == "limited" && n == 1:
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"error","error":{"type":"rate_limit_error","message":"simulated"}}`)
			return
		case id == "drain":
			w = &zeroRemaining{ResponseWriter: w, reset: r.clock.Now().Add(30 * time.Second)}
		}
		sim.ServeHTTP(w, req)
	}))
	t.Cleanup(gw.Close)
	t.Cleanup(func() {
		select {
		case <-r.hold:
		default:
			close(r.hold)
		}
	})
	r.srv = newTestServerWith(t, fmt.Sprintf(`limiter: {max_inflight: 1, queue_timeout: 30s, interactive_reserve: 0}
upstreams:
  - {name: claude, base_url: "%s", provider: anthropic, headers: provider}
`, gw.URL), Options{Clock: r.clock})
	t.Cleanup(func() { r.srv.Shutdown(context.Background()) })
	h := r.srv.Handler()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.atProxy[req.Header.Get("X-Test-Call")]++
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	r.base = front.URL + "/proxy/claude"
	return r
}

// zeroRemaining says, in Anthropic's headers, that no tokens remain until
// reset.
type zeroRemaining struct {
	http.ResponseWriter
	reset time.Time
}

func (z *zeroRemaining) WriteHeader(code int) {
	z.Header().Set("anthropic-ratelimit-tokens-remaining", "0")
	z.Header().Set("anthropic-ratelimit-tokens-reset", z.reset.Format(time.RFC3339))
	z.ResponseWriter.WriteHeader(code)
}

func (z *zeroRemaining) Write(p []byte) (int, error) {
	if z.Header().Get("anthropic-ratelimit-tokens-remaining") != "0" {
		z.WriteHeader(http.StatusOK)
	}
	return z.ResponseWriter.Write(p)
}

func (z *zeroRemaining) Flush() { z.ResponseWriter.(http.Flusher).Flush() }

func (r *anthropicRig) lane(t *testing.T) limiter.LaneSnapshot {
	t.Helper()
	for _, l := range r.srv.Limiter().Snapshot().Lanes {
		if strings.HasSuffix(l.Lane, "|claude-test") {
			return l
		}
	}
	t.Fatalf("no lane of claude-test: %+v", r.srv.Limiter().Snapshot())
	return limiter.LaneSnapshot{}
}

func (r *anthropicRig) attempts(id string) (proxy, gateway int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.atProxy[id], r.atGW[id]
}

// until waits (in real time, for the client's own goroutines or process)
// for the lane to reach a state.
func (r *anthropicRig) until(t *testing.T, what string, ok func(limiter.LaneSnapshot) bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ok(r.lane(t)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %s: %+v", what, r.lane(t))
		}
	}
}

// Anthropic's official clients, Node and Go, through lanes-exporter to a
// gateway that speaks the Messages API, real HTTP all the way:
//   - a whole and a streamed answer, the lane by model, the tenant and class
//     headers honoured and stripped, the usage settled into the lane's tokens;
//   - anthropic-ratelimit-tokens-remaining: 0 holds the next grant until the
//     provider's budget has room (the fake clock moves);
//   - a queue timeout the client gives up on at once: one attempt, none at
//     the gateway (x-should-retry: false);
//   - a 429 with retry-after: the client's retry is held by the lane until
//     then;
//   - a call larger than the provider's whole budget: a 413 the client
//     reports, not retried.
func TestAnthropicClients(t *testing.T) {
	clients := map[string]anthropicClient{"go": goAnthropic, "node": nodeAnthropic}
	for _, name := range []string{"go", "node"} {
		t.Run(name, func(t *testing.T) {
			if name == "node" {
				if _, err := os.Stat(filepath.Join(nodeSDK, "node_modules", "@anthropic-ai", "sdk")); err != nil {
					t.Fatalf("the Anthropic Node SDK is not installed (%v): run make tools", err)
				}
			}
			anthropicClients(t, clients[name])
		})
	}
}

func anthropicClients(t *testing.T, send anthropicClient) {
	r := newAnthropicRig(t)
	call := func(id string) anthropicCall {
		return anthropicCall{ID: id, Model: "claude-test", Prompt: "twelve bytes", MaxTokens: 50}
	}

	// A whole answer and a streamed one, by a tenant, interactive.
	var in, out int64
	for _, stream := range []bool{false, true} {
		c := call(fmt.Sprint("answer-", stream))
		c.Stream, c.Tenant, c.Priority = stream, "team-a", "interactive"
		res := send(t, r.base, c)
		if !res.OK || res.Input != 3 || res.Output != 5 || strings.TrimSpace(res.Text) != "tok0 tok1 tok2 tok3 tok4" {
			t.Fatalf("%s: %+v, want 3 tokens in, 5 out", c.ID, res)
		}
		in, out = in+res.Input, out+res.Output
	}
	l := r.lane(t)
	if tk := l.Tokens; tk == nil || tk.Used1m.Prompt != in || tk.Used1m.Completion != out {
		t.Fatalf("the lane's tokens %+v, want the answers' usage: %d in, %d out", l.Tokens, in, out)
	}
	if !slices.ContainsFunc(l.Tenants, func(s limiter.TenantSnapshot) bool { return s.Tenant == "team-a" }) {
		t.Fatalf("the lane's tenants %+v, want team-a", l.Tenants)
	}
	if l.Tokens.Provider == nil || l.Tokens.Provider.Tokens == nil || l.Tokens.Provider.Tokens.Limit != 1000 {
		t.Fatalf("the provider's word %+v, want Anthropic's headers read (1,000 a minute)", l.Tokens.Provider)
	}
	r.mu.Lock()
	leaked := r.leaked
	r.mu.Unlock()
	if len(leaked) > 0 {
		t.Fatalf("the gateway saw %v", leaked)
	}

	// No tokens remain, the gateway says, until 30 s from now: the next
	// call waits for the provider, and goes when the budget has room.
	if res := send(t, r.base, call("drain")); !res.OK {
		t.Fatalf("drain: %+v", res)
	}
	done := make(chan anthropicResult, 1)
	go func() { done <- send(t, r.base, call("after")) }()
	r.until(t, "the next call waits for the provider", func(l limiter.LaneSnapshot) bool {
		return l.Queued == 1 && l.Tokens.WaitingFor["default"] == limiter.WaitProvider
	})
	if _, gw := r.attempts("after"); gw != 0 {
		t.Fatal("the call reached the gateway with no tokens left")
	}
	r.clock.Advance(30 * time.Second)
	if res := <-done; !res.OK {
		t.Fatalf("after the reset: %+v", res)
	}

	// A queue timeout: behind a call that holds the only slot, the client
	// gives up at the first 503, which says x-should-retry: false.
	held := make(chan anthropicResult, 1)
	go func() { held <- send(t, r.base, call("hold")) }()
	r.until(t, "the slot held", func(l limiter.LaneSnapshot) bool { return l.Inflight == 1 })
	go func() { done <- send(t, r.base, call("late")) }()
	r.until(t, "a call queued", func(l limiter.LaneSnapshot) bool { return l.Queued == 1 })
	r.clock.Advance(30 * time.Second)
	if res := <-done; res.OK || res.Status != 503 {
		t.Fatalf("late: %+v, want the queue timeout's 503", res)
	}
	if proxy, gw := r.attempts("late"); proxy != 1 || gw != 0 {
		t.Fatalf("late: %d attempts at the proxy, %d at the gateway; want 1 and 0", proxy, gw)
	}

	// A client timeout of 6 s, shorter than the wait: the lane answers
	// 503 lane_deadline before the client's own timer fires (at once when
	// its estimate of the wait is longer, else 5.5 s in on its clock), and
	// the client does not retry it.
	short := call("short")
	short.Timeout = 6
	go func() { done <- send(t, r.base, short) }()
	var res anthropicResult
	r.until(t, "a call with a deadline answered or queued", func(l limiter.LaneSnapshot) bool {
		select {
		case res = <-done:
			return true
		default:
			return l.Queued == 1
		}
	})
	if res.Status == 0 {
		r.clock.Advance(5500 * time.Millisecond)
		res = <-done
	}
	if res.OK || res.Status != 503 || !strings.Contains(res.Message, lanehttp.DeadlineCode) {
		t.Fatalf("short: %+v, want the deadline's 503 (%s)", res, lanehttp.DeadlineCode)
	}
	if proxy, gw := r.attempts("short"); proxy != 1 || gw != 0 {
		t.Fatalf("short: %d attempts at the proxy, %d at the gateway; want 1 and 0", proxy, gw)
	}

	// A stream that waits: committed at 15 s with keepalive comments, then
	// its queue timeout at 30 s comes as Anthropic's in-stream error
	// event, which the client raises and does not retry.
	ls := call("late-stream")
	ls.Stream = true
	go func() { done <- send(t, r.base, ls) }()
	r.until(t, "a stream queued", func(l limiter.LaneSnapshot) bool { return l.Queued == 1 })
	r.clock.Advance(15 * time.Second)
	r.clock.Advance(15 * time.Second)
	if res := <-done; res.OK || !strings.Contains(res.Message, lanehttp.QueueTimeoutCode) {
		t.Fatalf("late-stream: %+v, want the queue timeout raised from the stream", res)
	}
	if proxy, gw := r.attempts("late-stream"); proxy != 1 || gw != 0 {
		t.Fatalf("late-stream: %d attempts at the proxy, %d at the gateway; want 1 and 0", proxy, gw)
	}
	close(r.hold)
	if res := <-held; !res.OK {
		t.Fatalf("hold: %+v", res)
	}

	// A 429 with retry-after 1: the client retries after a second, and the
	// lane holds the retry until the second has passed on its clock.
	go func() { done <- send(t, r.base, call("limited")) }()
	r.until(t, "the retry held by the lane", func(l limiter.LaneSnapshot) bool {
		return l.Queued == 1 && l.Tokens.WaitingFor["default"] == limiter.WaitRetryAfter
	})
	r.clock.Advance(time.Second)
	if res := <-done; !res.OK {
		t.Fatalf("limited: %+v", res)
	}
	if proxy, gw := r.attempts("limited"); proxy != 2 || gw != 2 {
		t.Fatalf("limited: %d attempts at the proxy, %d at the gateway; want 2 and 2", proxy, gw)
	}

	// Larger than the provider's whole budget: a 413, reported, not retried.
	huge := call("huge")
	huge.MaxTokens = 5000
	if res := send(t, r.base, huge); res.OK || res.Status != 413 || !strings.Contains(res.Message, "token_budget_exceeded") {
		t.Fatalf("huge: %+v, want a 413 token_budget_exceeded", res)
	}
	if proxy, gw := r.attempts("huge"); proxy != 1 || gw != 0 {
		t.Fatalf("huge: %d attempts at the proxy, %d at the gateway; want 1 and 0", proxy, gw)
	}
}
