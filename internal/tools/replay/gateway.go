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
}

func newGateway(e *engine, cfg gatewaysim.Config) *gateway {
	return &gateway{e: e, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), jit: rand.New(rand.NewPCG(cfg.Seed, 3))}
}

// send starts x at the gateway.
func (g *gateway) send(x *exchange, retry bool) {
	g.st.Received++
	if retry {
		g.st.RetriesSeen++
	}
	code := 0
	switch {
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
	if x.gone {
		g.st.TokensWasted++
	} else {
		x.token(i)
	}
	if i < g.cfg.Tokens-1 {
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

func (g *gateway) drop(x *exchange) {
	x.dead = true
	g.active = slices.DeleteFunc(g.active, func(y *exchange) bool { return y == x })
	g.st.Active = len(g.active)
}
