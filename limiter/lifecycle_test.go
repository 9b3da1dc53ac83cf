package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// MaxLanes bounds the lanes: a call that would make one more fails with a
// typed error naming the setting, existing lanes keep working, and once an
// idle lane is evicted a new one can be made.
func TestMaxLanes(t *testing.T) {
	cfg := cfgN(2)
	cfg.MaxLanes, cfg.LaneIdleTTL = 2, 10*time.Minute
	h := newHarness(t, cfg)
	a := h.take("https://gw/v1|a", "a", limiter.Default)
	b := h.take("https://gw/v1|b", "b", limiter.Default)
	b.Release()
	_, err := h.lim.Acquire(context.Background(), "https://gw/v1|c")
	var le *limiter.LaneLimitError
	if !errors.Is(err, limiter.ErrLaneLimit) || !errors.As(err, &le) || le.Lane != "https://gw/v1|c" || le.MaxLanes != 2 {
		t.Fatalf("third lane: %v", err)
	}
	for _, s := range []string{"max_lanes", "lane_idle_ttl (now 10m0s)", `"https://gw/v1|c"`} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("message %q lacks %q", err, s)
		}
	}
	if n := h.lim.Lanes(); n != 2 || len(h.lim.Snapshot().Lanes) != 2 {
		t.Fatalf("%d lanes after a refused one, want 2", n)
	}
	again := h.take("https://gw/v1|b", "b2", limiter.Default) // an existing lane still works
	again.Release()
	h.clock.Advance(11 * time.Minute) // b is idle for its TTL; a holds a slot
	if n := h.lim.Lanes(); n != 1 {
		t.Fatalf("%d lanes after b's TTL, want 1 (a is busy)", n)
	}
	c := h.take("https://gw/v1|c", "c", limiter.Default)
	c.Release()
	a.Release()
}

// A lane idle for LaneIdleTTL is forgotten: gone from the snapshot, with an
// Evicted event; a lane with a call in flight, queued, or recent activity
// stays. A later call makes it again, with fresh statistics.
func TestIdleLanesEvicted(t *testing.T) {
	cfg := cfgN(1)
	cfg.LaneIdleTTL, cfg.QueueTimeout = 10*time.Minute, time.Hour
	var mu sync.Mutex
	var evicted []string
	h := newHarness(t, cfg, limiter.WithObserver(func(_ context.Context, e limiter.Event) {
		if e.Kind == limiter.Evicted {
			mu.Lock()
			evicted = append(evicted, e.Lane)
			mu.Unlock()
		}
	}))
	const idle, held, queued, chatty = "https://gw/v1|idle", "https://gw/v1|held", "https://gw/v1|queued", "https://gw/v1|chatty"
	s := h.take(idle, "i", limiter.Default)
	s.Release()
	hs := h.take(held, "h", limiter.Default)
	qs := h.take(queued, "q", limiter.Default)
	h.queue(context.Background(), queued, "q2", limiter.Bulk)
	cs := h.take(chatty, "c", limiter.Default)
	cs.Release()
	lanes := func() string {
		var ks []string
		for _, l := range h.lim.Snapshot().Lanes {
			ks = append(ks, strings.TrimPrefix(l.Lane, "https://gw/v1|"))
		}
		return strings.Join(ks, ",")
	}
	for range 9 { // reading the snapshot is not activity; an exchange is
		h.clock.Advance(time.Minute)
		h.lim.RecordExchange(context.Background(), chatty, limiter.Exchange{Outcome: limiter.OutcomeOK})
		_ = lanes()
	}
	if got := lanes(); got != "chatty,held,idle,queued" {
		t.Fatalf("after 9 min: %s", got)
	}
	h.clock.Advance(2 * time.Minute)
	if got := lanes(); got != "chatty,held,queued" {
		t.Fatalf("after 11 min: %s, want idle evicted", got)
	}
	mu.Lock()
	if len(evicted) != 1 || evicted[0] != idle {
		t.Fatalf("evicted events %v", evicted)
	}
	mu.Unlock()
	// It comes back, empty.
	s = h.take(idle, "i2", limiter.Default)
	s.Release()
	if l := h.lane(idle); *l.WaitP50 != 0 || l.QueueTimeouts5m != 0 {
		t.Fatalf("re-made lane %+v", l)
	}
	hs.Release()
	qs.Release()
	q2 := h.expectGrant("q2")
	q2.Release()
	if h.lim.Lanes() != 4 {
		t.Fatalf("%d lanes", h.lim.Lanes())
	}
	h.clock.Advance(12 * time.Minute)
	if n := h.lim.Lanes(); n != 0 || lanes() != "" {
		t.Fatalf("%d lanes (%s) after every lane went idle", n, lanes())
	}
}

// Lanes evicted and made again while calls come and go from many
// goroutines: no slot lost or double-granted (under -race).
func TestEvictionRacesAcquire(t *testing.T) {
	lim, err := limiter.New(limiter.Config{MaxInflight: 2, MaxLanes: 4, LaneIdleTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var refused sync.Map
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				key := fmt.Sprintf("https://gw/v1|m%d", rng.IntN(6))
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				s, err := lim.Acquire(ctx, key)
				cancel()
				switch {
				case errors.Is(err, limiter.ErrLaneLimit):
					refused.Store(key, true)
				case err == nil:
					s.Release()
				}
			}
		}()
	}
	wg.Wait()
	if n := lim.Lanes(); n > 4 {
		t.Fatalf("%d lanes, bound 4", n)
	}
	for _, l := range lim.Snapshot().Lanes {
		if l.Inflight != 0 || l.Queued != 0 {
			t.Fatalf("lane %s left with %d in flight, %d queued", l.Lane, l.Inflight, l.Queued)
		}
	}
	lim.Shutdown()
}

// Shutdown answers every queued call at once, refuses new ones, grants no
// released slot, and lets held slots run to their end.
func TestShutdown(t *testing.T) {
	refused := make(chan string, 16)
	h := newHarness(t, cfgN(1), limiter.WithObserver(func(ctx context.Context, e limiter.Event) {
		if e.Kind == limiter.Refused {
			id, _ := ctx.Value(callID{}).(string)
			refused <- id
		}
	}))
	held := h.take(gw, "held", limiter.Default)
	for _, id := range []string{"w1", "w2", "w3"} {
		h.queue(context.Background(), gw, id, limiter.Bulk)
	}
	h.lim.Shutdown()
	h.expectEnds(map[string]string{"w1": "shutting down", "w2": "shutting down", "w3": "shutting down"})
	if _, err := h.lim.Acquire(context.Background(), gw); !errors.Is(err, limiter.ErrShuttingDown) {
		t.Fatalf("Acquire after Shutdown: %v", err)
	}
	if _, err := h.lim.Acquire(context.Background(), "https://gw/v1|new"); !errors.Is(err, limiter.ErrShuttingDown) {
		t.Fatalf("Acquire of a new lane after Shutdown: %v", err)
	}
	h.expectCounts(gw, 1, 0) // the held slot runs on
	held.Release()
	h.expectCounts(gw, 0, 0)
	h.lim.Shutdown() // idempotent
	if n := len(refused); n != 5 {
		t.Fatalf("%d Refused events, want 5", n)
	}
}

// A lane evicted is never found again through the limiter's one-lane
// shortcut (Limiter.one), even when a lookup that found it just before its
// eviction sets it there afterwards (made here by hand): the next call on
// its key makes the lane again, and the lane made again is the one its
// limit and its snapshot count.
func TestEvictedLaneIsNotFoundAgain(t *testing.T) {
	cfg := cfgN(1)
	cfg.LaneIdleTTL = 10 * time.Minute
	h := newHarness(t, cfg)
	const key = "https://gw/v1|a"
	h.take(key, "first", limiter.Default).Release()
	old := limiter.LaneOf(h.lim, key)
	if got := limiter.OneLane(h.lim); got != key {
		t.Fatalf("the shortcut names %q, want the first lane", got)
	}
	h.clock.Advance(11 * time.Minute)
	if n := h.lim.Lanes(); n != 0 {
		t.Fatalf("%d lanes after the idle TTL, want 0", n)
	}
	if got := limiter.OneLane(h.lim); got != "" {
		t.Fatalf("the shortcut still names the evicted lane %q", got)
	}
	limiter.SetOne(h.lim, old) // the late lookup
	s := h.take(key, "again", limiter.Default)
	if limiter.SlotLane(*s) == old {
		t.Fatal("granted on the evicted lane")
	}
	if n := h.lim.Lanes(); n != 1 || limiter.LaneOf(h.lim, key) != limiter.SlotLane(*s) {
		t.Fatalf("%d lanes; the slot is not on the lane the table holds", n)
	}
	if got := limiter.OneLane(h.lim); got != key || limiter.LaneOf(h.lim, key) != limiter.SlotLane(*s) {
		t.Fatalf("the shortcut names %q, want the lane made again", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.queue(ctx, key, "queued", limiter.Default) // the lane of 1 is full
	if ln := h.lim.Snapshot().Lanes; len(ln) != 1 || ln[0].Inflight != 1 || ln[0].Queued != 1 {
		t.Fatalf("the snapshot does not count the slot and the waiter: %+v", ln)
	}
	cancel()
	if r := h.next(); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the queued call: %v", r.err)
	}
	s.Release()
}
