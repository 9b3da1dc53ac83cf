package exporter

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// These tests put lanes-exporter in front of gatewaysim's LiteLLM profile:
// a model of a LiteLLM proxy (1.7x) in front of a slow backend, made from
// LiteLLM's docs and source (see gatewaysim.LiteLLM), since LiteLLM itself
// cannot be installed here. What it models: a client's disconnect does not
// stop the backend's work; max_parallel_requests answers 429 with a
// fractional retry-after to the next minute and its error body; rpm and
// tpm are announced in x-ratelimit-* headers with no reset.

// liteProxy runs the exporter with upstream options opts (YAML flow
// mapping entries) and limiter settings lim in front of a LiteLLM-like
// gatewaysim of c, and returns the exporter, the simulator and the
// proxy's URL for chat completions.
func liteProxy(t *testing.T, c gatewaysim.Config, lim, opts string, o Options) (*Server, *gatewaysim.Gateway, string) {
	t.Helper()
	sim := gatewaysim.New(c)
	simSrv := httptest.NewServer(sim)
	t.Cleanup(func() { sim.Close(); simSrv.Close() })
	srv := newTestServerWith(t, fmt.Sprintf("limiter: %s\nupstreams:\n  - {name: gw, base_url: %s/v1%s}\n", lim, simSrv.URL, opts), o)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	return srv, sim, front.URL + "/proxy/gw/chat/completions"
}

// The incident's shape in front of LiteLLM: 28 callers (7 interactive, 21
// bulk) whose client timeout is shorter than a call under load, so many
// give up while their calls are at the gateway, half of them streamed. The
// backend never has more calls at work than the lane's limit: a call
// whose caller left keeps its slot until its answer ends. (With
// cancel_propagates: true, the setting for a gateway that stops the work,
// the same run put 8 to 10 calls at work on the backend here.)
func TestLiteLLMBackendNeverOverLimit(t *testing.T) {
	const limit = 4
	c := gatewaysim.Config{Capacity: limit, TokenTime: 5 * time.Millisecond, Tokens: 20, FirstTokenDelay: 20 * time.Millisecond,
		LiteLLM: &gatewaysim.LiteLLM{}, Seed: 9}
	srv, sim, url := liteProxy(t, c, fmt.Sprintf("{max_inflight: %d, interactive_reserve: 1}", limit), "", Options{})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 28 {
		class := "bulk"
		if i%4 == 0 {
			class = "interactive"
		}
		timeout := time.Duration(80+rng.IntN(400)) * time.Millisecond // a call alone takes ~120 ms
		stream := i%2 == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 { // the client's attempt and two retries, as the SDKs do
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"call %d"}]}`, stream, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(PriorityHeader, class)
				res, err := http.DefaultClient.Do(req)
				o := "timed out"
				if err == nil {
					_, err = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if err == nil {
						o = fmt.Sprint(res.StatusCode)
					}
				}
				cancel()
				mu.Lock()
				outcomes[o]++
				mu.Unlock()
				if o == "200" {
					return
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for sim.Stats().Active > 0 || srv.Limiter().Snapshot().Lanes[0].Inflight > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("calls still at work 20 s after the last caller left: %+v", sim.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := sim.Stats()
	if st.Peak > limit {
		t.Fatalf("the backend had %d calls at work at once, want at most %d (max_inflight); outcomes %v", st.Peak, limit, outcomes)
	}
	// The backend sees no disconnect (the proxy reads the abandoned
	// answers to their end); the lane counts the calls whose callers left.
	u := srv.Limiter().Snapshot().Lanes[0].Upstream
	if u == nil || u.Canceled == 0 || outcomes["200"] == 0 {
		t.Fatalf("want some calls abandoned at the gateway and some served: lane %+v, outcomes %v", u, outcomes)
	}
	t.Logf("backend peak %d, %d received, %d completed; lane: %d ok, %d abandoned by their callers; outcomes %v",
		st.Peak, st.Received, st.Completed, u.OK, u.Canceled, outcomes)
}

// LiteLLM's max_parallel_requests below the lane's limit: its 429
// (retry-after 49.9 s, to the next minute) holds the lane's grants only
// until one of the lane's calls in flight ends, not for the minute. The
// snapshot and the classification say the gateway's limit is below the
// lane's.
func TestLiteLLMConcurrency429HoldsUntilACallEnds(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 7, 9, 0, 10, 65_561_000, time.UTC)) // 49.934439 s to the next minute
	c := gatewaysim.Config{Capacity: 8, TokenTime: 50 * time.Millisecond, Tokens: 4, FirstTokenDelay: 10 * time.Millisecond,
		LiteLLM: &gatewaysim.LiteLLM{MaxParallel: 2}, Seed: 1}
	srv, sim, url := liteProxy(t, c, "{max_inflight: 6, interactive_reserve: 0}", "", Options{Clock: clock})
	sim.SetClock(clock.Now)

	codes := make(chan int, 3)
	for range 3 {
		go func() {
			code, _ := postJSON(t, url, chatBody("abcd", 4))
			codes <- code
		}()
	}
	got429 := false
	for range 3 {
		if <-codes == http.StatusTooManyRequests {
			got429 = true
			break
		}
	}
	if !got429 {
		t.Fatalf("no call refused by max_parallel_requests: %+v", sim.Stats())
	}
	l := srv.Limiter().Snapshot().Lanes[0]
	p := l.Tokens.Provider
	if p == nil || p.Concurrency == nil || p.Concurrency.InflightAt429 != 3 || p.RetryAfter != 0 {
		t.Fatalf("provider %+v, want a concurrency 429 at 3 in flight and no rate-limit hold", p)
	}
	// A call sent now waits for one of the two in flight (about 250 ms),
	// not for the 49.9 s of the Retry-After (the fake clock does not move).
	start := time.Now()
	if code, body := postJSON(t, url, chatBody("abcd", 4)); code != 200 {
		t.Fatalf("call after the 429: %d %s", code, body)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the call after the 429 took %s", d)
	}
	for range 2 {
		<-codes
	}
	cl := classify.Lane(srv.Limiter().Snapshot().Lanes[0], classify.DefaultThresholds())
	if !slices.Contains(cl.Reasons, classify.ReasonGatewayConcurrency) || cl.Counts.InflightAt429 != 3 {
		t.Fatalf("classification %s %v %q, want the gateway_concurrency reason", cl.State, cl.Reasons, cl.HoldText)
	}
}

// LiteLLM announces its tpm (x-ratelimit-limit-tokens) but counts what
// calls used, so it serves a call estimated above it. As a gateway's
// headers (the default), the announcement refuses nothing; as a
// provider's own (headers: provider), a call estimated above it is refused
// for one provider window after it was last heard, and no longer.
func TestLiteLLMAnnouncedTPM(t *testing.T) {
	c := gatewaysim.Config{Capacity: 8, TokenTime: time.Millisecond, Tokens: 4, LiteLLM: &gatewaysim.LiteLLM{TPM: 100_000}, Seed: 1}
	open := `{"model":"m","messages":[{"role":"user","content":"no max_tokens: estimated at the prompt and 1,024"}]}`
	t.Run("gateway", func(t *testing.T) {
		c := c
		c.LiteLLM = &gatewaysim.LiteLLM{TPM: 1000}
		srv, _, url := liteProxy(t, c, "{max_inflight: 4}", "", Options{})
		for i := range 3 {
			if code, body := postJSON(t, url, open); code != 200 {
				t.Fatalf("call %d: %d %s, want 200 (LiteLLM serves it)", i, code, body)
			}
		}
		if p := srv.Limiter().Snapshot().Lanes[0].Tokens.Provider; p == nil || p.TokenLimit != nil || p.Tokens == nil || p.Tokens.Limit != 1000 {
			t.Fatalf("provider %+v, want the tokens budget announced and no limit that refuses", p)
		}
	})
	t.Run("provider", func(t *testing.T) {
		clock := limitertest.NewClock(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
		c := c
		c.LiteLLM = &gatewaysim.LiteLLM{TPM: 1000}
		srv, sim, url := liteProxy(t, c, "{max_inflight: 4}", ", headers: provider", Options{Clock: clock})
		sim.SetClock(clock.Now)
		if code, body := postJSON(t, url, chatBody("abcd", 10)); code != 200 {
			t.Fatalf("first call: %d %s", code, body)
		}
		if code, body := postJSON(t, url, open); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "provider") {
			t.Fatalf("a call estimated above the announced 1,000: %d %s, want 413 naming the provider's limit", code, body)
		}
		if p := srv.Limiter().Snapshot().Lanes[0].Tokens.Provider; p == nil || p.TokenLimit == nil || p.TokenLimit.Limit != 1000 || p.TokenLimit.Binds != 60 {
			t.Fatalf("provider %+v, want the limit of 1,000 binding 60 s", p)
		}
		clock.Advance(limiter.DefaultProviderWindow)
		if code, body := postJSON(t, url, open); code != 200 {
			t.Fatalf("past the window: %d %s, want 200", code, body)
		}
	})
}
