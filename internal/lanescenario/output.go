package lanescenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// agingStep is the ADR's: a waiter's class rises a step per minute waited.
const agingStep = time.Minute

// events writes what became of the calls since the last command: queued,
// granted, and the waits that ended without a slot, and why.
func (r *runner) events(out *strings.Builder) {
	var queued, granted, gone []string
	for _, c := range r.order {
		if c.reported {
			continue
		}
		switch c.state {
		case awaiting:
			queued = append(queued, c.id)
		case holding:
			granted = append(granted, c.id)
		case ended:
			gone = append(gone, fmt.Sprintf("%s %s", c.id, why(c.err)))
		}
		c.reported = true
	}
	if len(granted) > 0 {
		fmt.Fprintf(out, "granted: %s\n", strings.Join(granted, " "))
	}
	if len(queued) > 0 {
		fmt.Fprintf(out, "queued: %s\n", strings.Join(queued, " "))
	}
	for _, e := range gone {
		fmt.Fprintf(out, "ended: %s\n", e)
	}
}

// why names the error a wait ended with, in the terms of the contract.
func why(err error) string {
	var tb *limiter.TokenBudgetError
	var qt *limiter.QueueTimeoutError
	switch {
	case errors.As(err, &tb):
		return fmt.Sprintf("refused: too large for the %s budget (%d tokens, at most %d)", tb.Budget, tb.Tokens, tb.Limit)
	case errors.As(err, &qt):
		// Where it stood in the serving order as it left, which an engine
		// counts apart from the order it serves in.
		switch qt.Cause {
		case limiter.CauseDeadline:
			return fmt.Sprintf("answered at its deadline at place %d of %d", qt.Position, qt.Queued)
		case limiter.CauseEstimate:
			return fmt.Sprintf("answered early at place %d of %d: a wait of about %s", qt.Position, qt.Queued, qt.RetryAfter)
		}
		return fmt.Sprintf("timed out at place %d of %d", qt.Position, qt.Queued)
	case errors.Is(err, limiter.ErrQueueTimeout):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return fmt.Sprintf("failed: %v", err)
}

// state writes the lane: who holds its slots, who waits in what order and
// for what, the tenants' service, the budgets.
func (r *runner) state(t *testing.T, out *strings.Builder) {
	s := r.lane()
	var held []string
	for _, c := range r.order {
		if c.state == holding {
			held = append(held, c.id)
		}
	}
	fmt.Fprintf(out, "held %d of %d: %s\n", s.Inflight, s.Limit, strings.Join(held, " "))
	q := r.e.Queue(t, r.lim, Lane)
	ws := r.waiters(t, q)
	if len(ws) > 0 {
		fmt.Fprintf(out, "queue: %s\n", r.order3(ws, q.Service))
		fmt.Fprintf(out, "first waits for: %s\n", r.waitsFor(ws, s))
	}
	if q.Service != nil {
		var names []string
		for n := range q.Service {
			names = append(names, n)
		}
		slices.Sort(names)
		var parts []string
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s=%.2f", n, q.Service[n]))
		}
		fmt.Fprintf(out, "service: %s\n", strings.Join(parts, " "))
	}
	if tk := s.Tokens; tk != nil {
		if r.cfg.TokensPerMinute > 0 || r.cfg.MaxInflightTokens > 0 {
			rem := ""
			if tk.Remaining != nil && r.cfg.TokensPerMinute > 0 {
				rem = fmt.Sprintf("%d remaining, ", *tk.Remaining)
			}
			fmt.Fprintf(out, "tokens: %s%d in flight\n", rem, tk.Inflight)
		}
		if p := tk.Provider; p != nil {
			var parts []string
			if b := p.Tokens; b != nil {
				parts = append(parts, fmt.Sprintf("tokens %d of %d, whole in %.1fs", b.Remaining, b.Limit, float64(b.Reset)))
			}
			if b := p.Requests; b != nil {
				parts = append(parts, fmt.Sprintf("requests %d of %d, whole in %.1fs", b.Remaining, b.Limit, float64(b.Reset)))
			}
			if p.RetryAfter > 0 {
				parts = append(parts, fmt.Sprintf("held for %.1fs", float64(p.RetryAfter)))
			}
			if c := p.Concurrency; c != nil && c.Hold > 0 {
				parts = append(parts, fmt.Sprintf("held by a concurrency 429 (%d in flight at it) for at most %.1fs", c.InflightAt429, float64(c.Hold)))
			}
			if l := p.TokenLimit; l != nil {
				parts = append(parts, fmt.Sprintf("calls above %d tokens refused for %.1fs", l.Limit, float64(l.Binds)))
			}
			if len(parts) > 0 {
				fmt.Fprintf(out, "provider: %s\n", strings.Join(parts, "; "))
			}
		}
	}
}

// waiting is a waiting call with its place in the engine's queue.
type waiting struct {
	c *call
	w Waiter
}

// waiters pairs the engine's waiters with the scenario's calls: by class
// and arrival, then enqueue order (the scenario's calls queue one at a
// time). The tenant is the engine's: a name past max_tenants is "other".
func (r *runner) waiters(t *testing.T, q Queue) []waiting {
	type key struct {
		class limiter.Priority
		at    int64
	}
	mine := map[key][]*call{}
	n := 0
	for _, c := range r.order {
		if c.state == awaiting {
			k := key{c.class, c.arrival.UnixMilli()}
			mine[k] = append(mine[k], c)
			n++
		}
	}
	if len(q.Waiters) != n {
		t.Fatalf("the engine has %d waiters, the scenario %d", len(q.Waiters), n)
	}
	ws := slices.Clone(q.Waiters)
	slices.SortFunc(ws, func(a, b Waiter) int { return cmp.Compare(a.Seq, b.Seq) })
	var out []waiting
	for _, w := range ws {
		k := key{w.Class, w.Arrival.UnixMilli()}
		if len(mine[k]) == 0 {
			t.Fatalf("the engine has a waiter %+v the scenario does not", w)
		}
		out = append(out, waiting{mine[k][0], w})
		mine[k] = mine[k][1:]
	}
	return out
}

// rank is a waiter's effective class at now.
func rank(w Waiter, now time.Time) limiter.Priority {
	steps := min(2, max(0, int(now.Sub(w.Arrival)/agingStep)))
	return max(limiter.Interactive, w.Class-limiter.Priority(steps))
}

func older(a, b Waiter) int {
	if c := a.Arrival.Compare(b.Arrival); c != 0 {
		return c
	}
	return cmp.Compare(a.Seq, b.Seq)
}

// order3 writes the waiters in serving order as it stands: the classes in
// the order of their oldest waiters (effective class, then arrival), each
// class's waiters by their tenant's service, then arrival. An aged class
// shows what it ranks as.
func (r *runner) order3(ws []waiting, service map[string]float64) string {
	now := r.clock.Now()
	var classes [3][]waiting
	for _, w := range ws {
		classes[w.w.Class.Index()] = append(classes[w.w.Class.Index()], w)
	}
	var order []int
	for c := range classes {
		if len(classes[c]) > 0 {
			slices.SortFunc(classes[c], func(a, b waiting) int {
				if s := cmp.Compare(service[a.w.Tenant], service[b.w.Tenant]); s != 0 {
					return s
				}
				return older(a.w, b.w)
			})
			order = append(order, c)
		}
	}
	rep := func(c int) Waiter {
		return slices.MinFunc(classes[c], func(a, b waiting) int { return older(a.w, b.w) }).w
	}
	slices.SortFunc(order, func(a, b int) int {
		ra, rb := rep(a), rep(b)
		if c := cmp.Compare(rank(ra, now), rank(rb, now)); c != 0 {
			return c
		}
		return older(ra, rb)
	})
	var parts []string
	for _, c := range order {
		name := classes[c][0].w.Class.String()
		if e := rank(rep(c), now); e != classes[c][0].w.Class {
			name += " (as " + e.String() + ")"
		}
		var ids []string
		for _, w := range classes[c] {
			id := w.c.id
			if w.w.Tenant != limiter.DefaultTenant {
				id += "/" + w.w.Tenant
			}
			if w.w.Tokens > 0 {
				id += fmt.Sprintf("[%d]", w.w.Tokens)
			}
			ids = append(ids, id)
		}
		parts = append(parts, name+": "+strings.Join(ids, " "))
	}
	return strings.Join(parts, " | ")
}

// waitsFor says what keeps the lane's waiters waiting: every slot they may
// take is held, a tenant's cap, or the budgets.
func (r *runner) waitsFor(ws []waiting, s limiter.LaneSnapshot) string {
	others := 0
	perTenant := map[string]int{}
	for _, c := range r.order {
		if c.state == holding {
			perTenant[c.tenant]++
			if c.class != limiter.Interactive {
				others++
			}
		}
	}
	if s.Inflight >= s.Limit {
		if s.ColdStart {
			return "a slot (cold start: one at a time)"
		}
		return "a slot"
	}
	interactive := slices.ContainsFunc(ws, func(w waiting) bool { return w.w.Class == limiter.Interactive })
	if others >= r.cfg.MaxInflight-r.cfg.Reserve() && !interactive {
		return "a slot (the rest are reserved for interactive calls)"
	}
	if cap := r.cfg.Fairness.MaxInflightPerTenant; cap > 0 && !slices.ContainsFunc(ws, func(w waiting) bool { return perTenant[w.w.Tenant] < cap }) {
		return "its tenant's cap"
	}
	if tk := s.Tokens; tk != nil && tk.Provider != nil && tk.Provider.RetryAfter > 0 {
		return "the provider's retry-after"
	}
	if tk := s.Tokens; tk != nil && tk.Provider != nil && tk.Provider.Concurrency != nil && tk.Provider.Concurrency.Hold > 0 {
		return "a call in flight to end (the gateway's concurrency 429)"
	}
	if r.cfg.TokensPerMinute > 0 || r.cfg.MaxInflightTokens > 0 {
		return "tokens"
	}
	if tk := s.Tokens; tk != nil && tk.Provider != nil && (tk.Provider.Tokens != nil || tk.Provider.Requests != nil) {
		return "the provider's budget"
	}
	return "nothing the lane shows"
}
