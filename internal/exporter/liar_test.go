package exporter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// liarRun is one run of the lying-tenant scenario: what the gateway saw and
// what the honest tenants completed.
type liarRun struct {
	busiest60s    int64 // the most tokens the gateway served in any 60 s
	honestDone    int   // honest calls answered 200
	honestSent    int
	liarDone      int
	gatewayTokens int64
}

// runLiar drives, on the fake clock, 90 s of two honest tenants each
// sending a call of 300 tokens every honestEvery (a prompt of about 20
// and max_tokens 300; each uses 300), and, unless liar is "", a tenant
// sending a call every second that asks max_tokens 1 and uses 50,000
// (named liar, or liar plus a new number per call when rotate is set),
// through a lane of tokens_per_minute 60,000. The gateway answers at once
// and counts each call's usage at its arrival.
func runLiar(t *testing.T, liar string, rotate bool, honestEvery time.Duration) liarRun {
	t.Helper()
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	type served struct {
		at     time.Time
		tokens int64
	}
	var mu sync.Mutex
	var seen []served
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		prompt, completion := int64(20), int64(280)
		if strings.Contains(string(b), "LIAR") {
			prompt, completion = 10, 49_990
		}
		mu.Lock()
		seen = append(seen, served{clock.Now(), prompt + completion})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion)
	}))
	t.Cleanup(gw.Close)
	srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 8, tokens_per_minute: 60000}\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", gw.URL), Options{Clock: clock})
	front := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); front.Close(); srv.Shutdown(context.Background()) })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	var run liarRun
	var launched, done, honestDone, liarDone atomic.Int64
	send := func(tenant, content string, maxTokens int, honest bool) {
		launched.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done.Add(1)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/proxy/gw/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, content, maxTokens)))
			req.Header.Set(TenantHeader, tenant)
			res, err := client.Do(req)
			if err != nil {
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == 200 {
				if honest {
					honestDone.Add(1)
				} else {
					liarDone.Add(1)
				}
			}
		}()
	}
	// settle waits until every call sent is answered or queued.
	settle := func() {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			var queued, inflight int
			if ls := srv.Limiter().Snapshot().Lanes; len(ls) > 0 {
				queued, inflight = ls[0].Queued, ls[0].Inflight
			}
			if launched.Load()-done.Load() == int64(queued) && inflight == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("calls neither answered nor queued: %d sent, %d done, %d queued, %d in flight", launched.Load(), done.Load(), queued, inflight)
			}
		}
	}
	const step = 50 * time.Millisecond
	// The liar starts once both honest tenants have been served a call: a
	// tenant's first call is a newcomer's, estimated by what the lane has
	// learned of newcomers, and a newcomer that comes after a lie waits for
	// the room the lie would need (TestProxyNewcomerAfterLiar).
	const liarFrom = 2 * time.Second
	words := strings.Repeat("word ", 16) // about 20 tokens of prompt
	for i := range int(90 * time.Second / step) {
		at := time.Duration(i) * step
		if at%honestEvery == 0 {
			send("board-a", words, 300, true)
			run.honestSent++
		}
		if (at+honestEvery/2)%honestEvery == 0 {
			send("board-b", words, 300, true)
			run.honestSent++
		}
		if liar != "" && at >= liarFrom && at%time.Second == 0 {
			name := liar
			if rotate {
				name = fmt.Sprintf("%s-%d", liar, i)
			}
			send(name, "LIAR", 1, false)
		}
		settle()
		clock.Advance(step)
	}
	settle()
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seen {
		var sum int64
		for _, o := range seen[i:] {
			if o.at.Sub(s.at) < time.Minute {
				sum += o.tokens
			}
		}
		run.busiest60s = max(run.busiest60s, sum)
		run.gatewayTokens += s.tokens
	}
	run.honestDone, run.liarDone = int(honestDone.Load()), int(liarDone.Load())
	return run
}

// A tenant whose calls say max_tokens 1 and use 50,000 tokens each used to
// take a 60,000-token lane's budget 2.5 times over, and the honest tenants
// waited behind it. Its estimates now learn its own error: after its first
// call, each of its calls is estimated at what it uses, and, while the
// budget has no room for that, does not hold the line. On the fake clock,
// so every run gives the same figures:
//
//   - honest tenants asking 40 % of the budget (a call of 300 tokens each
//     every 1.5 s): the gateway's busiest 60 s within 1.25 times the
//     budget, and the honest tenants complete every call;
//   - asking 20 % (every 3 s): the honest tenants complete every call, and
//     the gateway serves no more in 90 s than a full budget, 90 s of its
//     refill and the liar's first, unforeseen, call (the token bucket lets a
//     full minute's tokens and a minute's refill into one 60 s, so the
//     busiest 60 s holds the liar's first call and its next one).
//
// A liar that changes its name per call is caught the same way: its every
// call is a newcomer's, estimated by the newcomers' record, which its first
// call taught (and served as one tenant, by the newcomers' mark). Both
// liars are run, with the same bounds.
func TestProxyLyingTenant(t *testing.T) {
	const budget = 60_000
	for _, c := range []struct {
		every      time.Duration
		busiest    float64 // the most of the budget the busiest 60 s may hold (0: not checked)
		total90s   int64
		wantHonest float64
	}{
		{1500 * time.Millisecond, 1.25, 0, 1},
		{3000 * time.Millisecond, 0, budget + 90*budget/60 + 50_000, 1},
	} {
		alone := runLiar(t, "", false, c.every)
		if alone.honestDone != alone.honestSent {
			t.Fatalf("every %s: without the liar the honest tenants completed %d of %d", c.every, alone.honestDone, alone.honestSent)
		}
		for _, rotate := range []bool{false, true} {
			r := runLiar(t, "liar", rotate, c.every)
			name := fmt.Sprintf("every %s, rotating %v", c.every, rotate)
			t.Logf("honest %s: without the liar %+v; with it %+v: busiest 60 s %.2fx the budget, honest %.0f %%", name, alone, r,
				float64(r.busiest60s)/budget, 100*float64(r.honestDone)/float64(alone.honestDone))
			if c.busiest > 0 && float64(r.busiest60s) > c.busiest*budget {
				t.Errorf("%s: the gateway's busiest 60 s held %d tokens, over %.2f × %d", name, r.busiest60s, c.busiest, budget)
			}
			if c.total90s > 0 && r.gatewayTokens > c.total90s {
				t.Errorf("%s: the gateway served %d tokens in 90 s, over %d", name, r.gatewayTokens, c.total90s)
			}
			if float64(r.honestDone) < c.wantHonest*float64(alone.honestDone) {
				t.Errorf("%s: the honest tenants completed %d calls, under %.0f %% of their %d without the liar", name, r.honestDone, 100*c.wantHonest, alone.honestDone)
			}
		}
	}
}
