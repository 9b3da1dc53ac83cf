// Package replay replays the #209 incident of ADR-0115 against the gateway
// simulator: three review panels of five bulk finders, a stream of coder
// calls and an operator's chat on one gateway lane that slows past its
// capacity, through three set-ups side by side:
//
//   - "no-limiter": clients as the SDKs behave (a 120 s request timeout,
//     2 retries with backoff), nothing bounding what is in flight;
//   - "lanes": the same clients through a lane below the gateway's
//     capacity with one slot reserved for interactive calls;
//   - "gateway-429": the gateway answers 429 at once above a limit
//     (LiteLLM-style), and the clients retry as the SDKs do.
//
// Time is scaled: Scale real seconds per simulated second (0.01 turns the
// 120 s timeout into 1.2 s). The gateway keeps working on abandoned
// requests, as one that does not propagate disconnects does, and counts
// that work as wasted.
package replay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// Scenarios, in report order.
var Scenarios = []string{"no-limiter", "lanes", "gateway-429"}

// Options shape a replay. Durations are simulated time.
type Options struct {
	Scale          float64       // real seconds per simulated second
	Duration       time.Duration // how long calls keep arriving
	Capacity       int           // the gateway's parallel capacity
	Limit          int           // the lane's max_inflight, and the gateway-side limit of gateway-429
	Tokens         int           // tokens per answer
	TokenTime      time.Duration // time per token at full speed
	RequestTimeout time.Duration // the SDK's request timeout (no-limiter, gateway-429)
	Retries        int           // SDK retries
	ChatEvery      time.Duration // an operator's think time between chat turns
	CoderEvery     time.Duration // a coder call
	Panels         int           // review panels, each of PanelSize bulk finders
	PanelSize      int
	PanelEvery     time.Duration // between the panels' starts
}

// Incident returns the incident's shape: a gateway of capacity 6 whose
// answers take 45 s when idle, 3 panels of 5 finders a minute apart,
// coder calls from two boards (one every 10 s) and an operator who sends a chat turn 15 s after
// each reply, for 10 minutes; 120 s timeouts and 2 retries; lanes of 5 with
// 1 reserved.
func Incident(scale float64) Options {
	return Options{Scale: scale, Duration: 10 * time.Minute, Capacity: 6, Limit: 5, Tokens: 45, TokenTime: time.Second,
		RequestTimeout: 120 * time.Second, Retries: 2, ChatEvery: 15 * time.Second, CoderEvery: 10 * time.Second,
		Panels: 3, PanelSize: 5, PanelEvery: time.Minute}
}

// Report is one scenario's outcome. Durations are simulated time.
type Report struct {
	Scenario         string
	Completed        map[string]int // by class
	Failed           map[string]int // calls that gave up, by class
	PanelsDone       int
	PanelsFinishedAt time.Duration // when the last panel finished; 0 if not all did
	ChatWaitP50      time.Duration // interactive: time queued for a slot
	ChatWaitP99      time.Duration
	BulkWaitP50      time.Duration // bulk: time queued for a slot
	ChatTTFTP50      time.Duration // interactive: time from the call to its first token
	ChatTTFTP99      time.Duration
	IdleTTFT         time.Duration // first-token time of a call to an idle gateway
	Timeouts         int           // request timeouts the clients hit
	RetriesSent      int
	WastedTokens     int64
	PeakUpstream     int
	Timeline         []Point // upstream concurrency over time
	Chats            []Point // each chat's first-token time, by arrival
}

// Point is a value at a simulated time.
type Point struct {
	At    time.Duration
	Value float64
}

type run struct {
	o      Options
	sim    *gatewaysim.Gateway
	client *http.Client
	url    string
	// sdkTimeout bounds each attempt by the SDK's request timeout, which
	// counts any queue wait; the lanes set-up leaves it to the transport.
	sdkTimeout bool
	start      time.Time
	mu         sync.Mutex
	r          Report
	waits      []time.Duration // interactive queue waits
	bulkWaits  []time.Duration
	ttfts      []time.Duration
	panels     []panelState
}

type panelState struct {
	left     int
	failed   bool
	finished time.Duration
}

func (x *run) real(d time.Duration) time.Duration      { return time.Duration(float64(d) * x.o.Scale) }
func (x *run) simulated(d time.Duration) time.Duration { return time.Duration(float64(d) / x.o.Scale) }
func (x *run) now() time.Duration                      { return x.simulated(time.Since(x.start)) }

// Run replays one scenario and reports it.
func Run(ctx context.Context, scenario string, o Options) (Report, error) {
	x := &run{o: o, r: Report{Scenario: scenario, Completed: map[string]int{}, Failed: map[string]int{}}}
	cfg := gatewaysim.Config{Capacity: o.Capacity, TokenTime: x.real(o.TokenTime), Tokens: o.Tokens, FirstTokenDelay: x.real(time.Second), Seed: 1}
	if scenario == "gateway-429" {
		cfg.RejectAbove = o.Limit
	}
	x.sim = gatewaysim.New(cfg)
	srv := httptest.NewServer(x.sim)
	defer srv.Close()
	defer x.sim.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 256}
	defer base.CloseIdleConnections()
	var rt http.RoundTripper = base
	switch scenario {
	case "lanes":
		lim, err := limiter.New(limiter.Config{MaxInflight: o.Limit, QueueTimeout: x.real(30 * time.Minute), InteractiveReserve: 1},
			limiter.WithObserver(func(ctx context.Context, e limiter.Event) {
				if e.Kind != limiter.Acquired {
					return
				}
				x.mu.Lock()
				switch e.Priority {
				case limiter.Interactive:
					x.waits = append(x.waits, x.simulated(e.Wait))
				case limiter.Bulk:
					x.bulkWaits = append(x.bulkWaits, x.simulated(e.Wait))
				}
				x.mu.Unlock()
			}))
		if err != nil {
			return Report{}, err
		}
		// The timeouts start once the slot is held (ADR-0115 D4).
		rt = &lanehttp.Transport{Limiter: lim, Base: base, ResponseHeaderTimeout: x.real(o.RequestTimeout), StallTimeout: x.real(o.RequestTimeout)}
	case "no-limiter", "gateway-429":
	default:
		return Report{}, fmt.Errorf("replay: unknown scenario %q (want one of %s)", scenario, strings.Join(Scenarios, ", "))
	}
	x.client = &http.Client{Transport: rt}
	x.sdkTimeout = scenario != "lanes" // with lanes, the transport's timeouts bound each attempt
	x.url = srv.URL + "/v1/chat/completions"

	// The first-token time of one call to the idle gateway, for scale; the
	// report counts what happens after it.
	x.start = time.Now()
	_, x.r.IdleTTFT = x.attempts(ctx, limiter.Interactive, 0)
	x.waits, x.r.Timeouts, x.r.RetriesSent = nil, 0, 0
	before := x.sim.Stats()

	x.start = time.Now()
	x.panels = make([]panelState, o.Panels)
	var wg sync.WaitGroup
	every := func(period time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(x.real(period))
			defer t.Stop()
			for end := time.After(x.real(o.Duration)); ; {
				f()
				select {
				case <-t.C:
				case <-end:
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	launch := func(class string, panel int) {
		wg.Add(1)
		go func() { defer wg.Done(); x.call(ctx, class, panel) }()
	}
	// One operator: a chat turn, the reply read, ChatEvery to think, the
	// next turn. A person does not send overlapping turns.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for end := time.After(x.real(o.Duration)); ; {
			x.call(ctx, "interactive", -1)
			select {
			case <-time.After(x.real(o.ChatEvery)):
			case <-end:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	every(o.CoderEvery, func() { launch("default", -1) })
	for p := range o.Panels {
		x.panels[p].left = o.PanelSize
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(x.real(time.Duration(p) * o.PanelEvery)):
			case <-ctx.Done():
				return
			}
			for range o.PanelSize {
				launch("bulk", p)
			}
		}()
	}
	// Sample the gateway's concurrency.
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(x.real(2 * time.Second))
		defer t.Stop()
		for {
			select {
			case <-t.C:
				x.mu.Lock()
				x.r.Timeline = append(x.r.Timeline, Point{x.now(), float64(x.sim.Stats().Active)})
				x.mu.Unlock()
			case <-stopSampling:
				return
			}
		}
	}()
	wg.Wait()
	close(stopSampling)
	<-sampled
	// Let abandoned work the gateway is still doing finish, so it is counted.
	for deadline := time.Now().Add(x.real(10 * time.Minute)); x.sim.Stats().Active > 0 && time.Now().Before(deadline); {
		time.Sleep(x.real(time.Second))
	}
	after := x.sim.Stats()
	x.r.WastedTokens = after.TokensWasted - before.TokensWasted
	x.r.PeakUpstream = after.Peak
	x.r.ChatWaitP50, x.r.ChatWaitP99 = pct(x.waits, 0.5), pct(x.waits, 0.99)
	x.r.BulkWaitP50 = pct(x.bulkWaits, 0.5)
	x.r.ChatTTFTP50, x.r.ChatTTFTP99 = pct(x.ttfts, 0.5), pct(x.ttfts, 0.99)
	last := time.Duration(0)
	for _, p := range x.panels {
		if p.left == 0 && !p.failed {
			x.r.PanelsDone++
			last = max(last, p.finished)
		}
	}
	if x.r.PanelsDone == o.Panels {
		x.r.PanelsFinishedAt = last
	}
	return x.r, nil
}

func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func priorityOf(class string) limiter.Priority {
	switch class {
	case "interactive":
		return limiter.Interactive
	case "bulk":
		return limiter.Bulk
	}
	return limiter.Default
}

// call makes one logical model call of class (for panel, or -1) and
// records how it ended.
func (x *run) call(ctx context.Context, class string, panel int) {
	start := x.now()
	ok, first := x.attempts(ctx, priorityOf(class), start)
	if ctx.Err() != nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !ok {
		x.r.Failed[class]++
		if panel >= 0 {
			x.panels[panel].failed = true
		}
		return
	}
	x.r.Completed[class]++
	switch {
	case class == "interactive":
		x.ttfts = append(x.ttfts, first)
		x.r.Chats = append(x.r.Chats, Point{start, first.Seconds()})
	case panel >= 0:
		x.panels[panel].left--
		x.panels[panel].finished = max(x.panels[panel].finished, x.now())
	}
}

// attempts makes a call as an SDK would: up to 1+Retries attempts, each
// bounded by the request timeout (in the lanes set-up, by the transport's
// timeouts, which start once the slot is held); 429 and 5xx are retried
// unless the answer says x-should-retry: false. It reports whether the
// answer came to the end, and when its first token came (since start).
func (x *run) attempts(ctx context.Context, p limiter.Priority, start time.Duration) (ok bool, first time.Duration) {
	cctx := limiter.WithArrival(limiter.WithPriority(ctx, p), time.Now())
	for attempt := 0; attempt <= x.o.Retries && !ok; attempt++ {
		if attempt > 0 {
			x.mu.Lock()
			x.r.RetriesSent++
			x.mu.Unlock()
			select { // backoff 0.5 s, 1 s, ... as the SDKs do
			case <-time.After(x.real(time.Duration(500<<(attempt-1)) * time.Millisecond)):
			case <-ctx.Done():
				return false, 0
			}
		}
		actx, cancel := cctx, context.CancelFunc(func() {})
		if x.sdkTimeout {
			actx, cancel = context.WithTimeout(cctx, x.real(x.o.RequestTimeout))
		}
		req, _ := http.NewRequestWithContext(actx, http.MethodPost, x.url, strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
		req.Header.Set("X-Stainless-Retry-Count", fmt.Sprint(attempt))
		res, err := x.client.Do(req)
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return false, 0
			}
			x.timeout()
			continue
		}
		if res.StatusCode != http.StatusOK {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			cancel()
			if res.Header.Get("X-Should-Retry") == "false" {
				break
			}
			continue
		}
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
			x.timeout() // the stream broke off or stalled
		}
	}
	return ok, first
}

func (x *run) timeout() {
	x.mu.Lock()
	x.r.Timeouts++
	x.mu.Unlock()
}
