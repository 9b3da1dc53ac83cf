package exporter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// The tests of this file are the reproductions of hostile numbers: a call,
// an answer or a header that says something absurd must not stop a lane
// for longer than a provider's window, nor pass a budget.

// sayingGateway is an OpenAI-compatible gateway on loopback whose answers
// say what the test sets: their rate-limit headers and their usage.
type sayingGateway struct {
	mu       sync.Mutex
	headers  http.Header
	usage    [2]int64 // prompt, completion; {-1, -1}: the usage names the estimate's counts (1 and 2)
	once     *[2]int64
	received atomic.Int32
}

func newSayingGateway(t *testing.T) (*sayingGateway, string) {
	g := &sayingGateway{headers: http.Header{}, usage: [2]int64{1, 2}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		g.received.Add(1)
		g.mu.Lock()
		for k, v := range g.headers {
			w.Header()[k] = v
		}
		u := g.usage
		if g.once != nil {
			u, g.once = *g.once, nil
		}
		g.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			u[0], u[1], u[0]+u[1])
	}))
	t.Cleanup(srv.Close)
	return g, srv.URL + "/v1"
}

// say sets the headers of every later answer (pairs of name and value).
func (g *sayingGateway) say(kv ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.headers = http.Header{}
	for i := 0; i < len(kv); i += 2 {
		g.headers.Set(kv[i], kv[i+1])
	}
}

// usageOnce makes the next answer's usage prompt and completion.
func (g *sayingGateway) usageOnce(prompt, completion int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.once = &[2]int64{prompt, completion}
}

// boundsProxy runs lanes-exporter from a file of the limiter settings
// limiter (a YAML flow mapping) and the lines extra in front of base, on
// clock (nil: the system's), logging to log. It returns the server and the
// proxy's chat completions URL.
func boundsProxy(t *testing.T, clock *limitertest.Clock, base, limiter string, log *logbuf.Buffer, extra ...string) (*Server, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	// The gateway's headers are taken for the provider's own: its announced
	// limit refuses larger calls.
	yaml := fmt.Sprintf("limiter: %s\nupstreams:\n  - {name: gw, base_url: %s, headers: provider}\n", limiter, base) + strings.Join(extra, "\n")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{File: file}
	if clock != nil {
		o.Clock = clock
	}
	if log != nil {
		o.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	srv, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	return srv, front.URL + "/proxy/gw/chat/completions"
}

// refused expects a 413 token_budget_exceeded whose message names budget.
func refused(t *testing.T, url, body, budget string) {
	t.Helper()
	code, answer := postJSON(t, url, body)
	var e lanehttp.ErrorBody
	if json.Unmarshal([]byte(answer), &e); code != http.StatusRequestEntityTooLarge || e.Error.Code != lanehttp.TokenBudgetCode ||
		!strings.Contains(e.Error.Message, budget) {
		t.Fatalf("%s: %d %s, want a 413 %s naming %s", body, code, answer, lanehttp.TokenBudgetCode, budget)
	}
}

// served expects the call to be answered 200 once clock has moved by
// step, at most n times: a lane that stays frozen fails it.
func served(t *testing.T, srv *Server, clock *limitertest.Clock, url, body string, step time.Duration, n int) {
	t.Helper()
	done := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a failed test does not leave the call waiting
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		defer res.Body.Close()
		done <- res.Status
	}()
	for i := 0; ; i++ {
		// Answered, or queued: then the clock may move it on.
		waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 || len(done) == 1 })
		select {
		case got := <-done:
			if !strings.HasPrefix(got, "200") {
				t.Fatalf("the call: %s, want 200", got)
			}
			return
		default:
		}
		if i == n {
			l := srv.Limiter().Snapshot().Lanes[0]
			t.Fatalf("still queued after %d × %s: the lane is frozen (tokens %+v)", n, step, l.Tokens)
		}
		clock.Advance(step)
	}
}

// One call with an absurd max_tokens, through a lane that follows the
// provider's headers with no budget of its own, used to leave the
// provider's mirror at about -1e18 (or -9.9 M for 10,000,000) for good: it
// was granted while the provider's word had lapsed, and its estimate was
// taken from the next count. Now the first is larger than any call
// (max_call_tokens), the second than the provider's last announced limit,
// whether or not its budget is whole: both are a 413 that never reaches
// the gateway, and the lane goes on.
func TestProxyMaxTokensFreeze(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g, base := newSayingGateway(t)
	g.say("x-ratelimit-limit-tokens", "100000", "x-ratelimit-remaining-tokens", "100000", "x-ratelimit-reset-tokens", "1s")
	srv, url := boundsProxy(t, clock, base, "{max_inflight: 4}", nil)
	if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
		t.Fatalf("first call: %d %s", code, body)
	}
	clock.Advance(2 * time.Second) // past the reset, the budget whole: the provider's word binds nothing now
	refused(t, url, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":999999999999999999}`, "max_call_tokens")
	refused(t, url, chatBody("abcd", 10_000_000), "provider (100000)")
	if n := g.received.Load(); n != 1 {
		t.Fatalf("the gateway received %d calls, want 1: a refused call must not reach it", n)
	}
	served(t, srv, clock, url, chatBody("abcd", 10), time.Second, 2)
	p := srv.Limiter().Snapshot().Lanes[0].Tokens.Provider
	if p == nil || p.Tokens == nil || p.Tokens.Remaining < 99_000 {
		t.Fatalf("the provider's word %+v, want about 100,000 remaining", p)
	}
}

// An answer whose usage is 999999999999999999 used to leave a budgeted
// lane's bucket at -1e18. It is counted as at most one whole budget, and
// said once in the log: the lane owes at most one budget, and serves again
// within a minute.
func TestProxyUsageFreeze(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g, base := newSayingGateway(t)
	var log logbuf.Buffer
	srv, url := boundsProxy(t, clock, base, "{max_inflight: 4, tokens_per_minute: 60000}", &log)
	g.usageOnce(999999999999999999, 999999999999999999)
	if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
		t.Fatalf("call: %d %s", code, body)
	}
	// Counted as one whole budget: the bucket, full before, is empty.
	if tk := srv.Limiter().Snapshot().Lanes[0].Tokens; tk.Remaining == nil || *tk.Remaining != 0 {
		t.Fatalf("tokens %+v, want 0 remaining (the usage counted as the whole budget of 60,000)", tk)
	}
	// The caller's next call is estimated at what its last one used (see
	// TestProxyLyingTenant): it waits for the whole budget, a minute, and
	// says the same.
	g.usageOnce(999999999999999999, 999999999999999999)
	served(t, srv, clock, url, chatBody("abcd", 10), 10*time.Second, 7)
	if n := strings.Count(log.String(), "beyond what one call can cost"); n != 1 {
		t.Fatalf("the bounded usage is logged %d times, want once:\n%s", n, log.String())
	}
	// Never more than one budget owed: another tenant's call is served
	// within the minute.
	served(t, srv, clock, url, chatBody("abcd", 10), 10*time.Second, 7)
}

// A reset of 999999h (OpenAI's form) or dated in the year 9999
// (Anthropic's) used to hold a lane for 114 years or for ever. It is taken
// as the provider's window, 60 s, and the budget refills by at least its
// limit per window. The classification names the provider, with the
// reset, not the token budget the lane does not have. A reload forgets
// the provider's word at once.
func TestProxyResetFreeze(t *testing.T) {
	for _, c := range []struct{ name, limit, remaining, reset, value string }{
		{"openai", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", "999999h"},
		{"openai-seconds", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", "1e8"},
		{"anthropic", "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset", "9999-12-31T23:59:59Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
			g, base := newSayingGateway(t)
			srv, url := boundsProxy(t, clock, base, "{max_inflight: 4}", nil)
			g.say(c.limit, "60000", c.remaining, "0", c.reset, c.value)
			if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
				t.Fatalf("first call: %d %s", code, body)
			}
			p := srv.Limiter().Snapshot().Lanes[0].Tokens.Provider
			if p == nil || p.Tokens == nil || p.Tokens.Reset > 60 {
				t.Fatalf("the provider's word %+v, want a reset of at most 60 s", p)
			}
			g.say(c.limit, "60000", c.remaining, "60000")
			answered := make(chan string, 1)
			go func() {
				res, err := http.Post(url, "application/json", strings.NewReader(chatBody("abcd", 10)))
				if err != nil {
					answered <- err.Error()
					return
				}
				res.Body.Close()
				answered <- res.Status
			}()
			l := waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 })
			cl := classify.Lane(l, classify.DefaultThresholds())
			if cl.State != classify.LocalQueue || strings.Join(cl.Reasons, ",") != classify.ReasonProviderLimit ||
				!strings.Contains(cl.HoldText, "waiting for the provider's rate limit (resets in 60 s)") {
				t.Fatalf("classified %s %v %q, want local_queue for provider_limit, resetting in 60 s", cl.State, cl.Reasons, cl.HoldText)
			}
			// 14 tokens at 1,000 a second (60,000 a minute).
			clock.Advance(20 * time.Millisecond)
			if got := <-answered; !strings.HasPrefix(got, "200") {
				t.Fatalf("the call that waited: %s", got)
			}

			// The provider says 0 remain again, for a minute: a reload
			// forgets it, and the next call goes at once.
			g.say(c.limit, "60000", c.remaining, "0", c.reset, c.value)
			if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
				t.Fatalf("call: %d %s", code, body)
			}
			if err := srv.Reload(); err != nil {
				t.Fatal(err)
			}
			if tk := srv.Limiter().Snapshot().Lanes[0].Tokens; tk != nil && tk.Provider != nil {
				t.Fatalf("after the reload the provider's word is %+v, want none", tk.Provider)
			}
			if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
				t.Fatalf("after the reload: %d %s", code, body)
			}
		})
	}
}

// max_tokens 999999999999999999 with n 10 used to overflow to a negative
// estimate, which fitted a 60,000-token budget; a max_tokens of 25 digits
// read as none (the default bound). Both are now larger than any call.
func TestProxyEstimateOverflow(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g, base := newSayingGateway(t)
	_, url := boundsProxy(t, clock, base, "{max_inflight: 4, tokens_per_minute: 60000}", nil)
	refused(t, url, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":999999999999999999,"n":10}`, "tokens_per_minute (60000)")
	refused(t, url, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9999999999999999999999999}`, "tokens_per_minute (60000)")
	if n := g.received.Load(); n != 0 {
		t.Fatalf("the gateway received %d calls, want none", n)
	}
}

// On a shared lane the same freezes sat in Redis and survived restarting
// every exporter. Now the provider's word is a key of its own that
// expires when it stops binding (at most two windows), a call larger than
// the provider's last announced limit is refused by lane.lua (whether or
// not its budget is whole), and a reload forgets both, for every process.
// A real redis-server, on Redis' own clock.
func TestSharedProviderBounds(t *testing.T) {
	r := redistest.Start(t)
	r.WaitUptime(time.Second) // no grant in a Redis' first lease
	g, base := newSayingGateway(t)
	g.say("x-ratelimit-limit-tokens", "100000", "x-ratelimit-remaining-tokens", "99000", "x-ratelimit-reset-tokens", "999999h")
	var log logbuf.Buffer
	srv, url := boundsProxy(t, nil, base, "{max_inflight: 4}", &log, fmt.Sprintf("shared: {redis_url: %q, lease_ttl: 1s}", r.URL()))
	if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
		t.Fatalf("first call: %d %s", code, body)
	}
	pv := ""
	for _, k := range r.Keys() {
		if strings.HasSuffix(k, ":pv") {
			pv = k
		}
	}
	if pv == "" {
		t.Fatalf("no provider key in Redis: %v", r.Keys())
	}
	// Its reset of 999999h is taken as 60 s; 1,000 tokens short of a
	// limit of 100,000 that refills at least 100,000 a minute: whole (and
	// gone) in about 0.6 s, and bound to go within two windows.
	if ttl, err := r.Do("PTTL " + pv); err != nil || atoi(ttl) <= 0 || atoi(ttl) > 120_000 {
		t.Fatalf("PTTL %s: %q, %v; want a life of at most 120,000 ms", pv, ttl, err)
	}
	refused(t, url, chatBody("abcd", 10_000_000), "provider (100000)")
	refused(t, url, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":999999999999999999}`, "max_call_tokens")
	if n := g.received.Load(); n != 1 {
		t.Fatalf("the gateway received %d calls, want 1", n)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.Do("EXISTS " + pv); n != "0" {
		t.Fatalf("after the reload %s still exists", pv)
	}
	m := strings.TrimSuffix(pv, "pv") + "m"
	if v, _ := r.Do("HGET " + m + " pl"); v != "" {
		t.Fatalf("after the reload the provider's limit is %q, want none", v)
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// A body between 16 and 32 MiB, under proxy.max_body_bytes (32 MiB), used
// to be answered a retryable 503 queued_bytes_limit every time: reading it
// holds twice its size, more than the connection's default share. With the
// defaults it passes now (and a configuration that could not admit one is
// refused: TestConfigErrors).
func TestProxyLargeBodyAdmitted(t *testing.T) {
	g, base := newSayingGateway(t)
	front, _, _ := newFront(t, fmt.Sprintf("limiter: {max_inflight: 2}\nupstreams:\n  - {name: gw, base_url: %s}\n", base), false)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 20<<20) + `"}],"max_tokens":1}`
	for range 2 {
		if code, answer := postJSON(t, front.URL+"/proxy/gw/chat/completions", body); code != 200 {
			t.Fatalf("a body of %d bytes: %d %.300s, want 200", len(body), code, answer)
		}
	}
	if n := g.received.Load(); n != 2 {
		t.Fatalf("the gateway received %d calls, want 2", n)
	}
}
