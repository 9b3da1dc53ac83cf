package sharedlane

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// Two lanes-exporter processes share a lane's tokens_per_minute in a real
// redis-server, against a gateway that limits tokens as OpenAI does, at the
// same 6,000 a minute. Every call is estimated at 1,004 tokens (4 of prompt
// and its max_tokens, 1,000), so the budget has room for five at once, and
// the slots (16) for more: the budget is what bounds them. Counted at the
// gateway: never more than five calls at once, though each process alone
// would send five, and no 429.
func TestTokenBudgetAcrossProcesses(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	sim, post := tokenExporters(t, "{max_inflight: 16, queue_timeout: 120s, interactive_reserve: 0, tokens_per_minute: 6000}")
	postAll(t, post, 0, 20)
	st := sim.Stats()
	if st.Completed != 20 || st.RateLimited != 0 || st.Peak > 5 {
		t.Fatalf("gateway: %d completed, %d 429s, at most %d at once; want 20, none, at most 5 (the shared budget's room)", st.Completed, st.RateLimited, st.Peak)
	}
	t.Logf("gateway: peak %d at once, %d tokens used", st.Peak, st.TokensUsed)
}

// Two lanes-exporter processes share a lane with no budget configured, in
// a real redis-server, against a gateway that limits tokens as OpenAI does
// (6,000 a minute) and says so in x-ratelimit-*-tokens on every answer.
// Every call is estimated at 1,004 tokens and the gateway reserves 1,001
// of them until it ends, so five fit at once, and the slots (16) would
// send more. After one call (the lane's first answer: before it nothing
// is known), 20 calls through both processes: what any process's answers
// say binds both, so the gateway answers no 429 and never holds more than
// five.
func TestProviderHeadersAcrossProcesses(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	sim, post := tokenExporters(t, "{max_inflight: 16, queue_timeout: 120s, interactive_reserve: 0}")
	if err := post(0); err != nil {
		t.Fatalf("first call: %v", err)
	}
	postAll(t, post, 1, 21)
	st := sim.Stats()
	if st.Completed != 21 || st.RateLimited != 0 || st.Peak > 5 {
		t.Fatalf("gateway: %d completed, %d 429s, at most %d at once; want 21, none, at most 5 (the provider's room)", st.Completed, st.RateLimited, st.Peak)
	}
	t.Logf("gateway: peak %d at once, %d tokens used", st.Peak, st.TokensUsed)
}

// tokenExporters runs two lanes-exporter processes sharing a lane in a
// real redis-server, with the limiter settings limiter (a YAML flow
// mapping), in front of a gateway that limits tokens as OpenAI does, at
// 6,000 a minute; post sends the i-th call through process i%2 (each
// estimated at 1,004 tokens: 4 of prompt and its max_tokens, 1,000). Their
// lease_ttl is 5 s, not the default 15 s: the lane grants nothing for one
// lease_ttl after Redis starts, and Redis calls time out after a third
// of it, which a loaded machine must not reach.
func tokenExporters(t *testing.T, limiter string) (sim *gatewaysim.Gateway, post func(i int) error) {
	r := startRedis(t)
	sim = gatewaysim.New(gatewaysim.Config{Capacity: 100, TokenTime: 20 * time.Millisecond, Tokens: 10, TokensPerMinute: 6000, Seed: 1})
	gw := httptest.NewServer(sim)
	t.Cleanup(func() { sim.Close(); gw.Close() })
	var procs []*exporterProc
	for _, name := range []string{"p1", "p2"} {
		addr := freeAddr(t)
		procs = append(procs, runExporter(t, name, addr, fmt.Sprintf(`listen: %s
limiter: %s
upstreams: [{name: gw, base_url: "%s/v1"}]
shared: {redis_url: "%s", process: %s, lease_ttl: 5s}
`, addr, limiter, gw.URL, r.URL(), name)))
	}
	return sim, func(i int) error {
		res, err := client.Post("http://"+procs[i%2].addr+"/proxy/gw/chat/completions", "application/json",
			strings.NewReader(`{"model":"protolabs/smart","messages":[{"role":"user","content":"abcd"}],"max_tokens":1000}`))
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("%d %s", res.StatusCode, b)
		}
		return nil
	}
}

// postAll sends calls from to to-1 at once, and fails t for each that
// does not end in a 200.
func postAll(t *testing.T, post func(int) error, from, to int) {
	var wg sync.WaitGroup
	for i := from; i < to; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := post(i); err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
}
