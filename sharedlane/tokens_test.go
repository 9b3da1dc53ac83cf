package sharedlane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Two processes share one lane's token budget in Redis, decided with the
// slot, on a clock the test moves (Config.Now): 1,000 tokens a minute. A
// call of 600 in one process leaves no room for a call of 600 in the
// other, which waits with slots free; the first call's settlement (it used
// 100) gives 500 back at once, and the waiter is granted; the bucket
// refills at 1,000 a minute; a call larger than the whole budget is
// refused at once.
func TestSharedTokenBudget(t *testing.T) {
	r := startRedis(t)
	clock := &fakeNow{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	cfg := limiter.Config{MaxInflight: 8, QueueTimeout: time.Hour, TokensPerMinute: 1000}
	now := func(c *Config) { c.Now = clock.now }
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
	clock.advance(30 * time.Second) // 300 + 500: not yet
	time.Sleep(150 * time.Millisecond)
	if c3.ended() {
		t.Fatal("granted before the budget refilled")
	}
	clock.advance(7 * time.Second)
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
