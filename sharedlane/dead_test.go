package sharedlane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// A process dies holding slots and places, deterministically: on one
// fake clock (Config.Clock) with leases of an hour that no renewal moves,
// process a holds slots and queues 3 calls, process b holds 2
// (interactive) and queues 2, then a goes silent (its connection
// blocked) and b's leases are renewed by hand, as b's renewals would;
// the clock passes a's leases. The next op of b's (its snapshot's read)
// sweeps a's lapsed slots and places in one call, and grants b's waiters
// what a's slots free.
//
// With a's 2 slots on a lane of 4, both of b's waiters are granted at
// once: none is left queued while slots are free.
func TestDeadProcessSweptInOneCall(t *testing.T) {
	t.Parallel()
	b, waiting := deadProcess(t, 4, 2)
	l := b.lim.Snapshot().Lanes[0] // b's read sweeps and dispatches
	for i, c := range waiting {
		if !grantedSoon(c) {
			t.Fatalf("b's waiter %d still queued with slots free: %+v %+v", i, l, l.Shared)
		}
	}
}

// With a's one slot on a lane of 3, the sweep grants b's first waiter and
// the second waits for a slot: when b gives one back, it is granted. (A
// sweep that dropped a's places counted the queue one short, and deleted
// m's since as it granted the first waiter: the lane then read as empty,
// and the second waiter stayed queued while its slot was free, until its
// queue timeout: TestKilledProcessFreesItsSlots, 3 runs in 20 under
// load.)
func TestDeadProcessLeavesNoWaiterBehind(t *testing.T) {
	t.Parallel()
	b, waiting := deadProcess(t, 3, 1)
	l := b.lim.Snapshot().Lanes[0]
	if !grantedSoon(waiting[0]) {
		t.Fatalf("b's first waiter still queued with a slot free: %+v %+v", l, l.Shared)
	}
	if waiting[1].ended() {
		t.Fatalf("b's second waiter ended with no slot free: %v", waiting[1].err)
	}
	if l := b.lim.Snapshot().Lanes[0]; l.Queued != 1 {
		t.Fatalf("queued %d, want b's second waiter", l.Queued)
	}
	waiting[0].slot.Release()
	if !grantedSoon(waiting[1]) {
		l := b.lim.Snapshot().Lanes[0]
		t.Fatalf("b's second waiter still queued with a slot free: %+v %+v", l, l.Shared)
	}
}

// grantedSoon reports whether c is granted within 10 s.
func grantedSoon(c *call) bool {
	select {
	case <-c.done:
		return c.err == nil
	case <-time.After(10 * time.Second):
		return false
	}
}

// deadProcess sets up the lane of limit slots, 1 reserved, where a holds
// aSlots (default) and queues 3 calls, b holds 2 (interactive) and queues
// 2, then a dies and its leases lapse on the clock. It returns b and its
// two waiters.
func deadProcess(t *testing.T, limit, aSlots int) (*process, []*call) {
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: limit, InteractiveReserve: 1, QueueTimeout: 48 * time.Hour}
	mk := func(name, url string) *process {
		p := newProcess(t, url, name, cfg, func(c *Config) {
			c.LeaseTTL, c.PollEvery, c.Clock, c.KeyPrefix = time.Hour, time.Hour, clock, "dead"
		})
		p.lim, _ = limiter.New(cfg, limiter.WithBackend(p.b), limiter.WithClock(clock))
		return p
	}
	proxy := redistest.NewProxy(t, r.Addr())
	a := mk("a", "redis://"+proxy.Addr())
	b := mk("b", r.URL())
	ctx := context.Background()
	lk := b.b.keysOf(lane)
	if err := b.b.rdb.HSet(ctx, lk.keys[8], "boot", clock.Now().Add(-2*time.Hour).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	held := []*call{b.start(ctx, limiter.Interactive), b.start(ctx, limiter.Interactive)}
	for range aSlots {
		held = append(held, a.start(ctx, limiter.Default))
	}
	for _, c := range held {
		if c.wait(t).err != nil {
			t.Fatal(c.err)
		}
	}
	var waiting []*call
	for _, p := range []*process{a, a, a, b, b} {
		waiting = append(waiting, p.start(ctx, limiter.Default))
		waitQueued(t, b, len(waiting))
	}
	proxy.Block() // a dies: nothing of it reaches Redis again
	// b's renewals, by hand: its slots and places last an hour more.
	later := float64(clock.Now().Add(2 * time.Hour).UnixMilli())
	for _, k := range []struct{ set, recs string }{{lk.keys[0], lk.keys[1]}, {lk.keys[2], lk.keys[3]}} {
		recs, err := b.b.rdb.HGetAll(ctx, k.recs).Result()
		if err != nil {
			t.Fatal(err)
		}
		for id, v := range recs {
			if strings.Contains(v, "|b|") || strings.HasSuffix(v, "|b") {
				b.b.rdb.ZAdd(ctx, k.set, redisZ(later, id))
			}
		}
	}
	t.Cleanup(func() { // a's calls end, as its process did
		proxy.Unblock()
		for _, c := range waiting[:3] {
			c.cancel()
			<-c.done
		}
	})
	clock.Advance(time.Hour + time.Second) // a's leases lapse
	return b, waiting[3:]
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
