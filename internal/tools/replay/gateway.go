package replay

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// gateway is gatewaysim's gateway in virtual time: the same configuration,
// the same token-by-token processor sharing (gatewaysim.Config.TokenDelay),
// a 429 at once above RejectAbove, a share of 5xx, and work that goes on
// for clients that left (counted as wasted), as a gateway that does not
// propagate disconnects does.
type gateway struct {
	e      *engine
	cfg    gatewaysim.Config
	rng    *rand.Rand  // faults
	jit    *rand.Rand  // first-token jitter, apart so that the fault draws stay as they were
	active []*exchange // in the order they started
	st     gatewaysim.Stats
	// tpm is the tokens-per-minute limit, with Config.TokensPerMinute;
	// flow records the tokens used, as the provider bills them (a prompt
	// when it arrives, each answer token when it is made), in time order,
	// for the tokens used in a window.
	tpm  *gatewaysim.TokenLimit
	flow []tokenFlow
	// limited are the times of the 429s past the limit; firstAnswer when
	// the first answer's headers went out (0: none yet).
	limited     []time.Duration
	firstAnswer time.Duration
}

type tokenFlow struct {
	at time.Duration
	n  int64
}

// exchange is one request at the gateway. The client sets the callbacks;
// the gateway calls at most one of status and end, and token before end.
type exchange struct {
	status func(code int)  // an error answer, at once
	token  func(i int)     // token i of the answer reached the client
	end    func(full bool) // the answer ended: full, or cut by the gateway
	gone   bool            // the client left; the gateway works on
	dead   bool            // the gateway stopped working on it
	bytes  int             // the request body's size
	// With a tokens-per-minute limit: prompt and bound are what the call
	// reserves; charged what it did, generated the tokens made so far;
	// remaining and reset what the answer's headers say (as counted when
	// it arrived); retryAfter a 429's.
	prompt, bound, charged, generated int64
	remaining                         int64
	reset, retryAfter                 time.Duration
}

func newGateway(e *engine, cfg gatewaysim.Config) *gateway {
	g := &gateway{e: e, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), jit: rand.New(rand.NewPCG(cfg.Seed, 3))}
	if cfg.TokensPerMinute > 0 {
		g.tpm = gatewaysim.NewTokenLimit(cfg.TokensPerMinute, e.clock.Now())
	}
	return g
}

// takeTokens reserves x's prompt and bound, or says it does not fit.
func (g *gateway) takeTokens(x *exchange) bool {
	now := g.e.clock.Now()
	cost := x.prompt + x.bound
	ok, after := g.tpm.Take(cost, now)
	x.remaining, x.reset = g.tpm.Remaining(now)
	if !ok {
		x.retryAfter = after
		g.st.TokenLimited++
		g.limited = append(g.limited, g.e.now())
		return false
	}
	x.charged = cost
	g.flow = append(g.flow, tokenFlow{g.e.now(), x.prompt}) // the prompt is used on arrival
	return true
}

// refund gives back what x reserved and did not use, once it has ended.
func (g *gateway) refund(x *exchange) {
	if g.tpm == nil || x.charged == 0 {
		return
	}
	back := x.charged - x.prompt - x.generated
	g.st.TokensUsed += x.prompt + x.generated
	x.charged = 0
	g.tpm.Refund(back, g.e.clock.Now())
}

// tokensUsed returns the tokens used between from and to.
func (g *gateway) tokensUsed(from, to time.Duration) int64 {
	var n int64
	for _, f := range g.flow {
		if f.at >= from && f.at < to {
			n += f.n
		}
	}
	return n
}

// send starts x at the gateway.
func (g *gateway) send(x *exchange, retry bool) {
	g.st.Received++
	if retry {
		g.st.RetriesSeen++
	}
	code := 0
	switch {
	case g.tpm != nil && !g.takeTokens(x):
		code = http.StatusTooManyRequests
	case g.cfg.RejectAbove > 0 && len(g.active) >= g.cfg.RejectAbove:
		code = http.StatusTooManyRequests
	case g.cfg.RateLimited+g.cfg.ServerError > 0:
		switch r := g.rng.Float64(); {
		case r < g.cfg.RateLimited:
			code = http.StatusTooManyRequests
		case r < g.cfg.RateLimited+g.cfg.ServerError:
			code = http.StatusServiceUnavailable
		}
	}
	if code != 0 {
		if x.charged > 0 { // refused after all: nothing was used
			g.tpm.Refund(x.charged, g.e.clock.Now())
			g.flow = append(g.flow, tokenFlow{g.e.now(), -x.prompt})
			x.charged = 0
		}
		if code == http.StatusTooManyRequests {
			g.st.RateLimited++
		} else {
			g.st.ServerErrors++
		}
		g.e.after(0, func() { x.status(code) })
		return
	}
	g.active = append(g.active, x)
	g.st.Active = len(g.active)
	g.st.Peak = max(g.st.Peak, g.st.Active)
	jitter := time.Duration(0)
	if g.cfg.Jitter > 0 {
		jitter = g.cfg.JitterOf(g.jit.Float64())
	}
	g.e.after(g.cfg.FirstTokenAfter(x.bytes)+jitter+g.cfg.TokenDelay(len(g.active)), func() { g.tick(x, 0) })
}

func (g *gateway) tick(x *exchange, i int) {
	if x.dead {
		return
	}
	g.st.TokensGenerated++
	x.generated++
	if i == 0 && g.firstAnswer == 0 {
		g.firstAnswer = max(g.e.now(), 1)
	}
	if g.tpm != nil {
		g.flow = append(g.flow, tokenFlow{g.e.now(), 1})
	}
	if x.gone {
		g.st.TokensWasted++
	} else {
		x.token(i)
	}
	if i < g.answer(x)-1 {
		g.e.after(g.cfg.TokenDelay(len(g.active)), func() { g.tick(x, i+1) })
		return
	}
	g.drop(x)
	if x.gone {
		return
	}
	g.st.Completed++
	x.end(true)
}

// leave marks x abandoned by its client.
func (g *gateway) leave(x *exchange) {
	if !x.gone && !x.dead {
		g.st.Abandoned++
	}
	x.gone = true
}

// cut breaks off every answer in progress, as a replica that fails does.
func (g *gateway) cut() {
	for _, x := range slices.Clone(g.active) {
		g.drop(x)
		g.st.Resets++
		if !x.gone {
			g.e.after(0, func() { x.end(false) })
		}
	}
}

// answer is how many tokens x's answer has: the gateway's, at most its
// bound.
func (g *gateway) answer(x *exchange) int {
	if x.bound > 0 {
		return min(g.cfg.Tokens, int(x.bound))
	}
	return g.cfg.Tokens
}

func (g *gateway) drop(x *exchange) {
	g.refund(x)
	x.dead = true
	g.active = slices.DeleteFunc(g.active, func(y *exchange) bool { return y == x })
	g.st.Active = len(g.active)
}
