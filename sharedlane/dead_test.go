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
// process a holds 2 slots and queues 3 calls, process b holds 2
// (interactive) and queues 2, then a goes silent (its connection
// blocked) and b's leases are renewed by hand, as b's renewals would;
// the clock passes a's leases. The next op of b's (its snapshot's read)
// sweeps a's lapsed slots and places in one call, and b's two waiters are
// granted at once: none is left queued while slots are free.
func TestDeadProcessSweptInOneCall(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	clock := limitertest.NewClock(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))
	cfg := limiter.Config{MaxInflight: 4, InteractiveReserve: 1, QueueTimeout: 48 * time.Hour}
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
	for _, c := range []*call{a.start(ctx, limiter.Default), a.start(ctx, limiter.Default),
		b.start(ctx, limiter.Interactive), b.start(ctx, limiter.Interactive)} {
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
	l := b.lim.Snapshot().Lanes[0]         // b's read sweeps and dispatches
	for i, c := range waiting[3:] {
		select {
		case <-c.done:
			if c.err != nil {
				t.Fatalf("b's waiter %d: %v", i, c.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("b's waiter %d still queued with slots free: %+v %+v", i, l, l.Shared)
		}
	}
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
