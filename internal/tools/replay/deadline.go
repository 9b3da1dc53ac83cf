package replay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
)

// DeadlineRun is one run of the deadline replay (RunDeadlines): callers
// whose timeout is shorter than the wait, through the proxy.
type DeadlineRun struct {
	Name string
	// Completed, Typed and Calls count the logical calls by class: served,
	// answered with the lane's typed 503 (lane_deadline or a queue
	// timeout), and all.
	Completed, Typed, Calls map[string]int
	// Attempts and Retries count the SDK's attempts and retries;
	// RetriesAfterWait the retries of an attempt that timed out before it
	// reached the backend (caused by the wait).
	Attempts, Retries, RetriesAfterWait int
	// TimeoutsQueued and TimeoutsAtWork count the attempts that timed out
	// before they reached the backend, and after.
	TimeoutsQueued, TimeoutsAtWork int
	// LocalQueueAt is when the classification first said local_queue
	// (simulated, from the start; -1: never), with its reasons then.
	LocalQueueAt time.Duration
	Reasons      []string
	Duration     time.Duration
}

// EstimateError is how far the lane's estimate of a queued call's wait
// (its class's eta_s as the call arrived) was from the wait it had:
// |estimate - actual| at the 50th and 90th percentiles, over Samples
// queued calls of callers that wait as long as it takes (twice as many
// callers, arriving one every half second).
type EstimateError struct {
	P50, P90 time.Duration
	Samples  int
}

// The deadline replay's load, in simulated time: the incident's run tried
// from outside with openai-python (AsyncOpenAI, timeout 6 s, max_retries
// 2): 28 callers at once (7 interactive, 21 bulk), one whole (not
// streamed) call each, against a backend of capacity 4 where a call alone
// takes 3 s, behind lanes-exporter with max_inflight 4, reserve 1 and the
// ADR's 300 s queue timeout. openai-python is not installed here: the
// client is modelled on it (its read timeout, which for a whole answer
// runs to the answer's headers; its retries after 0.5 s and 1 s on a
// timeout or a 5xx not marked x-should-retry: false; the headers it
// sends).
const (
	dlCallers    = 28
	dlCapacity   = 4
	dlTimeout    = 6 * time.Second
	dlRetries    = 2
	dlTokens     = 10
	dlTokenTime  = 200 * time.Millisecond
	dlFirstToken = time.Second
)

// RunDeadlines replays the load three ways: with no lane; through
// lanes-exporter with callers that state no timeout (the proxy cannot
// know when they give up); and with callers that state it, as
// openai-python does (X-Stainless-Read-Timeout), at the defaults
// (deadline: answer_early). It also measures the lane's estimate of the
// wait against the wait, with callers that state no timeout and wait.
func RunDeadlines(ctx context.Context, scale float64) ([]DeadlineRun, EstimateError, error) {
	var out []DeadlineRun
	for _, v := range []struct {
		name         string
		lanes, state bool
	}{
		{"no lane", false, false},
		{"lanes, timeout not stated", true, false},
		{"lanes, timeout stated (the defaults)", true, true},
	} {
		r, _, err := runDeadline(ctx, scale, v.name, v.lanes, v.state, dlTimeout)
		if err != nil {
			return nil, EstimateError{}, err
		}
		out = append(out, r)
	}
	_, est, err := runDeadline(ctx, scale, "estimate", true, false, 0)
	return out, est, err
}

// dlRig is one run's gateway, proxy and what they saw.
type dlRig struct {
	srv     *exporter.Server
	url     string
	mu      sync.Mutex
	reached map[string]bool // attempts (by id) that reached the backend
}

func runDeadline(ctx context.Context, scale float64, name string, lanes, state bool, timeout time.Duration) (DeadlineRun, EstimateError, error) {
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	r := DeadlineRun{Name: name, Completed: map[string]int{}, Typed: map[string]int{}, Calls: map[string]int{}, LocalQueueAt: -1}
	sim := gatewaysim.New(gatewaysim.Config{Capacity: dlCapacity, TokenTime: scaled(dlTokenTime), Tokens: dlTokens,
		FirstTokenDelay: scaled(dlFirstToken), LiteLLM: &gatewaysim.LiteLLM{}, Seed: 1})
	defer sim.Close()
	rig := &dlRig{reached: map[string]bool{}}
	simSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rig.mu.Lock()
		rig.reached[req.Header.Get("X-Test-Attempt")] = true
		rig.mu.Unlock()
		sim.ServeHTTP(w, req)
	}))
	defer simSrv.Close()
	rig.url = simSrv.URL + "/v1/chat/completions"
	start := time.Now()
	if lanes {
		cfg, err := exporter.ParseConfig("deadline-replay.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: %d, interactive_reserve: 1, queue_timeout: 300s}
upstreams: [{name: litellm, base_url: "%s/v1"}]
`, dlCapacity, simSrv.URL)))
		if err != nil {
			return r, EstimateError{}, err
		}
		rig.srv, err = exporter.New(cfg, exporter.Options{Clock: scaledClock{start: start, scale: scale},
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return r, EstimateError{}, err
		}
		defer rig.srv.Shutdown(context.Background())
		front := httptest.NewServer(rig.srv.Handler())
		defer front.Close()
		rig.url = front.URL + "/proxy/litellm/chat/completions"
		stop := rig.watch(ctx, &r, start, scale)
		defer stop()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * dlCallers}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	var mu sync.Mutex
	var errs []time.Duration
	var wg sync.WaitGroup
	callers, every := dlCallers, time.Duration(0)
	if timeout == 0 {
		// The estimate's run: callers arrive one every half second, so that
		// the lane has grants to estimate from.
		callers, every = 2*dlCallers, scaled(500*time.Millisecond)
	}
	for i := range callers {
		if every > 0 && !sleepCtx(ctx, every) {
			break
		}
		class := callerClass(i)
		r.Calls[class]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			waited := false // the last attempt timed out before the backend
			for attempt := 0; attempt <= dlRetries; attempt++ {
				if attempt > 0 && !sleepCtx(ctx, scaled(500*time.Millisecond<<(attempt-1))) {
					return
				}
				id := fmt.Sprintf("%d-%d", i, attempt)
				eta := rig.eta(class)
				a := rig.attempt(ctx, client, id, class, attempt, scaled(timeout), state && timeout > 0)
				mu.Lock()
				r.Attempts++
				if attempt > 0 {
					r.Retries++
					if waited {
						r.RetriesAfterWait++
					}
				}
				waited = a.timedOut && !a.reached
				switch {
				case a.timedOut && a.reached:
					r.TimeoutsAtWork++
				case a.timedOut:
					r.TimeoutsQueued++
				}
				if a.done {
					r.Completed[class]++
				}
				if a.typed {
					r.Typed[class]++
				}
				if a.done && eta != nil && a.wait > 0 {
					errs = append(errs, (eta.Duration() - a.wait).Abs())
				}
				mu.Unlock()
				if a.done || !a.retry {
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
	return r, estimateError(errs), ctx.Err()
}

// watch polls the lane's classification every simulated half second and
// notes when it first says local_queue.
func (g *dlRig) watch(ctx context.Context, r *DeadlineRun, start time.Time, scale float64) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sleepCtx(ctx, time.Duration(float64(500*time.Millisecond)*scale)) {
			for _, l := range g.srv.Limiter().Snapshot().Lanes {
				if c := classify.Lane(l, classify.DefaultThresholds()); c.State == classify.LocalQueue && r.LocalQueueAt < 0 {
					r.LocalQueueAt = time.Duration(float64(time.Since(start)) / scale)
					r.Reasons = c.Reasons
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// eta is the lane's estimate of the wait for a call of class, as it
// would arrive now; nil with no lane or no estimate.
func (g *dlRig) eta(class string) *limiter.Seconds {
	if g.srv == nil {
		return nil
	}
	for _, l := range g.srv.Limiter().Snapshot().Lanes {
		if l.ETA != nil {
			return map[string]*limiter.Seconds{"interactive": l.ETA.Interactive, "default": l.ETA.Default, "bulk": l.ETA.Bulk}[class]
		}
	}
	return nil
}

// dlAttempt is how one attempt ended.
type dlAttempt struct {
	done, retry, timedOut, reached, typed bool
	wait                                  time.Duration // the lane's wait, from Server-Timing
}

// attempt makes one attempt of a whole call with the SDK's timeout (0:
// none), stating it as openai-python does when state is set.
func (g *dlRig) attempt(ctx context.Context, client *http.Client, id, class string, n int, timeout time.Duration, state bool) dlAttempt {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		actx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	req, _ := http.NewRequestWithContext(actx, http.MethodPost, g.url, strings.NewReader(`{"model":"backend-model","messages":[{"role":"user","content":"review"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-LLM-Priority", class)
	req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(n))
	req.Header.Set("X-Test-Attempt", id)
	if state {
		req.Header.Set("X-Stainless-Read-Timeout", strconv.FormatFloat(dlTimeout.Seconds(), 'f', 1, 64))
	}
	res, err := client.Do(req)
	g.mu.Lock()
	a := dlAttempt{reached: g.reached[id]}
	g.mu.Unlock()
	if err != nil {
		a.timedOut = actx.Err() != nil && ctx.Err() == nil
		a.retry = ctx.Err() == nil
		return a
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	a.wait = laneWait(res.Header)
	switch {
	case err != nil:
		a.timedOut, a.retry = actx.Err() != nil, ctx.Err() == nil
	case res.StatusCode == http.StatusOK:
		a.done = true
	default:
		a.typed = res.Header.Get("X-Should-Retry") == "false"
		a.retry = !a.typed && (res.StatusCode >= 500 || res.StatusCode == 429)
	}
	return a
}

// laneWait reads the lane's wait from Server-Timing ("lane;dur=<ms>").
func laneWait(h http.Header) time.Duration {
	v, ok := strings.CutPrefix(h.Get("Server-Timing"), "lane;dur=")
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, ";")
	ms, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func estimateError(errs []time.Duration) EstimateError {
	if len(errs) == 0 {
		return EstimateError{}
	}
	slices.Sort(errs)
	at := func(p float64) time.Duration { return errs[int(math.Ceil(p*float64(len(errs))))-1] }
	return EstimateError{P50: at(0.5), P90: at(0.9), Samples: len(errs)}
}

// deadlineTable writes the deadline replay's runs side by side, and the
// estimate's error.
func deadlineTable(w io.Writer, runs []DeadlineRun, est EstimateError) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var heads []string
	for _, r := range runs {
		heads = append(heads, r.Name)
	}
	p("| | %s |\n|---|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(runs)))
	row := func(label string, f func(r DeadlineRun) string) {
		var cells []string
		for _, r := range runs {
			cells = append(cells, f(r))
		}
		p("| %s | %s |\n", label, strings.Join(cells, " | "))
	}
	for _, c := range []string{"interactive", "bulk"} {
		row(c+" calls completed", func(r DeadlineRun) string { return fmt.Sprintf("%d of %d", r.Completed[c], r.Calls[c]) })
		row(c+" calls answered 503, not retried", func(r DeadlineRun) string { return fmt.Sprint(r.Typed[c]) })
	}
	row("SDK attempts / retries", func(r DeadlineRun) string { return fmt.Sprintf("%d / %d", r.Attempts, r.Retries) })
	row("retries caused by waiting", func(r DeadlineRun) string { return fmt.Sprint(r.RetriesAfterWait) })
	row("attempts timed out while queued", func(r DeadlineRun) string { return fmt.Sprint(r.TimeoutsQueued) })
	row("attempts timed out at the backend", func(r DeadlineRun) string { return fmt.Sprint(r.TimeoutsAtWork) })
	row("classification `local_queue` first at", func(r DeadlineRun) string {
		if r.LocalQueueAt < 0 {
			return "never"
		}
		return fmt.Sprintf("%.1f s (%s)", r.LocalQueueAt.Seconds(), strings.Join(r.Reasons, ", "))
	})
	row("duration (simulated)", func(r DeadlineRun) string { return fmt.Sprintf("%.0f s", r.Duration.Seconds()) })
	p("\nThe lane's estimate of a queued call's wait (its class's `eta_s` as it arrived) against the wait it had, callers waiting as long as it takes and arriving one every half second: off by %.1f s at the median and %.1f s at the 90th percentile, over %d queued calls.\n",
		est.P50.Seconds(), est.P90.Seconds(), est.Samples)
}

const mdDeadlines = `The run of "No caller times out while it waits", modelled: %d callers at once (a quarter
interactive, the rest bulk), one whole call each, through a client modelled on openai-python
(not installable here: its read timeout of %.0f s, which for a whole answer runs until the
answer's headers, and its %d retries after 0.5 s and 1 s on a timeout or a 5xx not marked
x-should-retry: false), against a backend of capacity %d behind a LiteLLM-like gateway, where
a call alone takes %.0f s. lanes-exporter at its defaults with max_inflight %d, reserve 1 and the
ADR's 300 s queue timeout. In the middle column the clients state no timeout, so the proxy
cannot know when they give up; in the last they send X-Stainless-Read-Timeout as openai-python
does, and the lane answers a call it cannot serve in time with a typed 503 (lane_deadline)
before the client's timer, at once when its estimate says so. A call granted late can still
time out at the backend: the deadline bounds the wait, not the call.

`
