package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// costing returns a context whose call is estimated at n tokens.
func costing(n int64) context.Context { return limiter.WithTokens(context.Background(), n) }

func budgetCfg(slots int, tpm, inflightTokens int64) limiter.Config {
	c := cfgN(slots)
	c.QueueTimeout = time.Hour
	c.TokensPerMinute = tpm
	c.MaxInflightTokens = inflightTokens
	return c
}

// remaining returns the lane's budget left, as the snapshot says.
func (h *harness) remaining(key string) int64 {
	h.t.Helper()
	tk := h.lane(key).Tokens
	if tk == nil || tk.Remaining == nil {
		h.t.Fatalf("lane %s: no tokens remaining in the snapshot (%+v)", key, tk)
	}
	return *tk.Remaining
}

// takeCost starts a call estimated at n tokens that must be granted at once.
func (h *harness) takeCost(id string, p limiter.Priority, n int64) *limiter.Slot {
	h.t.Helper()
	granted, r := h.call(costing(n), "L", id, p)
	if !granted || r.err != nil {
		h.t.Fatalf("call %s: granted %v err %v, want an immediate slot", id, granted, r.err)
	}
	return &r.slot
}

// Settlement gives back what a call did not use at once, and takes what
// it used beyond its estimate. The clock never moves here: no refill.
func TestTokensSettle(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 10_000, 0))
	a := h.takeCost("a", limiter.Default, 1000)
	if got := h.remaining("L"); got != 9000 {
		t.Fatalf("after a 1,000-token grant: remaining %d, want 9000", got)
	}
	a.Settle(limiter.Usage{Prompt: 150, Completion: 50})
	if got := h.remaining("L"); got != 9800 {
		t.Fatalf("after settling 200 of 1,000: remaining %d, want 9800 (800 back at once)", got)
	}
	b := h.takeCost("b", limiter.Default, 1000)
	b.Settle(limiter.Usage{Prompt: 1000, Completion: 2000})
	if got := h.remaining("L"); got != 6800 {
		t.Fatalf("after settling 3,000 of 1,000: remaining %d, want 6800 (2,000 more taken)", got)
	}
	tk := h.lane("L").Tokens
	if tk.Inflight != 2000 {
		t.Fatalf("inflight tokens %d, want 2000: the estimates count until the release", tk.Inflight)
	}
	a.Release()
	b.Release()
	tk = h.lane("L").Tokens
	if tk.Inflight != 0 || tk.Used1m != (limiter.TokenCounts{Prompt: 1150, Completion: 2050}) {
		t.Fatalf("after the releases: %+v, want inflight 0 and used 1,150 prompt, 2,050 completion", tk)
	}
	if tk.EstimateError5m == nil || *tk.EstimateError5m != 0.6 {
		t.Fatalf("estimate error %v, want 0.6 (3,200 used for 2,000 estimated)", tk.EstimateError5m)
	}
	if got := h.remaining("L"); got != 6800 {
		t.Fatalf("remaining %d after the releases, want 6800: a release settles nothing more", got)
	}
}

// What a settlement gives back goes at once to the call waiting for it.
func TestTokensSettleGrantsWaiter(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 1000, 0))
	a := h.takeCost("a", limiter.Default, 1000)
	h.queue(costing(700), "L", "b", limiter.Default)
	if w := h.lane("L").Tokens.WaitingFor["default"]; w != limiter.WaitTokens {
		t.Fatalf("b waits for %q, want %q", w, limiter.WaitTokens)
	}
	h.noneEnded()
	a.Settle(limiter.Usage{Prompt: 150, Completion: 50})
	h.expectGrant("b").Release()
	a.Release()
}

// A waiter is never granted at its deadline: when the budget has room for
// it at the very instant its wait ends, it times out, whichever of the
// lane's two timers (its deadline, the budget's refill) fires first at that
// instant. The fake clock runs timers due together in the order they were
// set; the two cases set them in both orders.
func TestTokensDeadlineAtTheRefill(t *testing.T) {
	cfg := budgetCfg(10, 60, 0) // a token a second
	cfg.QueueTimeout = 30 * time.Second
	for _, c := range []struct {
		name             string
		refillTimerFirst bool
	}{{"deadline set first", false}, {"refill set first", true}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, cfg)
			a := h.takeCost("a", limiter.Default, 60) // the bucket is empty
			due := 30 * time.Second
			if c.refillTimerFirst {
				// g's refill timer is set for 35 s; g leaves, and the
				// timer stays. h's deadline (35 s) is set after it, and
				// h's refill (35 s too) keeps it.
				ctx, cancel := context.WithCancel(costing(35))
				h.queue(ctx, "L", "g", limiter.Default)
				cancel()
				h.expectEnds(map[string]string{"g": "canceled"})
				h.clock.Advance(5 * time.Second)
				h.queue(costing(35), "L", "h", limiter.Default)
			} else {
				h.queue(costing(30), "L", "h", limiter.Default)
			}
			h.clock.Advance(due - time.Nanosecond)
			h.noneEnded()
			h.clock.Advance(time.Nanosecond)
			h.expectEnds(map[string]string{"h": "no slot after waiting"})
			if l := h.lane("L"); l.Inflight != 1 || l.Queued != 0 {
				t.Fatalf("inflight %d queued %d, want a's slot alone", l.Inflight, l.Queued)
			}
			a.Release()
		})
	}
}

// With the budget spent, the refill goes to the calls in the lane's order:
// an interactive call first, then by age; the bucket refills at
// TokensPerMinute per minute.
func TestTokensRefillOrder(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 1200, 0)) // 20 tokens a second
	a := h.takeCost("a", limiter.Default, 1200)
	h.queue(costing(100), "L", "b1", limiter.Bulk)
	h.queue(costing(100), "L", "b2", limiter.Bulk)
	h.queue(costing(100), "L", "i1", limiter.Interactive)
	h.clock.Advance(4900 * time.Millisecond)
	h.noneEnded()
	h.clock.Advance(100 * time.Millisecond) // 100 tokens in
	h.expectGrant("i1")
	h.clock.Advance(5 * time.Second)
	h.expectGrant("b1")
	h.clock.Advance(5 * time.Second)
	h.expectGrant("b2")
	a.Release()
}

// Aging holds while the budget is what waiters wait for: a bulk call that
// has waited a minute ranks with default calls and, older, goes before a
// default call that came later, although both fit.
func TestTokensAging(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 6000, 0)) // 100 tokens a second
	a := h.takeCost("a", limiter.Default, 6000)
	h.queue(costing(6000), "L", "bulk", limiter.Bulk)
	h.clock.Advance(30 * time.Second)
	h.queue(costing(6000), "L", "default", limiter.Default)
	h.clock.Advance(29 * time.Second)
	h.noneEnded()
	h.clock.Advance(time.Second) // 60 s: the bucket is full, the bulk call has aged
	h.expectGrant("bulk")
	h.clock.Advance(time.Minute)
	h.expectGrant("default")
	a.Release()
}

// The tenant share holds when tokens are what is short: a tenant that has
// had nothing goes before the next call of one that has.
func TestTokensTenantShare(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 600, 0)) // 10 tokens a second
	ctxA := limiter.WithTokens(limiter.WithTenant(context.Background(), "a"), 300)
	ctxB := limiter.WithTokens(limiter.WithTenant(context.Background(), "b"), 300)
	granted, r := h.call(ctxA, "L", "a1", limiter.Bulk)
	granted2, r2 := h.call(ctxA, "L", "a2", limiter.Bulk)
	if !granted || !granted2 {
		t.Fatalf("a1, a2: granted %v %v, want both (600 tokens)", granted, granted2)
	}
	h.queue(ctxA, "L", "a3", limiter.Bulk)
	h.queue(ctxB, "L", "b1", limiter.Bulk)
	h.clock.Advance(30 * time.Second)
	h.expectGrant("b1")
	h.clock.Advance(30 * time.Second)
	h.expectGrant("a3")
	r.slot.Release()
	r2.slot.Release()
}

// max_inflight_tokens bounds the estimates in flight; a release makes room.
func TestTokensMaxInflight(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 0, 1000))
	a := h.takeCost("a", limiter.Default, 600)
	h.queue(costing(600), "L", "b", limiter.Default)
	// A call of no estimate fits any budget, but waits its turn: the line
	// is the lane's order, which the first waiter holds.
	h.queue(context.Background(), "L", "small", limiter.Default)
	h.noneEnded()
	a.Release()
	for _, s := range h.expectEnds(map[string]string{"b": "ok", "small": "ok"}) {
		s.Release()
	}
	if tk := h.lane("L").Tokens; tk.Inflight != 0 || tk.Remaining != nil {
		t.Fatalf("tokens %+v, want nothing in flight and no tokens_per_minute remaining", tk)
	}
}

// A call larger than a whole budget is refused at once, naming it; so is a
// waiter that a reload leaves too large.
func TestTokensTooLarge(t *testing.T) {
	h := newHarness(t, budgetCfg(10, 1000, 800))
	for _, c := range []struct {
		n      int64
		budget string
	}{{1500, "tokens_per_minute"}, {900, "max_inflight_tokens"}} {
		_, err := h.lim.Acquire(costing(c.n), "L")
		var te *limiter.TokenBudgetError
		if !errors.As(err, &te) || !errors.Is(err, limiter.ErrTokenBudget) || te.Budget != c.budget || te.Tokens != c.n {
			t.Fatalf("a call of %d tokens: err %v, want a *TokenBudgetError naming %s", c.n, err, c.budget)
		}
	}
	a := h.takeCost("a", limiter.Default, 800)
	h.queue(costing(700), "L", "b", limiter.Default)
	cfg := h.lim.Config()
	cfg.TokensPerMinute = 600
	if err := h.lim.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	h.expectEnds(map[string]string{"b": "more than the whole tokens_per_minute (600)"})
	a.Release()
	h.expectCounts("L", 0, 0)
}

// With no budget configured, the provider's headers bound the grants until
// their reset: what remains, refilling towards the limit.
func TestTokensFollowProvider(t *testing.T) {
	h := newHarness(t, cfgN(10))
	first := h.take("L", "first", limiter.Default) // makes the lane
	h.lim.RecordLimits(context.Background(), "L", limiter.ProviderLimits{
		Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: 500, Reset: 30 * time.Second}})
	a := h.takeCost("a", limiter.Default, 400)
	h.queue(costing(400), "L", "b", limiter.Default)
	if w := h.lane("L").Tokens.WaitingFor["default"]; w != limiter.WaitProvider {
		t.Fatalf("b waits for %q, want %q", w, limiter.WaitProvider)
	}
	// 100 left; 300 more come in 18 s (500 tokens in 30 s).
	h.clock.Advance(17900 * time.Millisecond)
	h.noneEnded()
	h.clock.Advance(200 * time.Millisecond)
	h.expectGrant("b").Release() // at 18 s, the bucket empty
	a.Release()
	// Past the reset (30 s) the lane keeps the provider's bucket as the
	// headers described it, refilling at 500 tokens in 30 s: it took 800
	// from 500, so it is whole at 78 s, not at the reset.
	h.clock.Advance(59800 * time.Millisecond) // 77.9 s
	h.queue(costing(1000), "L", "c", limiter.Default)
	if w := h.lane("L").Tokens.WaitingFor["default"]; w != limiter.WaitProvider {
		t.Fatalf("past the reset, c waits for %q, want %q", w, limiter.WaitProvider)
	}
	h.clock.Advance(100 * time.Millisecond)
	h.expectGrant("c").Release()
	// Whole again 60 s after c took it all: then the headers bound nothing.
	h.clock.Advance(time.Minute)
	for i := range 3 {
		h.takeCost("d"+string(rune('0'+i)), limiter.Default, 900).Release()
	}
	first.Release()
}

// A 429's Retry-After holds the lane's grants until it has passed, free
// slots or not; a hold is at most MaxRetryAfterHold.
func TestTokensRetryAfterHolds(t *testing.T) {
	h := newHarness(t, cfgN(10))
	h.take("L", "first", limiter.Default).Release()
	h.lim.RecordLimits(context.Background(), "L", limiter.ProviderLimits{RetryAfter: 5 * time.Second})
	h.queue(context.Background(), "L", "b", limiter.Interactive)
	if w := h.lane("L").Tokens.WaitingFor["interactive"]; w != limiter.WaitRetryAfter {
		t.Fatalf("b waits for %q, want %q", w, limiter.WaitRetryAfter)
	}
	h.clock.Advance(4900 * time.Millisecond)
	h.noneEnded()
	h.clock.Advance(100 * time.Millisecond)
	h.expectGrant("b").Release()

	h.lim.RecordLimits(context.Background(), "L", limiter.ProviderLimits{RetryAfter: time.Hour})
	h.queue(context.Background(), "L", "c", limiter.Interactive)
	h.clock.Advance(limiter.MaxRetryAfterHold - time.Millisecond)
	h.noneEnded()
	h.clock.Advance(time.Millisecond)
	h.expectGrant("c").Release()
}

// Token budgets are refused with a Backend, which does not decide them.
func TestTokensNotWithBackend(t *testing.T) {
	cfg := budgetCfg(2, 1000, 0)
	_, err := limiter.New(cfg, limiter.WithBackend(nopBackend{}))
	var se *limiter.SettingError
	if !errors.As(err, &se) || se.Setting != "tokens_per_minute" {
		t.Fatalf("New with a backend and a budget: %v, want a SettingError for tokens_per_minute", err)
	}
}

type nopBackend struct{}

func (nopBackend) Acquire(context.Context, limiter.Request) (limiter.Lease, error) {
	return nil, limiter.ErrLaneUnavailable
}

func (nopBackend) Lanes(context.Context, []string) map[string]limiter.SharedLane { return nil }

// Reloading the budgets while calls come and go loses no slot and no
// token: once every call has ended nothing is in flight, and the bucket
// holds exactly its first size less what the calls used (the clock never
// moves, so nothing refills, and every reload keeps the size at or above
// the first, so no token is cut by a smaller bucket).
func TestTokensReloadUnderLoad(t *testing.T) {
	const first = 1_000_000
	h := newHarness(t, budgetCfg(4, first, 3000))
	h.take("L", "first", limiter.Default).Release() // the bucket starts full, at the first size
	var used, held, heldTokens atomic.Int64
	var load, reloads sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				est := 1 + rng.Int64N(1000)
				s, err := h.lim.Acquire(costing(est), "L")
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if n := held.Add(1); n > 4 {
					t.Errorf("%d slots held, limit 4", n)
				}
				if n := heldTokens.Add(est); n > 6000 {
					t.Errorf("%d tokens in flight, above the larger max_inflight_tokens (6000)", n)
				}
				u := limiter.Usage{Prompt: rng.Int64N(est + 1), Completion: rng.Int64N(500)}
				s.Settle(u)
				used.Add(u.Total())
				heldTokens.Add(-est)
				held.Add(-1)
				s.Release()
			}
		}()
	}
	reloads.Add(1)
	go func() {
		defer reloads.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cfg := h.lim.Config()
			cfg.TokensPerMinute = first + int64(i%3)*1000
			cfg.MaxInflightTokens = []int64{3000, 6000, 0}[i%3]
			cfg.MaxInflight = 2 + i%3
			if err := h.lim.SetConfig(cfg); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	load.Wait()
	close(stop)
	reloads.Wait()
	tk := h.lane("L").Tokens
	h.expectCounts("L", 0, 0)
	if tk.Inflight != 0 {
		t.Fatalf("inflight tokens %d after every call ended, want 0", tk.Inflight)
	}
	if want := first - used.Load(); *tk.Remaining != want {
		t.Fatalf("remaining %d, want %d (the first size less the %d tokens used)", *tk.Remaining, want, used.Load())
	}
}

// The provider counts what remains when a call arrives; its answer comes
// later. The count holds the call that carried it, and every call answered
// before that one was granted; any other call holding a slot may reach the
// provider after it, and is counted again, at its estimate or, once
// settled, its use. Without the reporting call's slot every holder is.
// The count refills from the send time (At).
func TestTokensProviderCount(t *testing.T) {
	h := newHarness(t, cfgN(10))
	ctx := context.Background()
	said := func(s *limiter.Slot, remaining int64, at time.Time) int64 {
		t.Helper()
		pl := limiter.ProviderLimits{At: at, Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: remaining, Reset: time.Minute}}
		if s != nil {
			pl.Slot = *s
		}
		h.lim.RecordLimits(ctx, "L", pl)
		return *h.lane("L").Tokens.Remaining
	}
	a := h.takeCost("a", limiter.Default, 100)
	b := h.takeCost("b", limiter.Default, 200)
	if got := said(a, 900, time.Time{}); got != 700 {
		t.Fatalf("a's count: %d remain, want 700 (900, less b's 200: granted after a, not yet answered)", got)
	}
	if got := said(b, 700, time.Time{}); got != 600 {
		t.Fatalf("b's count: %d remain, want 600 (700, less a's 100: answered after b was granted)", got)
	}
	c := h.takeCost("c", limiter.Default, 300)
	granted := h.clock.Now()
	h.clock.Advance(6 * time.Second)
	// a and b answered before c was granted: c's count holds them. It was
	// counted 6 s ago: 1,000 a minute, 100 refilled.
	if got := said(c, 400, granted); got != 500 {
		t.Fatalf("c's count: %d remain, want 500 (400 counted 6 s ago, nothing counted again)", got)
	}
	c.Settle(limiter.Usage{Prompt: 10, Completion: 40})
	if got := said(nil, 1000, time.Time{}); got != 1000-100-200-50 {
		t.Fatalf("a count of no known call: %d remain, want %d (every holder counted again, c at its use)", got, 1000-100-200-50)
	}
	b.Release()
	if got := said(b, 1000, time.Time{}); got != 1000-100-50 {
		t.Fatalf("a count of a released call: %d remain, want %d (every holder counted again)", got, 1000-100-50)
	}
	a.Release()
	c.Release()
}

// Calls that carry no estimate, on a lane with no budget, are granted
// before the lane keeps any token accounting; the provider's request count
// must still count them again, and a call granted before the first answer
// must count every later answer (none came before its grant).
func TestTokensProviderCountBeforeAccounting(t *testing.T) {
	h := newHarness(t, cfgN(10))
	ctx := context.Background()
	said := func(s *limiter.Slot, remaining int64) int64 {
		t.Helper()
		h.lim.RecordLimits(ctx, "M", limiter.ProviderLimits{Slot: *s, Requests: limiter.ProviderBudget{Known: true, Limit: 100, Remaining: remaining, Reset: time.Minute}})
		p := h.lane("M").Tokens.Provider
		if p == nil || p.Requests == nil {
			t.Fatal("no provider request budget in the snapshot")
		}
		return p.Requests.Remaining
	}
	x := h.take("M", "x", limiter.Default)
	y := h.take("M", "y", limiter.Default)
	if got := said(x, 50); got != 49 {
		t.Fatalf("x's count: %d remain, want 49 (50, less y: granted after x, not yet answered)", got)
	}
	z := h.take("M", "z", limiter.Default)
	if got := said(y, 40); got != 38 {
		t.Fatalf("y's count: %d remain, want 38 (40, less x, answered after y was granted, and z)", got)
	}
	if got := said(z, 30); got != 29 {
		t.Fatalf("z's count: %d remain, want 29 (30, less y: answered after z was granted; x answered before)", got)
	}
	x.Release()
	y.Release()
	z.Release()
}

// Fair shares count tokens where calls carry estimates: of two tenants
// backlogged in one class, one whose calls cost 4,000 tokens and one whose
// calls cost 1,000, each gets the same tokens, so the second about four
// calls to the first's one, within one call of the larger (start-time
// fair queuing's bound on one slot), at every grant. Slot-time alone
// would alternate them.
func TestFairSharesByTokens(t *testing.T) {
	cfg := cfgN(1)
	cfg.QueueTimeout = time.Hour
	h := newHarness(t, cfg)
	cost := map[string]int64{"long": 4000, "short": 1000}
	ctxOf := func(tn string) context.Context {
		return limiter.WithTokens(limiter.WithTenant(context.Background(), tn), cost[tn])
	}
	n := 0
	queue := func(tn string) {
		n++
		h.queue(ctxOf(tn), "L", fmt.Sprintf("%s-%d", tn, n), limiter.Interactive)
	}
	granted, r := h.call(ctxOf("long"), "L", "long-0", limiter.Interactive)
	if !granted {
		t.Fatal("the first call queued")
	}
	for range 3 {
		queue("long")
		queue("short")
	}
	got := map[string]int64{"long": cost["long"]}
	calls := map[string]int{"long": 1}
	slot := &r.slot
	for range 60 {
		h.clock.Advance(time.Second) // every call holds its slot 1 s
		slot.Release()
		next := h.next()
		if next.err != nil {
			t.Fatal(next.err)
		}
		tn := next.id[:strings.IndexByte(next.id, '-')]
		got[tn] += cost[tn]
		calls[tn]++
		if d := got["long"] - got["short"]; d > 4000 || d < -4000 {
			t.Fatalf("after %v grants: tokens %v differ by more than the largest call's 4,000", calls, got)
		}
		slot = &next.slot
		queue(tn)
	}
	h.lim.Shutdown() // before the release, which then grants no one
	slot.Release()
	for range 6 { // the calls still queued are refused
		if r := h.next(); !errors.Is(r.err, limiter.ErrShuttingDown) {
			t.Fatalf("%s: %v", r.id, r.err)
		}
	}
	if calls["short"] < 3*calls["long"] {
		t.Fatalf("grants %v: want about four short calls to a long one", calls)
	}
}
