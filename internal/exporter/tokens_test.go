package exporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// tokenGateway is gatewaysim with a tokens-per-minute limit on the fake
// clock: every answer carries OpenAI's x-ratelimit-*-tokens headers.
func tokenGateway(t *testing.T, clock *limitertest.Clock, c gatewaysim.Config) (*gatewaysim.Gateway, string) {
	sim := gatewaysim.New(c)
	sim.SetClock(clock.Now)
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { sim.Close(); srv.Close() })
	return sim, srv.URL + "/v1"
}

// tokenProxy runs a proxy with the limiter settings limiter (YAML flow
// mapping) in front of a gatewaysim of c, both on clock, and returns the
// server, the gateway, the gateway's base URL and the proxy's URL.
func tokenProxy(t *testing.T, clock *limitertest.Clock, c gatewaysim.Config, limiter string) (srv *Server, sim *gatewaysim.Gateway, base, front string) {
	sim, base = tokenGateway(t, clock, c)
	srv = newTestServerWith(t, fmt.Sprintf("limiter: %s\nupstreams:\n  - {name: gw, base_url: %s}\n", limiter, base), Options{Clock: clock})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	fs := httptest.NewServer(srv.Handler())
	t.Cleanup(fs.Close)
	return srv, sim, base, fs.URL
}

func chatBody(content string, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, content, maxTokens)
}

// With no budget configured, the lane follows the gateway's
// x-ratelimit-remaining-tokens and its reset: a call the gateway would
// answer 429 waits until the provider's bucket has refilled enough for it,
// with slots free, and then goes through. On the fake clock, which the
// gateway's bucket reads too.
func TestProxyFollowsRateLimitHeaders(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	srv, sim, base, front := tokenProxy(t, clock, gatewaysim.Config{Capacity: 100, Tokens: 3000, TokensPerMinute: 6000, Seed: 1}, "{max_inflight: 8}")

	// Another client of the provider, not through the lane, uses 3,001
	// tokens (a prompt of 1 and an answer of 3,000).
	if code, body := postJSON(t, base+"/chat/completions", chatBody("abcd", 3000)); code != 200 {
		t.Fatalf("direct call: %d %s", code, body)
	}
	// Through the lane: 11 more, and the answer says 2,988 remain.
	if code, body := postJSON(t, front+"/proxy/gw/chat/completions", chatBody("abcd", 10)); code != 200 {
		t.Fatalf("first call: %d %s", code, body)
	}
	p := srv.Limiter().Snapshot().Lanes[0].Tokens.Provider
	if p == nil || p.Tokens == nil || p.Tokens.Remaining != 2988 || p.Tokens.Limit != 6000 {
		t.Fatalf("provider figures %+v, want 2,988 of 6,000 remaining", p)
	}
	// A call estimated at 2,994 (4 of prompt, 2,990 of output) would be
	// answered 429 now (the gateway wants 2,991, and holds 2,988): it waits.
	done := make(chan string, 1)
	go func() {
		code, body := postJSON(t, front+"/proxy/gw/chat/completions", chatBody("abcd", 2990))
		done <- fmt.Sprint(code, " ", body)
	}()
	waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 })
	if w := srv.Limiter().Snapshot().Lanes[0].Tokens.WaitingFor["default"]; w != limiter.WaitProvider {
		t.Fatalf("the call waits for %q, want %q", w, limiter.WaitProvider)
	}
	// The provider refills 100 tokens a second: 6 more are needed, 60 ms.
	clock.Advance(50 * time.Millisecond)
	waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 && l.Inflight == 0 })
	clock.Advance(60 * time.Millisecond)
	if got := <-done; !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the call that waited: %s", got)
	}
	if s := sim.Stats(); s.RateLimited != 0 {
		t.Fatalf("the gateway answered %d 429s, want none", s.RateLimited)
	}
}

// With cold_start and no budget, a first burst larger than the provider's
// minute is not sent blind: the lane sends one call, and its answer's
// headers decide the rest. Three calls of 2,501 tokens at the gateway
// (6,000 a minute) go as one, then one (3,499 remain), then the last once
// the provider has refilled; the gateway answers no 429. Each writes all
// of its max_tokens, so that the gateway gives nothing back when one ends
// and what the second call's answer says does not hang on whether the
// first had ended when the second arrived. On the fake clock, which the
// gateway's bucket reads too.
func TestProxyColdStart(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	srv, sim, _, front := tokenProxy(t, clock, gatewaysim.Config{Capacity: 100, Tokens: 2500, TokensPerMinute: 6000, Seed: 1}, "{max_inflight: 4, cold_start: true}")
	url := front + "/proxy/gw/chat/completions"

	done := make(chan string, 3)
	for range 3 {
		go func() {
			code, body := postJSON(t, url, chatBody("abcd", 2500))
			done <- fmt.Sprint(code, " ", body)
		}()
	}
	got := []string{<-done}
	// One more fits what the first answer said remains; the last waits
	// for the provider's tokens with slots free.
	got = append(got, <-done)
	waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 && l.Inflight == 0 })
	l := srv.Limiter().Snapshot().Lanes[0]
	if l.ColdStart || l.Tokens.WaitingFor["default"] != limiter.WaitProvider {
		t.Fatalf("lane: cold_start %v, the last call waits for %q; want false and %q", l.ColdStart, l.Tokens.WaitingFor["default"], limiter.WaitProvider)
	}
	clock.Advance(30 * time.Second)
	got = append(got, <-done)
	for _, g := range got {
		if !strings.HasPrefix(g, "200 ") {
			t.Fatalf("answers %q, want three 200s", got)
		}
	}
	if s := sim.Stats(); s.RateLimited != 0 || s.Received != 3 {
		t.Fatalf("the gateway received %d and answered %d 429s, want 3 and none", s.Received, s.RateLimited)
	}
}

// A lane with a tokens_per_minute budget: a call larger than the whole
// budget is a 413 naming it; the tokens used, the budget left and the
// estimate error are metrics; a reload changes the budget in force.
func TestProxyTokenBudget(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	_, base := tokenGateway(t, clock, gatewaysim.Config{Capacity: 100, Tokens: 20, Seed: 1})
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	write := func(tpm int) {
		yaml := fmt.Sprintf("limiter: {max_inflight: 4, tokens_per_minute: %d, default_max_output_tokens: 100}\nupstreams:\n  - {name: gw, base_url: %s}\n", tpm, base)
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Options{File: file, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	url := front.URL + "/proxy/gw/chat/completions"

	code, body := postJSON(t, url, chatBody("abcd", 5000))
	var e lanehttp.ErrorBody
	if json.Unmarshal([]byte(body), &e); code != 413 || e.Error.Code != lanehttp.TokenBudgetCode || !strings.Contains(e.Error.Message, "tokens_per_minute (1000)") {
		t.Fatalf("a call of 5,004 tokens: %d %s, want a 413 %s naming tokens_per_minute", code, body, lanehttp.TokenBudgetCode)
	}
	// No max_tokens: the default output bound, 100; the answer's usage
	// (1 + 20) settles it.
	if code, body := postJSON(t, url, `{"model":"m","messages":[{"role":"user","content":"abcd"}]}`); code != 200 {
		t.Fatalf("call: %d %s", code, body)
	}
	tk := srv.Limiter().Snapshot().Lanes[0].Tokens
	if tk == nil || *tk.Remaining != 1000-21 || tk.Used1m != (limiter.TokenCounts{Prompt: 1, Completion: 20}) {
		t.Fatalf("tokens %+v, want 979 remaining and 1 + 20 used", tk)
	}
	_, metrics := get(t, front.URL+"/metrics")
	for _, want := range []string{
		`llmlanes_llm_tokens_total{kind="prompt",lane="` + base + `|m"} 1`,
		`llmlanes_llm_tokens_total{kind="completion",lane="` + base + `|m"} 20`,
		`llmlanes_llm_token_budget_remaining{lane="` + base + `|m"} 979`,
		`llmlanes_llm_token_estimate_error_ratio_count{lane="` + base + `|m"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("no %s in the metrics:\n%s", want, grepLines(metrics, "token"))
		}
	}
	// A reload to 10,000: the same bucket, larger; the 413 now fits.
	write(10_000)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if tk := srv.Limiter().Snapshot().Lanes[0].Tokens; tk.TokensPerMinute != 10_000 || *tk.Remaining != 979 {
		t.Fatalf("after the reload: %+v, want a budget of 10,000 keeping its 979 tokens", tk)
	}
	clock.Advance(time.Minute) // full again: 10,000
	if code, body := postJSON(t, url, chatBody("abcd", 5000)); code != 200 {
		t.Fatalf("after the reload, the call of 5,004: %d %s", code, body)
	}
}

// Bad token settings are refused with the key named.
func TestTokenConfigRefused(t *testing.T) {
	for _, c := range []struct{ yaml, key string }{
		{"limiter: {max_inflight: 2, tokens_per_minute: -1}", "limiter.tokens_per_minute"},
		{"limiter: {max_inflight: 2, max_inflight_tokens: -5}", "limiter.max_inflight_tokens"},
		{"limiter: {max_inflight: 2, default_max_output_tokens: -1}", "limiter.default_max_output_tokens"},
		{"limiter: {max_inflight: 2, cold_start: true}\nshared: {redis_url: 'redis://127.0.0.1:1'}", "limiter.cold_start"},
	} {
		_, err := ParseConfig("lanes.yaml", []byte(c.yaml+"\nupstreams:\n  - {name: gw, base_url: http://127.0.0.1:1/v1}\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != c.key {
			t.Errorf("%q: %v, want an error for %s", c.yaml, err, c.key)
		}
	}
}

// Two calls that fit the budget only one at a time go one after the
// other, and the second waits for tokens, not for a slot.
func TestProxyWaitsForTokens(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	srv, _, _, front := tokenProxy(t, clock, gatewaysim.Config{Capacity: 100, Tokens: 20, Seed: 1}, "{max_inflight: 4, tokens_per_minute: 600}")
	url := front + "/proxy/gw/chat/completions"
	// 4 + 500 estimated, 21 used: 579 left, then 4 + 590 wanted.
	if code, body := postJSON(t, url, chatBody("abcd", 500)); code != 200 {
		t.Fatalf("first: %d %s", code, body)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if code, body := postJSON(t, url, chatBody("abcd", 590)); code != 200 {
			t.Errorf("second: %d %s", code, body)
		}
	}()
	l := waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 })
	if l.Tokens.WaitingFor["default"] != limiter.WaitTokens {
		t.Fatalf("waiting for %v, want tokens", l.Tokens.WaitingFor)
	}
	c := classify.Lane(l, classify.DefaultThresholds())
	if c.State != classify.LocalQueue || !strings.Contains(strings.Join(c.Reasons, ","), "token_budget") {
		t.Fatalf("classified %s %v, want local_queue for token_budget", c.State, c.Reasons)
	}
	clock.Advance(2 * time.Second) // 10 tokens a second: 15 in 1.5 s
	wg.Wait()
}
