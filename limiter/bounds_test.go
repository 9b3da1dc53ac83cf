package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// A provider's word binds for at most two windows, whatever it says: a
// reset of a hundred years is taken as the window (60 s by default, or
// the configured one), and the budget refills by at least its limit per
// window. On the fake clock.
func TestProviderWordBounded(t *testing.T) {
	for _, c := range []struct {
		window    time.Duration
		wantReset float64
	}{{0, 60}, {10 * time.Minute, 600}} {
		cfg := budgetCfg(4, 0, 0)
		cfg.ProviderWindow = c.window
		h := newHarness(t, cfg)
		h.take("L", "first", limiter.Default).Release()
		h.lim.RecordLimits(context.Background(), "L", limiter.ProviderLimits{Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: 0, Reset: 100 * 365 * 24 * time.Hour}})
		p := h.lane("L").Tokens.Provider
		if p == nil || p.Tokens == nil || float64(p.Tokens.Reset) != c.wantReset {
			t.Fatalf("window %s: provider %+v, want a reset of %v s", c.window, p, c.wantReset)
		}
		// 500 tokens at 1,000 a window.
		w := c.window
		if w == 0 {
			w = limiter.DefaultProviderWindow
		}
		h.queue(costing(500), "L", "a", limiter.Default)
		h.clock.Advance(w * 49 / 100)
		h.noneEnded()
		h.clock.Advance(w * 2 / 100)
		h.expectGrant("a").Release()
	}
}

// A mirror and a bucket never owe more than one limit or budget: a grant
// estimated far above what the provider's count said remains leaves the
// mirror at minus the limit, whole again within two windows.
func TestProviderWordFloor(t *testing.T) {
	h := newHarness(t, budgetCfg(4, 0, 0))
	h.take("L", "first", limiter.Default).Release()
	ctx := context.Background()
	h.lim.RecordLimits(ctx, "L", limiter.ProviderLimits{Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: 1000, Reset: time.Second}})
	a := h.takeCost("a", limiter.Default, 1000)
	// Counted before a was granted: 1,000 remain, less a's 1,000 and the
	// 1,000 that the count is short of: not -1,000 but floored at -1,000.
	h.lim.RecordLimits(ctx, "L", limiter.ProviderLimits{Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: 0, Reset: time.Minute},
		At: t0})
	if got := h.lane("L").Tokens.Provider.Tokens.Remaining; got != -1000 {
		t.Fatalf("remaining %d, want -1,000 (the floor)", got)
	}
	a.Release()
	h.queue(costing(1000), "L", "b", limiter.Default)
	h.clock.Advance(119 * time.Second)
	h.noneEnded()
	h.clock.Advance(time.Second)
	h.expectGrant("b").Release()
}

// A call estimated above the token limit the provider announced as its
// own is refused, whether or not the provider's budget is whole now, for
// one provider window after the limit was last heard and never longer; a
// gateway's announced limit (no RefuseAbove) refuses nothing. One above
// MaxCallTokens is refused with no budget and no provider word at all. A
// reload forgets the provider's word, its limit included.
func TestProviderLimitRefused(t *testing.T) {
	h := newHarness(t, budgetCfg(4, 0, 0))
	var be *limiter.TokenBudgetError
	if _, err := h.lim.Acquire(costing(limiter.MaxCallTokens+1), "L"); !errors.As(err, &be) || be.Budget != "max_call_tokens" {
		t.Fatalf("a call of MaxCallTokens+1: %v, want a TokenBudgetError for max_call_tokens", err)
	}
	h.take("L", "first", limiter.Default).Release()
	said := limiter.ProviderLimits{Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: 1000, Reset: time.Second}}
	h.lim.RecordLimits(context.Background(), "L", said) // a gateway's: refuses nothing
	h.clock.Advance(2 * time.Second)
	h.takeCost("gateway's", limiter.Default, 1001).Release()
	said.RefuseAbove = true
	h.lim.RecordLimits(context.Background(), "L", said)
	h.clock.Advance(2 * time.Second) // past the reset, whole: binding nothing
	if _, err := h.lim.Acquire(costing(1001), "L"); !errors.As(err, &be) || be.Budget != "provider" || be.Limit != 1000 {
		t.Fatalf("a call of 1,001: %v, want a TokenBudgetError for the provider's 1,000", err)
	}
	if l := h.lane("L").Tokens.Provider.TokenLimit; l == nil || l.Limit != 1000 || l.Binds != 58 {
		t.Fatalf("snapshot's token limit %+v, want 1000, binding 58 s more", l)
	}
	h.clock.Advance(58 * time.Second) // a window after it was heard: it binds no more
	h.takeCost("past the window", limiter.Default, 1001).Release()
	if l := h.lane("L").Tokens.Provider.TokenLimit; l != nil {
		t.Fatalf("snapshot's token limit %+v past its window, want none", l)
	}
	h.lim.RecordLimits(context.Background(), "L", said)
	if _, err := h.lim.Acquire(costing(1001), "L"); !errors.As(err, &be) {
		t.Fatalf("a call of 1,001 after the limit was heard again: %v, want refused", err)
	}
	if err := h.lim.SetConfig(h.lim.Config()); err != nil {
		t.Fatal(err)
	}
	if tk := h.lane("L").Tokens; tk != nil && tk.Provider != nil {
		t.Fatalf("after a reload: provider %+v, want none", tk.Provider)
	}
	h.takeCost("big", limiter.Default, 1001).Release()
}

// A usage beyond what a call can cost counts as at most a whole budget:
// the bucket owes at most one budget.
func TestUsageBounded(t *testing.T) {
	h := newHarness(t, budgetCfg(4, 1000, 0))
	a := h.takeCost("a", limiter.Default, 10)
	a.Settle(limiter.Usage{Prompt: 1 << 62, Completion: 1 << 62})
	a.Release()
	if got := *h.lane("L").Tokens.Remaining; got != 0 {
		t.Fatalf("remaining %d, want 0 (the usage counted as the whole budget)", got)
	}
	b, changed := limiter.BoundUsage(limiter.Usage{Prompt: -5, Completion: 1 << 62}, 0)
	if !changed || b != (limiter.Usage{Prompt: 0, Completion: limiter.MaxCallTokens}) {
		t.Fatalf("BoundUsage: %+v, %v", b, changed)
	}
	if _, changed := limiter.BoundUsage(limiter.Usage{Prompt: 10, Completion: 20}, 1000); changed {
		t.Fatal("BoundUsage changed a usage within its bounds")
	}
}

// provider_window is validated.
func TestProviderWindowValidated(t *testing.T) {
	for _, w := range []time.Duration{-time.Second, 2 * time.Hour} {
		c := cfgN(2)
		c.ProviderWindow = w
		var se *limiter.SettingError
		if err := c.Validate(); !errors.As(err, &se) || se.Setting != "provider_window" {
			t.Errorf("provider_window %s: %v, want a SettingError", w, err)
		}
	}
}

// A tenant whose calls used far more than their estimates has its next
// estimates raised by its own ratio (at most the lane's smallest budget);
// a tenant whose calls kept within their estimates is estimated as it
// says; a newcomer by the newcomers' record, which their first calls
// teach. The raise fades
// with a half-life of a minute. On the fake clock.
func TestCalibration(t *testing.T) {
	h := newHarness(t, budgetCfg(8, 60_000, 0))
	as := func(tenant string, n int64) context.Context { return limiter.WithTenant(costing(n), tenant) }
	inflight := func(id string, ctx context.Context) int64 {
		t.Helper()
		granted, r := h.call(ctx, "L", id, limiter.Default)
		if !granted || r.err != nil {
			t.Fatalf("%s: granted %v, %v", id, granted, r.err)
		}
		n := h.lane("L").Tokens.Inflight
		r.slot.Settle(limiter.Usage{Prompt: 5, Completion: 5}) // within any estimate: teaches nothing
		r.slot.Release()
		return n
	}
	// The honest tenant settles within its estimate; the liar at 5,000
	// times its estimate of 10.
	s := h.takeCost("honest", limiter.Default, 100)
	if n := inflight("h0", as("honest", 100)); n != 200 {
		t.Fatalf("in flight %d, want 100 + 100", n)
	}
	s.Settle(limiter.Usage{Prompt: 40, Completion: 40})
	s.Release()
	granted, r := h.call(as("liar", 10), "L", "l0", limiter.Default)
	if !granted {
		t.Fatal("the liar's first call waits")
	}
	r.slot.Settle(limiter.Usage{Prompt: 10, Completion: 49_990})
	r.slot.Release()
	h.clock.Advance(time.Minute) // the bucket full again; the ratio at half
	if n := inflight("l1", as("liar", 10)); n != 25_005 {
		t.Fatalf("the liar's next call is estimated at %d, want 25,005 (10 × (1 + 4,999 / 2))", n)
	}
	if n := inflight("h1", as("honest", 100)); n != 100 {
		t.Fatalf("the honest tenant's call is estimated at %d, want its own 100", n)
	}
	// A newcomer is estimated by the newcomers' record, which the liar's
	// first call taught: 100 × about 2,478, at most the budget, which
	// waits for a whole bucket (a second's refill).
	h.clock.Advance(time.Second)
	if n := inflight("n1", as("new", 100)); n != 60_000 {
		t.Fatalf("a new tenant's call is estimated at %d, want the budget, 60,000", n)
	}
	h.clock.Advance(30 * time.Minute)
	if n := inflight("l2", as("liar", 10)); n != 11 {
		t.Fatalf("after 30 min the liar's call is estimated at %d, want about its own 10", n)
	}
	if n := inflight("n2", as("newer", 100)); n != 101 {
		t.Fatalf("after 30 min a new tenant's call is estimated at %d, want about its own 100", n)
	}
}
