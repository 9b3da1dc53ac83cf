package replay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/sharedlane"
)

// Fidelity is how far the machine bent a RunHTTP: the largest lateness of
// a timer, in simulated time, seen by a probe that ran beside the replay.
// A run is Faithful when that lag stayed under the model's smallest
// interval (the first retry's backoff), below which no ordering the
// report depends on can change.
type Fidelity struct {
	Scale    float64
	MaxLag   time.Duration // simulated
	Bound    time.Duration // simulated
	Faithful bool
}

func (f Fidelity) String() string {
	verdict := "faithful"
	if !f.Faithful {
		verdict = "NOT faithful: the machine was too loaded for this scale; use a larger -scale"
	}
	return fmt.Sprintf("scale %g, largest scheduling lag %.2f simulated s (bound %.2f s): %s", f.Scale, f.MaxLag.Seconds(), f.Bound.Seconds(), verdict)
}

// scaledClock is a limiter.Clock whose time runs 1/scale times as fast as
// the real one, so that a limiter's 300 s queue timeout and 60 s aging
// happen within a scaled run.
type scaledClock struct {
	start time.Time
	scale float64
}

func (c scaledClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) / c.scale))
}

func (c scaledClock) AfterFunc(d time.Duration, f func()) limiter.Timer {
	return time.AfterFunc(time.Duration(float64(d)*c.scale), f)
}

// httpRun is one RunHTTP.
type httpRun struct {
	o       Options
	scale   float64
	start   time.Time
	clients []*http.Client // by agent
	lims    []*limiter.Limiter
	url     string
	lanes   bool
	// wall is set when the limiters run on the real clock with their
	// durations scaled (a shared lane: Redis' clock cannot be scaled), so
	// their waits are real time.
	wall   bool
	mu     sync.Mutex
	r      *Report
	panels []panel
}

// observe records the waits of the limiters' acquisitions.
func (x *httpRun) observe(_ context.Context, e limiter.Event) {
	if e.Kind != limiter.Acquired && e.Kind != limiter.TimedOut {
		return
	}
	w := e.Wait
	if x.wall {
		w = time.Duration(float64(w) / x.scale)
	}
	x.mu.Lock()
	c := x.r.Classes[classOf(e.Priority)]
	c.waits = append(c.waits, w)
	x.r.Grants = append(x.r.Grants, Grant{Class: classOf(e.Priority), Ended: x.now(), Granted: e.Kind == limiter.Acquired})
	x.mu.Unlock()
}

func (x *httpRun) real(d time.Duration) time.Duration { return time.Duration(float64(d) * x.scale) }
func (x *httpRun) now() time.Duration                 { return time.Duration(float64(time.Since(x.start)) / x.scale) }

// RunHTTP replays scenario (one of Scenarios) as Run does, but for real:
// SDK-like HTTP clients on loopback, through lanehttp.Transport for
// "lanes", against gatewaysim, with every duration multiplied by scale
// (0.01 turns the 120 s timeout into 1.2 s), the limiter on a clock scaled
// the same way. The report carries no classification; Fidelity says
// whether the machine kept up. One agent, no fault.
func RunHTTP(ctx context.Context, scenario string, o Options, scale float64) (Report, Fidelity, error) {
	x := &httpRun{o: o, scale: scale, r: newReport(scenario, o)}
	cfg := gatewaysim.Config{Capacity: o.Capacity, TokenTime: x.real(o.TokenTime), Tokens: o.Tokens, FirstTokenDelay: x.real(o.FirstTokenDelay), Seed: o.Seed}
	base := &http.Transport{MaxIdleConnsPerHost: 512}
	defer base.CloseIdleConnections()
	var rt http.RoundTripper = base
	switch scenario {
	case "no-limiter":
	case "gateway-429":
		cfg.RejectAbove = o.Limit
	case "lanes":
		lim, err := limiter.New(limiter.Config{MaxInflight: o.Limit, InteractiveReserve: o.Reserve, QueueTimeout: o.QueueTimeout},
			limiter.WithClock(scaledClock{start: time.Now(), scale: scale}), limiter.WithObserver(x.observe))
		if err != nil {
			return Report{}, Fidelity{}, err
		}
		// The timeouts start once the slot is held (docs/DESIGN.md, "The caller's deadline"); the
		// transport runs them on the limiter's clock, in simulated time.
		rt = &lanehttp.Transport{Limiter: lim, Base: base, ResponseHeaderTimeout: o.RequestTimeout, StallTimeout: o.RequestTimeout}
		x.lims, x.lanes = []*limiter.Limiter{lim}, true
	default:
		return Report{}, Fidelity{}, fmt.Errorf("replay: unknown scenario %q (want one of %s)", scenario, strings.Join(Scenarios, ", "))
	}
	x.clients = []*http.Client{{Transport: rt}}
	o.Agents = 1
	x.o = o
	return x.run(ctx, cfg)
}

// RunShared replays the agents of o (TwoProcesses) over real HTTP, each
// with its own limiter, every limiter on a sharedlane backend in the Redis
// at redisURL: one lane of SharedLimit slots shared through Redis rather
// than through one exporter. Redis' clock cannot be scaled, so the
// limiters run on the real clock with their durations scaled (queue
// timeout, aging step, transport timeouts); the lease TTL is 1 s.
func RunShared(ctx context.Context, o Options, scale float64, redisURL string) (Report, Fidelity, error) {
	x := &httpRun{o: o, scale: scale, r: newReport("lanes shared in Redis", o), wall: true, lanes: true}
	cfg := gatewaysim.Config{Capacity: o.Capacity, TokenTime: x.real(o.TokenTime), Tokens: o.Tokens, FirstTokenDelay: x.real(o.FirstTokenDelay), Seed: o.Seed}
	base := &http.Transport{MaxIdleConnsPerHost: 512}
	defer base.CloseIdleConnections()
	prefix := fmt.Sprintf("replay%d", time.Now().UnixNano()) // one lane for every agent, new for each run
	for a := range o.Agents {
		b, err := sharedlane.New(sharedlane.Config{URL: redisURL, KeyPrefix: prefix, Process: fmt.Sprintf("agent-%c", 'a'+a),
			LeaseTTL: time.Second, AgingStep: x.real(time.Minute), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return Report{}, Fidelity{}, err
		}
		defer b.Close()
		lim, err := limiter.New(limiter.Config{MaxInflight: o.SharedLimit, InteractiveReserve: o.SharedReserve, QueueTimeout: x.real(o.QueueTimeout)},
			limiter.WithBackend(b), limiter.WithObserver(x.observe))
		if err != nil {
			return Report{}, Fidelity{}, err
		}
		x.lims = append(x.lims, lim)
		x.clients = append(x.clients, &http.Client{Transport: &lanehttp.Transport{Limiter: lim, Base: base,
			ResponseHeaderTimeout: x.real(o.RequestTimeout), StallTimeout: x.real(o.RequestTimeout)}})
	}
	return x.run(ctx, cfg)
}

// run runs the load of every agent against gatewaysim with cfg, and
// reports it.
func (x *httpRun) run(ctx context.Context, cfg gatewaysim.Config) (Report, Fidelity, error) {
	o, scale := x.o, x.scale
	fid := Fidelity{Scale: scale, Bound: o.Backoff}
	sim := gatewaysim.New(cfg)
	srv := httptest.NewServer(sim)
	defer srv.Close()
	defer sim.Close()
	x.url = srv.URL + "/v1/chat/completions"
	x.r.IdleTTFT = idleTTFT(gatewaysim.Config{Capacity: o.Capacity, TokenTime: o.TokenTime, Tokens: o.Tokens, FirstTokenDelay: o.FirstTokenDelay})

	x.start = time.Now()
	x.panels = make([]panel, o.Agents*o.Panels)
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			t0 := time.Now()
			select {
			case <-stop:
				return
			case <-time.After(x.real(time.Second)):
			}
			lag := time.Duration(float64(time.Since(t0)-x.real(time.Second)) / scale)
			x.mu.Lock()
			fid.MaxLag = max(fid.MaxLag, lag)
			x.mu.Unlock()
		}
	}()
	// The timeline.
	bg.Add(1)
	go func() {
		defer bg.Done()
		t := time.NewTicker(x.real(o.PollEvery))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			s := Sample{At: x.now(), Gateway: sim.Stats().Active}
			if len(x.lims) > 0 { // a shared lane's snapshot has the global queue
				for _, l := range x.lims[0].Snapshot().Lanes {
					s.Queued = l.QueuedByPriority
				}
			}
			x.mu.Lock()
			x.r.Samples = append(x.r.Samples, s)
			x.mu.Unlock()
		}
	}()

	var wg sync.WaitGroup
	sleep := func(d time.Duration) bool {
		select {
		case <-time.After(x.real(d)):
			return true
		case <-ctx.Done():
			return false
		}
	}
	launch := func(agent int, class string, p int) {
		wg.Add(1)
		go func() { defer wg.Done(); x.call(ctx, agent, class, p) }()
	}
	for a := range o.Agents {
		wg.Add(2 + o.Panels)
		go func() { // the operator
			defer wg.Done()
			for x.now() < o.Duration && ctx.Err() == nil {
				x.call(ctx, a, "interactive", -1)
				if !sleep(o.ChatEvery) {
					return
				}
			}
		}()
		go func() { // the coders
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(a)))
			for x.now() < o.Duration && ctx.Err() == nil {
				launch(a, "default", -1)
				if !sleep(time.Duration(float64(o.CoderEvery) * (0.5 + rng.Float64()))) {
					return
				}
			}
		}()
		for p := range o.Panels {
			i := a*o.Panels + p
			x.panels[i].left = o.PanelSize
			go func() {
				defer wg.Done()
				if !sleep(time.Duration(p) * o.PanelEvery) {
					return
				}
				for range o.PanelSize {
					launch(a, "bulk", i)
				}
			}()
		}
	}
	wg.Wait()
	// Let abandoned work the gateway still does finish, so it is counted.
	for deadline := time.Now().Add(x.real(10 * time.Minute)); sim.Stats().Active > 0 && time.Now().Before(deadline); {
		time.Sleep(x.real(time.Second))
	}
	close(stop)
	bg.Wait()
	x.r.finish(x.panels, sim.Stats())
	fid.Faithful = fid.MaxLag < fid.Bound
	return *x.r, fid, ctx.Err()
}

func classOf(p limiter.Priority) string {
	switch p {
	case limiter.Interactive:
		return "interactive"
	case limiter.Bulk:
		return "bulk"
	}
	return "default"
}

// call makes one logical call of class (for panel p, or -1) with the SDK's
// attempts, and records how it ended.
func (x *httpRun) call(ctx context.Context, agent int, class string, p int) {
	start := x.now()
	x.mu.Lock()
	x.r.Classes[class].Calls++
	x.mu.Unlock()
	prio := map[string]limiter.Priority{"interactive": limiter.Interactive, "default": limiter.Default, "bulk": limiter.Bulk}[class]
	cctx := limiter.WithPriority(ctx, prio)
	ok, first, reason, sent := false, time.Duration(0), "", false
	for attempt := 0; attempt <= x.o.Retries && !ok; attempt++ {
		if attempt > 0 {
			x.mu.Lock()
			x.r.Retries++
			x.mu.Unlock()
			if !sleepCtx(ctx, x.real(x.o.Backoff<<(attempt-1))) {
				return
			}
		}
		actx, cancel := cctx, context.CancelFunc(func() {})
		if !x.lanes { // the SDK's timeout bounds the whole attempt
			actx, cancel = context.WithTimeout(cctx, x.real(x.o.RequestTimeout))
		}
		req, _ := http.NewRequestWithContext(actx, http.MethodPost, x.url, strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
		req.Header.Set("X-Stainless-Retry-Count", fmt.Sprint(attempt))
		res, err := x.clients[agent].Do(req)
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return
			}
			reason, sent = "request timeout", true
			x.timeout()
			continue
		}
		if res.StatusCode != http.StatusOK {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			cancel()
			switch {
			case res.Header.Get("X-Should-Retry") == "false": // the lane's queue timeout
				reason = "queue timeout"
				attempt = x.o.Retries
			case res.StatusCode == http.StatusTooManyRequests:
				reason, sent = "429", true
			default:
				reason, sent = "5xx", true
			}
			continue
		}
		sent = true
		sc := bufio.NewScanner(res.Body)
		got := false
		for sc.Scan() {
			if !got && strings.HasPrefix(sc.Text(), "data: {") {
				got, first = true, x.now()-start
			}
			if sc.Text() == "data: [DONE]" {
				ok = true
			}
		}
		res.Body.Close()
		cancel()
		if !ok && ctx.Err() == nil {
			reason = "request timeout" // the stream broke off or stalled
			x.timeout()
		}
	}
	if ctx.Err() != nil && !ok {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	c := x.r.Classes[class]
	if !ok {
		c.Failed[reason]++
		if reason == "queue timeout" && !sent {
			x.r.FastFails++
		} else {
			x.r.FailedAfterGateway++
		}
		if p >= 0 {
			x.panels[p].lose(reason)
		}
		return
	}
	c.Completed++
	c.ttfts = append(c.ttfts, first)
	if class == "interactive" {
		x.r.Chats = append(x.r.Chats, Point{start, first.Seconds()})
	}
	if p >= 0 {
		x.panels[p].left--
		x.panels[p].finished = max(x.panels[p].finished, x.now())
	}
}

func (x *httpRun) timeout() {
	x.mu.Lock()
	x.r.RequestTimeouts++
	x.mu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
