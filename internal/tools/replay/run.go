package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/telemetry"
)

// LaneKey is the lane every call of the replay goes to.
var LaneKey = limiter.LaneKey("http://gateway.sim/v1", "protolabs/smart")

// sim is one deterministic run: the engine, the gateway, the lanes (one per
// agent, the same one for every agent when shared, none without a
// limiter), and what is tallied.
type sim struct {
	e      *engine
	o      Options
	gw     *gateway
	lanes  []*limiter.Limiter // by agent; nil without lanes
	tel    *telemetry.Telemetry
	r      *Report
	panels []panel
	open   int                     // calls not yet finished
	queued map[*call]time.Duration // calls waiting for a slot, and since when
	rng    *rand.Rand              // prompt sizes
	onlyB  bool                    // board-b-alone: agent 0 sends nothing
}

type panel struct {
	agent    int
	start    time.Duration
	left     int
	failed   map[string]int // its finders that failed, by reason
	finished time.Duration
}

// lose counts one of the panel's finders failed, for reason.
func (p *panel) lose(reason string) {
	if p.failed == nil {
		p.failed = map[string]int{}
	}
	p.failed[reason]++
}

// call is one logical model call, over its attempts.
type call struct {
	agent   int
	class   string
	prio    limiter.Priority
	panel   int // -1 when not a finder
	start   time.Duration
	attempt int
	sent    bool   // an attempt reached the gateway
	then    func() // runs when the call has finished
	bytes   int    // its request body
	// With a tokens-per-minute gateway: est is the lane's estimate of the
	// call (lanehttp.EstimateTokens of its body), prompt the gateway's
	// count of its prompt.
	est, prompt int64
}

// Run replays scenario (one of Scenarios, or "shared-exporter") with o in
// virtual time and reports it. The same scenario and options always give
// the same report.
func Run(scenario string, o Options) (Report, error) {
	if o.Agents < 1 {
		o.Agents = 1
	}
	e := newEngine()
	gcfg := gatewaysim.Config{Capacity: o.Capacity, Tokens: o.Tokens, TokenTime: o.TokenTime, FirstTokenDelay: o.FirstTokenDelay, Seed: o.Seed}
	s := &sim{e: e, o: o, r: newReport(scenario, o), queued: map[*call]time.Duration{}, rng: rand.New(rand.NewPCG(o.Seed, 77))}
	gcfg.PromptTime, gcfg.RejectAbove, gcfg.Jitter, gcfg.Bimodal = o.PromptTime, o.RejectAbove, o.Jitter, o.Bimodal
	gcfg.TokensPerMinute = o.TokensPerMinute
	var shared limiter.Config
	switch scenario {
	case "no-limiter":
	case "gateway-429":
		gcfg.RejectAbove = o.Limit
	case "lanes":
		shared = limiter.Config{MaxInflight: o.Limit, InteractiveReserve: o.Reserve, QueueTimeout: o.QueueTimeout, Adaptive: o.Adaptive}
		if o.NoPriorities {
			shared.InteractiveReserve = 0
		}
	case "shared-exporter", "two-boards":
		if o.SharedLimit < 1 {
			return Report{}, fmt.Errorf("replay: %s needs Options.SharedLimit", scenario)
		}
		shared = limiter.Config{MaxInflight: o.SharedLimit, InteractiveReserve: o.SharedReserve, QueueTimeout: o.QueueTimeout}
	case "tokens":
		if o.TokensPerMinute <= 0 || o.MaxTokens <= 0 {
			return Report{}, fmt.Errorf("replay: tokens needs Options.TokensPerMinute and MaxTokens")
		}
		shared = limiter.Config{MaxInflight: o.Limit, InteractiveReserve: o.Reserve, QueueTimeout: o.QueueTimeout}
		switch o.TokenMode {
		case TokensBudget:
			shared.TokensPerMinute = o.TokensPerMinute
		case TokensColdStart:
			shared.ColdStart = true
		case TokensCalls, TokensHeaders:
		default:
			return Report{}, fmt.Errorf("replay: TokenMode %q: want %s, %s, %s or %s", o.TokenMode, TokensCalls, TokensBudget, TokensHeaders, TokensColdStart)
		}
	case "board-b-alone":
		if o.BoardBPanelAt <= 0 || o.BoardBAloneLimit < 1 {
			return Report{}, fmt.Errorf("replay: board-b-alone needs Options.BoardBPanelAt and BoardBAloneLimit")
		}
		shared = limiter.Config{MaxInflight: o.BoardBAloneLimit, InteractiveReserve: o.Reserve, QueueTimeout: o.QueueTimeout}
		s.onlyB = true
	default:
		return Report{}, fmt.Errorf("replay: unknown scenario %q (want one of %s, shared-exporter, two-boards, board-b-alone)", scenario, strings.Join(Scenarios, ", "))
	}
	s.gw = newGateway(e, gcfg)
	s.r.IdleTTFT = idleTTFT(gcfg)
	if shared.MaxInflight > 0 {
		tel, err := telemetry.New(telemetry.Options{Thresholds: o.Thresholds})
		if err != nil {
			return Report{}, err
		}
		defer tel.Shutdown(context.Background())
		s.tel = tel
		for a := range o.Agents {
			if a > 0 && scenario != "lanes" {
				s.lanes = append(s.lanes, s.lanes[0])
				continue
			}
			var opts []limiter.Option
			if a == 0 {
				opts = append(opts, limiter.WithObserver(tel.Observe))
			}
			lim, err := e.newLimiter(shared, opts...)
			if err != nil {
				return Report{}, err
			}
			if a == 0 {
				tel.Watch(lim)
			}
			s.lanes = append(s.lanes, lim)
		}
	}
	s.load()
	for _, c := range o.CapacityChanges {
		e.at(c.At, func() { s.gw.cfg.Capacity = c.Capacity })
	}
	if o.FaultEnd > o.FaultStart {
		e.at(o.FaultStart, func() {
			s.gw.cut()
			s.gw.cfg.ServerError = o.FaultShare
		})
		e.at(o.FaultEnd, func() { s.gw.cfg.ServerError = 0 })
	}
	e.at(0, s.poll)
	e.run()
	s.r.finish(s.panels, s.gw.st)
	if s.gw.tpm != nil {
		s.r.Tokens = s.tokenFigures()
	}
	return *s.r, nil
}

// idleTTFT is the first-token time of one call to the idle gateway.
func idleTTFT(cfg gatewaysim.Config) time.Duration {
	e := newEngine()
	var first time.Duration
	newGateway(e, cfg).send(&exchange{token: func(i int) {
		if i == 0 {
			first = e.now()
		}
	}, end: func(bool) {}}, false)
	e.run()
	return first
}

// load schedules every agent's calls.
func (s *sim) load() {
	o := s.o
	if o.Clients > 0 {
		for range o.Clients {
			var next func()
			next = func() {
				if s.e.now() < o.Duration {
					s.begin(&call{class: "default", prio: limiter.Default, panel: -1, then: next})
				}
			}
			s.e.at(0, next)
		}
		return
	}
	for a := range o.Agents {
		boardB := o.BoardBPanelAt > 0 && a == 1
		if s.onlyB && !boardB {
			continue
		}
		// The operator: a turn, the reply read, ChatEvery to think, the
		// next turn. A person does not send overlapping turns. Board B
		// has none.
		var turn func()
		turn = func() {
			if s.e.now() >= o.Duration {
				return
			}
			s.begin(&call{agent: a, class: "interactive", prio: limiter.Interactive, panel: -1,
				then: func() { s.e.after(o.ChatEvery, turn) }})
		}
		if !boardB {
			s.e.at(0, turn)
		}
		rng := rand.New(rand.NewPCG(o.Seed, uint64(a)))
		var coder func()
		every := o.CoderEvery
		if boardB && o.BoardBCoderEvery > 0 {
			every = o.BoardBCoderEvery
		}
		coder = func() {
			if s.e.now() >= o.Duration {
				return
			}
			s.begin(&call{agent: a, class: "default", prio: limiter.Default, panel: -1})
			s.e.after(time.Duration(float64(every)*(0.5+rng.Float64())), coder)
		}
		s.e.at(0, coder)
		starts := make([]time.Duration, o.Panels)
		for p := range starts {
			starts[p] = time.Duration(p) * o.PanelEvery
		}
		if boardB {
			starts = []time.Duration{o.BoardBPanelAt}
		}
		for _, at := range starts {
			i := len(s.panels)
			s.panels = append(s.panels, panel{agent: a, start: at, left: o.PanelSize})
			s.e.at(at, func() {
				for range o.PanelSize {
					s.begin(&call{agent: a, class: "bulk", prio: limiter.Bulk, panel: i})
				}
			})
		}
	}
}

// tenant is the tenant a call names: its board's, with Tenants.
func (s *sim) tenant(c *call) string {
	if !s.o.Tenants {
		return ""
	}
	return []string{"board-a", "board-b"}[min(c.agent, 1)]
}

func (s *sim) begin(c *call) {
	c.start = s.e.now()
	size := map[string]int{"interactive": s.o.ChatBytes, "default": s.o.CoderBytes, "bulk": s.o.FinderBytes}[c.class]
	c.bytes = max(1, int(float64(size)*(1+s.o.PromptJitter*(2*s.rng.Float64()-1))))
	if s.o.TokensPerMinute > 0 {
		body := chatBody(c.bytes, s.o.MaxTokens)
		c.est, c.prompt = lanehttp.EstimateTokens(body, lanehttp.DefaultMaxOutputTokens).Total(), gatewaysim.PromptTokens(body)
	}
	s.open++
	s.r.class(c.class).Calls++
	s.try(c)
}

// try makes an attempt: with lanes, it first waits for a slot; a queue
// timeout ends the call, as the transport's answer to it says
// X-Should-Retry: false. A retry keeps the call's arrival, so it keeps its
// place in the queue's order (the transport's retry recognition).
func (s *sim) try(c *call) {
	if s.lanes == nil {
		s.send(c, nil, limiter.Slot{})
		return
	}
	lim, asked := s.lanes[c.agent], s.e.now()
	s.queued[c] = asked
	prio := c.prio
	if s.o.NoPriorities {
		prio = limiter.Default
	}
	cost := c.est
	if s.o.TokenMode == TokensCalls {
		cost = 0 // lanes that know nothing of tokens
	}
	s.e.acquire(lim, LaneKey, prio, s.tenant(c), cost, c.start, func(r res) {
		delete(s.queued, c)
		now := s.e.now()
		s.r.class(c.class).waits = append(s.r.class(c.class).waits, now-asked)
		s.r.Grants = append(s.r.Grants, Grant{Class: c.class, Arrival: c.start, Asked: asked, Ended: now, Granted: r.err == nil})
		if r.err != nil {
			s.finish(c, false, "queue timeout", 0)
			return
		}
		s.send(c, lim, r.slot)
	})
}

// send sends an attempt to the gateway. Without lanes the SDK's request
// timeout bounds the whole attempt; with lanes the transport's header and
// stall timeouts do, from the moment the slot is held.
func (s *sim) send(c *call, lim *limiter.Limiter, slot limiter.Slot) {
	e, sent := s.e, s.e.now()
	first, last := time.Duration(-1), sent
	done := false
	x := &exchange{prompt: c.prompt, bound: int64(s.o.MaxTokens)}
	tokens := lim != nil && s.o.TokensPerMinute > 0 && s.o.TokenMode != TokensCalls
	headers := tokens && (s.o.TokenMode == TokensHeaders || s.o.TokenMode == TokensColdStart)
	// limits is what the answer's rate-limit headers say, as the gateway
	// counted when the call arrived (lanehttp.RateLimits).
	limits := func(retryAfter time.Duration) limiter.ProviderLimits {
		return limiter.ProviderLimits{At: e.t0.Add(sent), Slot: slot, RetryAfter: retryAfter, Tokens: limiter.ProviderBudget{
			Known: true, Limit: s.o.TokensPerMinute, Remaining: x.remaining, Reset: x.reset}}
	}
	end := func(out limiter.Outcome, code int, reason string) {
		if done {
			return
		}
		done = true
		if tokens {
			// Settled as the transport settles: the answer's usage, or
			// nothing for an error answer.
			var u limiter.Usage
			if code == http.StatusOK {
				u = limiter.Usage{Prompt: c.prompt, Completion: x.generated}
			}
			slot.Settle(u)
			e.dirty = true
		}
		if lim != nil {
			fb := time.Duration(0)
			if first >= 0 {
				fb = first - sent
			}
			lim.RecordExchange(context.Background(), LaneKey, limiter.Exchange{Outcome: out, Status: code, Retry: c.attempt > 0,
				FirstByte: fb, Sent: e.t0.Add(sent), Duration: e.now() - sent})
			e.release(slot)
		}
		if out == limiter.OutcomeOK {
			s.finish(c, true, "", first-c.start)
			return
		}
		if c.attempt < s.o.Retries {
			s.r.Retries++
			wait := s.o.Backoff << c.attempt
			if code == http.StatusTooManyRequests && x.retryAfter > 0 && x.retryAfter <= time.Minute {
				wait = x.retryAfter // the SDKs wait a 429's Retry-After, up to 60 s
			}
			c.attempt++
			e.after(wait, func() { s.try(c) })
			return
		}
		s.finish(c, false, reason, 0)
	}
	x.status = func(code int) {
		if headers && code == http.StatusTooManyRequests {
			lim.RecordLimits(context.Background(), LaneKey, limits(x.retryAfter))
			e.dirty = true
		}
		if code == http.StatusTooManyRequests {
			end(limiter.OutcomeRateLimited, code, "429")
		} else {
			end(limiter.OutcomeServerError, code, "5xx")
		}
	}
	x.bytes = c.bytes
	x.token = func(i int) {
		if i == 0 && headers {
			lim.RecordLimits(context.Background(), LaneKey, limits(0))
			e.dirty = true
		}
		if i == 0 {
			first = e.now()
			if lim != nil { // the transport reports first bytes as they come
				lim.RecordFirstByte(context.Background(), LaneKey, limiter.FirstByte{Sent: e.t0.Add(sent), After: first - sent, RequestBytes: c.bytes})
				// An adaptive limit that rises grants waiters: settle collects
				// them now, as it does after a release (their timers end when
				// their goroutines run, and the next timer due must not be one
				// of theirs). A fixed limit grants nothing here.
				e.dirty = e.dirty || s.o.Adaptive != nil || s.o.TokenMode == TokensColdStart // a cold lane warms
			}
		}
		last = e.now()
	}
	x.end = func(full bool) {
		if full {
			end(limiter.OutcomeOK, http.StatusOK, "")
		} else {
			end(limiter.OutcomeTransportError, http.StatusOK, "broken stream")
		}
	}
	timeout := func() {
		s.r.RequestTimeouts++
		s.gw.leave(x)
		end(limiter.OutcomeStall, 0, "request timeout")
	}
	rt := s.o.RequestTimeout
	if lim != nil {
		var watch func()
		watch = func() {
			if done {
				return
			}
			if e.now()-last >= rt {
				timeout()
				return
			}
			e.at(last+rt, watch)
		}
		e.at(sent+rt, watch)
	} else {
		e.after(rt, func() {
			if !done {
				timeout()
			}
		})
	}
	c.sent = true
	s.gw.send(x, c.attempt > 0)
}

func (s *sim) finish(c *call, ok bool, reason string, ttft time.Duration) {
	s.open--
	cs := s.r.class(c.class)
	now := s.e.now()
	switch {
	case ok:
		cs.Completed++
		cs.ttfts = append(cs.ttfts, ttft)
		if c.class == "interactive" {
			s.r.Chats = append(s.r.Chats, Point{c.start, ttft.Seconds()})
		}
		if c.panel >= 0 {
			s.panels[c.panel].left--
			s.panels[c.panel].finished = max(s.panels[c.panel].finished, now)
		}
	default:
		cs.Failed[reason]++
		if reason == "queue timeout" && !c.sent {
			s.r.FastFails++
		} else {
			s.r.FailedAfterGateway++
		}
		if c.panel >= 0 {
			s.panels[c.panel].lose(reason)
		}
	}
	if c.then != nil {
		c.then()
	}
}

// poll samples the timeline and polls the classification route, every
// PollEvery while calls arrive, are open or the gateway still works.
func (s *sim) poll() {
	now := s.e.now()
	smp := Sample{At: now, Gateway: len(s.gw.active), Fault: s.o.FaultEnd > s.o.FaultStart && now >= s.o.FaultStart && now < s.o.FaultEnd}
	for _, since := range s.queued {
		smp.OldestWait = max(smp.OldestWait, now-since)
	}
	seen := map[*limiter.Limiter]bool{}
	for _, l := range s.lanes {
		if seen[l] {
			continue
		}
		seen[l] = true
		for _, ln := range l.Snapshot().Lanes {
			smp.Queued.Interactive += ln.QueuedByPriority.Interactive
			smp.Queued.Default += ln.QueuedByPriority.Default
			smp.Queued.Bulk += ln.QueuedByPriority.Bulk
		}
	}
	if len(s.lanes) > 0 {
		for _, ln := range s.lanes[0].Snapshot().Lanes {
			smp.Limit = ln.Limit
		}
	}
	smp.Capacity = s.gw.cfg.Capacity
	if s.tel != nil {
		c, err := classifyRoute(s.tel.Handler(), LaneKey)
		if err != nil {
			panic(err) // the route is in-process: an error is a bug
		}
		smp.State = c.State
		smp.GatewayVerdict = slices.ContainsFunc(c.Reasons, classify.IsGatewayReason)
	}
	s.r.Samples = append(s.r.Samples, smp)
	if now < s.o.Duration || s.open > 0 || len(s.gw.active) > 0 {
		s.e.after(s.o.PollEvery, s.poll)
	}
}

// classifyRoute asks the classification route of h about lane, as a poller
// such as pr-reviewer does.
func classifyRoute(h http.Handler, lane string) (classify.Classification, error) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, telemetry.ClassificationPath+"?lane="+url.QueryEscape(lane), nil))
	var c classify.Classification
	if rec.Code != http.StatusOK {
		return c, fmt.Errorf("classification route: %d %s", rec.Code, rec.Body)
	}
	return c, json.Unmarshal(rec.Body.Bytes(), &c)
}
