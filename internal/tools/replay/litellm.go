package replay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// LiteLLMRun is one run of the LiteLLM replay (RunLiteLLM): the incident's
// shape through lanes-exporter in front of a LiteLLM-like gateway, with
// SDK-like callers whose timeout is shorter than a call under load.
type LiteLLMRun struct {
	Name string
	// Peak is the most calls the backend had at work at once.
	Peak int
	// Generated is the backend's work (tokens); Wasted what of it no
	// caller received whole (its caller had given up).
	Generated, Wasted int64
	// Completed and Calls count the logical calls by class; Attempts,
	// Retries and AttemptTimeouts the SDK's attempts, its retries and the
	// attempts that timed out.
	Completed, Calls                   map[string]int
	Attempts, Retries, AttemptTimeouts int
	// The load, for the report's text: a call's length alone, the SDK's
	// timeout, how long the run took (all simulated), the backend, the
	// lane's limit, the callers and the SDK's retries.
	IdleCall, ClientTimeout, Duration time.Duration
	Backend                           string
	Limit, Callers, Retried           int
}

// The LiteLLM replay's load, in simulated time: 28 callers at once (7
// interactive, 21 bulk), one call each, streamed, through an SDK-like
// client whose attempt times out after 8 s and retries twice (0.5 s, then
// 1 s), against a backend of capacity 4 (a call alone takes 6 s: 1 s to
// the first of 10 tokens of 0.5 s) behind a LiteLLM-like proxy that does
// not stop the backend's work when its client goes.
const (
	liteCallers    = 28
	liteCapacity   = 4
	liteTimeout    = 8 * time.Second
	liteRetries    = 2
	liteTokens     = 10
	liteTokenTime  = 500 * time.Millisecond
	liteFirstToken = time.Second
)

// RunLiteLLM replays the load above three ways, over real HTTP at scale:
// with no lane, through lanes-exporter whose upstream is configured as one
// that stops the work when its client goes (cancel_propagates: true: a
// caller's slot is freed as it leaves), and through lanes-exporter at its
// defaults (the slot held until the backend's answer ends).
func RunLiteLLM(ctx context.Context, scale float64) ([]LiteLLMRun, error) {
	var out []LiteLLMRun
	for _, v := range []struct {
		name  string
		lanes bool
		opts  string
	}{
		{"no lane", false, ""},
		{"lanes, cancel_propagates: true", true, ", cancel_propagates: true"},
		{"lanes (the defaults)", true, ""},
	} {
		r, err := runLiteLLM(ctx, scale, v.name, v.lanes, v.opts)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runLiteLLM(ctx context.Context, scale float64, name string, lanes bool, opts string) (LiteLLMRun, error) {
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	r := LiteLLMRun{Name: name, Completed: map[string]int{}, Calls: map[string]int{}, Backend: fmt.Sprintf("capacity %d", liteCapacity),
		IdleCall: liteFirstToken + liteTokens*liteTokenTime, ClientTimeout: liteTimeout,
		Limit: liteCapacity, Callers: liteCallers, Retried: liteRetries}
	sim := gatewaysim.New(gatewaysim.Config{Capacity: liteCapacity, TokenTime: scaled(liteTokenTime), Tokens: liteTokens,
		FirstTokenDelay: scaled(liteFirstToken), LiteLLM: &gatewaysim.LiteLLM{}, Seed: 1}) // no max_parallel_requests: the backend's own load shows
	simSrv := httptest.NewServer(sim)
	defer simSrv.Close()
	defer sim.Close()
	url := simSrv.URL + "/v1/chat/completions"
	if lanes {
		cfg, err := exporter.ParseConfig("litellm-replay.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: %d, interactive_reserve: 1, queue_timeout: 300s}
upstreams: [{name: litellm, base_url: "%s/v1"%s}]
`, liteCapacity, simSrv.URL, opts)))
		if err != nil {
			return r, err
		}
		srv, err := exporter.New(cfg, exporter.Options{Clock: scaledClock{start: time.Now(), scale: scale},
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return r, err
		}
		defer srv.Shutdown(context.Background())
		front := httptest.NewServer(srv.Handler())
		defer front.Close()
		url = front.URL + "/proxy/litellm/chat/completions"
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * liteCallers}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range liteCallers {
		class := callerClass(i)
		r.Calls[class]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempt := 0; attempt <= liteRetries; attempt++ {
				if attempt > 0 && !sleepCtx(ctx, scaled(500*time.Millisecond<<(attempt-1))) {
					return
				}
				done, retry, timedOut := liteAttempt(ctx, client, url, class, attempt, scaled(liteTimeout))
				mu.Lock()
				r.Attempts++
				if attempt > 0 {
					r.Retries++
				}
				if timedOut {
					r.AttemptTimeouts++
				}
				if done {
					r.Completed[class]++
				}
				mu.Unlock()
				if done || !retry {
					return
				}
			}
		}()
	}
	wg.Wait()
	for deadline := time.Now().Add(scaled(10 * time.Minute)); sim.Stats().Active > 0 && time.Now().Before(deadline); {
		time.Sleep(scaled(100 * time.Millisecond))
	}
	r.Duration = time.Duration(float64(time.Since(start)) / scale)
	st := sim.Stats()
	done := 0
	for _, n := range r.Completed {
		done += n
	}
	r.Peak, r.Generated = st.Peak, st.TokensGenerated
	r.Wasted = st.TokensGenerated - int64(done)*liteTokens
	return r, ctx.Err()
}

// callerClass is the class of caller i of the LiteLLM and deadline
// replays: a quarter interactive, the rest bulk.
func callerClass(i int) string {
	if i%4 == 0 {
		return "interactive"
	}
	return "bulk"
}

// liteAttempt makes one attempt of a streamed call with the SDK's
// timeout, and says whether it completed, whether the SDK would retry it,
// and whether it timed out.
func liteAttempt(ctx context.Context, client *http.Client, url, class string, attempt int, timeout time.Duration) (done, retry, timedOut bool) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(actx, http.MethodPost, url, strings.NewReader(`{"model":"backend-model","stream":true,"messages":[{"role":"user","content":"review"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-LLM-Priority", class)
	req.Header.Set("X-Stainless-Retry-Count", fmt.Sprint(attempt))
	res, err := client.Do(req)
	if err != nil {
		return false, ctx.Err() == nil, actx.Err() != nil
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, res.Body)
		return false, res.Header.Get("X-Should-Retry") != "false", false
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			return true, false, false
		}
	}
	return false, ctx.Err() == nil, actx.Err() != nil
}

// liteTable writes the LiteLLM replay's runs side by side.
func liteTable(w io.Writer, runs []LiteLLMRun) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("| | %s |\n|---|%s\n", strings.Join(names(runs), " | "), strings.Repeat("---|", len(runs)))
	row := func(label string, f func(r LiteLLMRun) string) {
		var cells []string
		for _, r := range runs {
			cells = append(cells, f(r))
		}
		p("| %s | %s |\n", label, strings.Join(cells, " | "))
	}
	row("backend's peak calls at work", func(r LiteLLMRun) string { return fmt.Sprint(r.Peak) })
	row("backend work (tokens)", func(r LiteLLMRun) string { return fmt.Sprint(r.Generated) })
	row("wasted on callers gone", func(r LiteLLMRun) string {
		return fmt.Sprintf("%d (%.0f%%)", r.Wasted, 100*float64(r.Wasted)/float64(max(1, r.Generated)))
	})
	for _, c := range []string{"interactive", "bulk"} {
		row(c+" calls completed", func(r LiteLLMRun) string { return fmt.Sprintf("%d of %d", r.Completed[c], r.Calls[c]) })
	}
	row("SDK attempts / retries", func(r LiteLLMRun) string { return fmt.Sprintf("%d / %d", r.Attempts, r.Retries) })
	row("attempts timed out", func(r LiteLLMRun) string { return fmt.Sprint(r.AttemptTimeouts) })
	row("duration (simulated)", func(r LiteLLMRun) string { return fmt.Sprintf("%.0f s", r.Duration.Seconds()) })
}

func names(runs []LiteLLMRun) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Name)
	}
	return out
}

const mdLiteLLM = `The incident's shape in front of a LiteLLM-like gateway (gatewaysim's LiteLLM profile,
modelled on LiteLLM's docs and source: it does not stop its backend's work when its client
goes), over real HTTP on loopback: %d callers at once (a quarter interactive, the rest bulk),
one streamed call each, through an SDK-like client whose attempt times out after %.0f s and
retries %d times; a backend of %s, where a call alone takes %.0f s. Through lanes-exporter
the lane's limit is the backend's capacity (%d), one slot reserved. The callers' timeout
includes the queue wait (the proxy cannot stop a client's timer), so many give up while
queued or while their call is at work; what the lane does with a call whose caller left is
the difference between the last two columns: freeing its slot at once sends the next call on
top of work the backend is still doing.

`
