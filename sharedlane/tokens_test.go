package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// Two processes share one lane's token budget in Redis, decided with the
// slot, on a clock the test moves (Config.Clock): 1,000 tokens a minute. A
// call of 600 in one process leaves no room for a call of 600 in the
// other, which waits with slots free; the first call's settlement (it used
// 100) gives 500 back at once, and the waiter is granted; the bucket
// refills at 1,000 a minute; a call larger than the whole budget is
// refused at once.
func TestSharedTokenBudget(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 8, QueueTimeout: time.Hour, TokensPerMinute: 1000}
	now := func(c *Config) { c.Clock = clock }
	a, b := newProcess(t, r.URL(), "a", cfg, now), newProcess(t, r.URL(), "b", cfg, now)
	cost := func(n int64) context.Context { return limiter.WithTokens(context.Background(), n) }

	c1 := a.start(cost(600), limiter.Default).wait(t)
	if c1.err != nil {
		t.Fatal(c1.err)
	}
	c2 := b.start(cost(600), limiter.Default)
	queuedGlobally(t, a, 1)
	s := a.lim.Snapshot().Lanes[0]
	if s.Tokens == nil || s.Tokens.Remaining == nil || *s.Tokens.Remaining != 400 || s.Tokens.Inflight != 600 {
		t.Fatalf("tokens %+v, want 400 remaining and 600 in flight, across both processes", s.Tokens)
	}
	if c2.ended() {
		t.Fatal("the second call was granted past the budget")
	}
	c1.slot.Settle(limiter.Usage{Prompt: 60, Completion: 40})
	if c2.wait(t).err != nil {
		t.Fatal(c2.err)
	}
	if s := b.lim.Snapshot().Lanes[0].Tokens; *s.Remaining != 300 || s.Inflight != 1200 {
		t.Fatalf("after the settlement and the grant: %+v, want 300 remaining, 1,200 estimated in flight", s)
	}
	// 900 more wanted: 600 come in 36 s of the test's clock. The waiter
	// looks again every PollEvery.
	c3 := a.start(cost(900), limiter.Default)
	queuedGlobally(t, b, 1)
	clock.Advance(30 * time.Second) // 300 + 500: not yet
	time.Sleep(150 * time.Millisecond)
	if c3.ended() {
		t.Fatal("granted before the budget refilled")
	}
	clock.Advance(7 * time.Second)
	if c3.wait(t).err != nil {
		t.Fatal(c3.err)
	}
	if _, err := b.lim.Acquire(cost(1500), lane); !errors.Is(err, limiter.ErrTokenBudget) {
		t.Fatalf("a call of 1,500 tokens: %v, want a TokenBudgetError at once", err)
	}
	for _, c := range []*call{c1, c2, c3} {
		c.slot.Release()
	}
	if s := a.lim.Snapshot().Lanes[0].Tokens; s.Inflight != 0 {
		t.Fatalf("after the releases: %+v, want nothing in flight", s)
	}
	noResidue(t, r)
}

// When the first in line, held back by the token budget, leaves, the
// calls behind it that fit are granted then, by the leave itself: the
// processes here never poll (PollEvery an hour), so a grant can come only
// from an op that dispatches. Process b's call of 900 waits for the bucket
// (400 of 1,000 left); a's call of 100 waits behind it; b's caller gives
// up, and a's call is granted by b's leave (scenario head-leaves.txt).
func TestSharedHeadLeaves(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 8, QueueTimeout: time.Hour, TokensPerMinute: 1000}
	still := func(c *Config) { c.Clock, c.PollEvery, c.LeaseTTL = clock, time.Hour, time.Hour }
	a, b := newProcess(t, r.URL(), "a", cfg, still), newProcess(t, r.URL(), "b", cfg, still)
	cost := func(n int64) context.Context { return limiter.WithTokens(context.Background(), n) }
	// Redis started long ago: no quiet time after its start (a lease's
	// time, an hour here) holds the grants.
	if err := a.b.rdb.HSet(context.Background(), a.b.keysOf(lane).keys[8], "boot", clock.Now().Add(-2*time.Hour).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}

	c1 := a.start(cost(600), limiter.Default).wait(t)
	if c1.err != nil {
		t.Fatal(c1.err)
	}
	c2 := b.start(cost(900), limiter.Default)
	queuedGlobally(t, a, 1)
	c3 := a.start(cost(100), limiter.Default)
	queuedGlobally(t, b, 2)
	c2.cancel()
	if !errors.Is(c2.wait(t).err, context.Canceled) {
		t.Fatalf("the call that gave up: %v", c2.err)
	}
	// Read in Redis, with no op that would dispatch: the leave granted it.
	// (A place's renewal may also dispatch, within a second; read at once,
	// the leave's own dispatch is what this sees.)
	if n, err := a.b.rdb.HLen(context.Background(), a.b.keysOf(lane).keys[3]).Result(); err != nil || n != 0 {
		t.Fatalf("after the leave: %d waiting (%v), want the call behind it granted by the leave", n, err)
	}
	if c3.wait(t).err != nil {
		t.Fatal(c3.err)
	}
	c1.slot.Release()
	c3.slot.Release()
}

// The provider's rate-limit headers bind a shared lane in every process,
// with no budget configured, on a clock the test moves. Process a's call
// of 600 is answered: 400 of 1,000 remain, reset in 36 s (1,000 a minute).
// Its call of 300 then leaves 100. That call's answer says 100 remain, as
// the provider counted when it arrived; b's call of 100, not yet answered,
// may have reached it later and is counted again (a's first call, answered
// before that call was granted, is not), so b's next call of 600 waits, with slots free, for all
// 600: 36 s. The snapshots of both processes say what the provider said. A
// 429's Retry-After, reported by b, then holds a's interactive call for
// its 5 s.
func TestSharedProviderLimits(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 8, QueueTimeout: time.Hour}
	now := func(c *Config) { c.Clock = clock }
	a, b := newProcess(t, r.URL(), "a", cfg, now), newProcess(t, r.URL(), "b", cfg, now)
	cost := func(n int64) context.Context { return limiter.WithTokens(context.Background(), n) }
	report := func(p *process, c *call, remaining int64, reset time.Duration) {
		p.lim.RecordLimits(context.Background(), lane, limiter.ProviderLimits{Slot: c.slot,
			Tokens: limiter.ProviderBudget{Known: true, Limit: 1000, Remaining: remaining, Reset: reset}})
	}
	granted := func(p *process, n int64, prio limiter.Priority) *call {
		t.Helper()
		c := p.start(cost(n), prio).wait(t)
		if c.err != nil {
			t.Fatal(c.err)
		}
		return c
	}
	remaining := func(want int64, ps ...*process) {
		t.Helper()
		for _, p := range ps {
			s := p.lim.Snapshot().Lanes
			if len(s) != 1 || s[0].Tokens == nil || s[0].Tokens.Provider == nil || s[0].Tokens.Provider.Tokens == nil ||
				s[0].Tokens.Provider.Tokens.Remaining != want || s[0].Tokens.Provider.Tokens.Limit != 1000 {
				t.Fatalf("process %s: tokens %+v, want the provider's %d of 1,000 remaining", p.b.cfg.Process, s[0].Tokens, want)
			}
		}
	}

	c1 := granted(a, 600, limiter.Default)
	report(a, c1, 400, 36*time.Second)
	remaining(400, a)
	c2 := granted(a, 300, limiter.Default)
	remaining(100, a)
	c3 := granted(b, 100, limiter.Default)
	report(a, c2, 100, 54*time.Second) // c3 came after c2's count
	remaining(0, a, b)
	c4 := b.start(cost(600), limiter.Default)
	queuedGlobally(t, a, 1)
	clock.Advance(35 * time.Second) // 583: not yet
	time.Sleep(150 * time.Millisecond)
	if c4.ended() {
		t.Fatal("granted before the provider's budget refilled")
	}
	clock.Advance(time.Second)
	if c4.wait(t).err != nil {
		t.Fatal(c4.err)
	}

	b.lim.RecordLimits(context.Background(), lane, limiter.ProviderLimits{Slot: c4.slot, RetryAfter: 5 * time.Second})
	c5 := a.start(context.Background(), limiter.Interactive)
	queuedGlobally(t, b, 1)
	if s := b.lim.Snapshot().Lanes[0].Tokens; s == nil || s.Provider == nil || s.Provider.RetryAfter != 5 {
		t.Fatalf("tokens %+v, want the provider's hold of 5 s", s)
	}
	clock.Advance(4 * time.Second)
	time.Sleep(150 * time.Millisecond)
	if c5.ended() {
		t.Fatal("granted during the Retry-After")
	}
	clock.Advance(time.Second)
	if c5.wait(t).err != nil {
		t.Fatal(c5.err)
	}
	for _, c := range []*call{c1, c2, c3, c4, c5} {
		c.slot.Release()
	}
	// The provider's word binds until its budget is whole again (at most
	// two windows), then goes: a look at the lane then forgets it.
	// The look is repeated: an op of a renewal built before the clock's
	// jump (its time read then) may reach Redis after a look, under load,
	// and write the word back as of then; the next look forgets it.
	clock.Advance(2 * time.Minute)
	for deadline := time.Now().Add(10 * time.Second); len(r.Keys()) > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		a.lim.Snapshot()
	}
	noResidue(t, r)
}

// Fair shares count tokens on a shared lane too, once calls carry
// estimates: of two tenants backlogged in one class through two processes,
// one whose calls cost 4,000 tokens and one whose calls cost 1,000 get the
// same tokens (the second about four calls to the first's one), within one
// call of the larger at every grant. The test's clock stands still, so
// every call holds the slot as long (and no lease lapses): slot-time alone
// would alternate them.
func TestSharedFairSharesByTokens(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 1, QueueTimeout: time.Hour}
	now := func(c *Config) { c.Clock = clock }
	procs := map[string]*process{"long": newProcess(t, r.URL(), "a", cfg, now), "short": newProcess(t, r.URL(), "b", cfg, now)}
	cost := map[string]int64{"long": 4000, "short": 1000}
	waiting := map[*call]string{}
	queue := func(tn string) {
		waiting[procs[tn].start(limiter.WithTokens(limiter.WithTenant(context.Background(), tn), cost[tn]), limiter.Interactive)] = tn
	}
	first := procs["long"].start(limiter.WithTokens(limiter.WithTenant(context.Background(), "long"), 4000), limiter.Interactive).wait(t)
	if first.err != nil {
		t.Fatal(first.err)
	}
	for range 3 {
		queue("long")
		queue("short")
	}
	queuedGlobally(t, procs["long"], 6)
	got, calls := map[string]int64{"long": 4000}, map[string]int{"long": 1}
	holder := first
	for range 20 {
		holder.slot.Release()
		var next *call
		for deadline := time.Now().Add(10 * time.Second); next == nil; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no call was granted")
			}
			for c := range waiting {
				if c.ended() {
					next = c
				}
			}
		}
		tn := waiting[next]
		delete(waiting, next)
		if next.err != nil {
			t.Fatal(next.err)
		}
		got[tn] += cost[tn]
		calls[tn]++
		if d := got["long"] - got["short"]; d > 4000 || d < -4000 {
			t.Fatalf("after %v grants: tokens %v differ by more than the largest call's 4,000", calls, got)
		}
		holder = next
		queue(tn)
		queuedGlobally(t, procs["long"], 6)
	}
	if calls["short"] < 3*calls["long"] {
		t.Fatalf("grants %v: want about four short calls to a long one", calls)
	}
	holder.slot.Release()
	for c := range waiting {
		c.cancel()
		c.wait(t)
		if c.err == nil {
			c.slot.Release()
		}
	}
	noResidue(t, r)
}

// A Redis that restarts empty forgets what the minute before took, and a
// bucket made afresh on top of it let two minutes' tokens into one (151,000
// in 40 s on a lane of 60,000 a minute). The process whose call was running
// takes its slot again (its renewal finds the lease gone), and within a
// minute of the server's start that reclaim empties the bucket before
// taking the call's estimate from it: the minute after the restart grants
// at most one bucket, the running call's included. On a clock the test
// moves: a call of 50,000 runs across the restart; eight calls of 10,000
// then wait 60 s for the first of them (the bucket refills from -50,000 at
// 1,000 a second), where a fresh full bucket granted six at once.
func TestSharedTokenBudgetRestartedEmpty(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 16, QueueTimeout: time.Hour, TokensPerMinute: 60_000}
	// Leases of 10 s on the test's clock, which moves in steps of at most
	// 9 s, each followed by the renewals: a lease that lapsed in one jump
	// of the clock was swept before its renewal (under make stress), and
	// the running call, taken again, was charged again.
	const ttl = 10 * time.Second
	a := newProcess(t, r.URL(), "a", cfg, func(c *Config) { c.Clock, c.LeaseTTL = clock, ttl })
	rdb := a.b.rdb
	keys := a.b.keysOf(lane).keys
	hkey, qxkey, mkey := keys[0], keys[2], keys[8]
	// This Redis started long ago, as far as the first call can tell (no
	// quiet time before it); after the restart, its quiet time (a lease)
	// is over, and the restart less than a minute ago.
	boot := func(ago time.Duration) {
		if err := rdb.HSet(context.Background(), mkey, "boot", clock.Now().Add(-ago).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	boot(2 * time.Hour)
	cost := func(n int64) context.Context { return limiter.WithTokens(context.Background(), n) }
	big := a.start(cost(50_000), limiter.Default).wait(t)
	if big.err != nil {
		t.Fatal(big.err)
	}
	r.Restart()
	eventually(t, "the running call's slot taken again", func() bool { return rdb.ZCard(context.Background(), hkey).Val() == 1 })
	boot(ttl + time.Second)
	var calls []*call
	for range 8 {
		calls = append(calls, a.start(cost(10_000), limiter.Default))
	}
	queuedGlobally(t, a, 8)
	advance := func(d time.Duration) {
		for d > 0 {
			step := min(d, 9*time.Second)
			clock.Advance(step)
			d -= step
			now := float64(clock.Now().Add(ttl / 2).UnixMilli())
			eventually(t, "every lease renewed", func() bool {
				for _, k := range []string{hkey, qxkey} {
					if n := rdb.ZCount(context.Background(), k, "-inf", fmt.Sprint(now)).Val(); n > 0 {
						return false
					}
				}
				return true
			})
		}
	}
	advance(59 * time.Second)
	time.Sleep(300 * time.Millisecond) // several polls
	granted := 0
	for _, c := range calls {
		if c.ended() {
			granted++
		}
	}
	if granted > 0 {
		t.Fatalf("%d calls of 10,000 granted in the 59 s after the restart, beside the 50,000 running: want none", granted)
	}
	// 61 s: 11,000 tokens: one call of 10,000, whichever the lane's order
	// puts first (the eight started together), and no second.
	advance(2 * time.Second)
	ended := func() (n int, first *call) {
		for _, c := range calls {
			if c.ended() {
				n++
				first = c
			}
		}
		return n, first
	}
	eventually(t, "one call granted at 61 s", func() bool { n, _ := ended(); return n > 0 })
	time.Sleep(300 * time.Millisecond) // several polls
	n, first := ended()
	if n != 1 || first.err != nil {
		t.Fatalf("%d calls ended at 61 s (the first with %v), want one granted", n, first.err)
	}
	for _, c := range calls {
		if c != first {
			c.cancel()
			if c.wait(t); c.err == nil {
				c.slot.Release()
			}
		}
	}
	first.slot.Release()
	big.slot.Release()
}
