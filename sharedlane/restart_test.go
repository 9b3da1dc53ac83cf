package sharedlane

import (
	"context"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
)

// holding acquires n slots of p's lane and keeps them; their lease ids.
func holding(t *testing.T, p *process, n int) (ids []string, slots []limiter.Slot) {
	t.Helper()
	for range n {
		c := p.start(context.Background(), limiter.Default).wait(t)
		if c.err != nil {
			t.Fatal(c.err)
		}
		slots = append(slots, c.slot)
	}
	p.b.mu.Lock()
	for k := range p.b.leases {
		ids = append(ids, k)
	}
	p.b.mu.Unlock()
	return ids, slots
}

// A restart, empty or from a file older than a lease, never makes an id
// again that a call of before may still hold: the lane's counter starts
// again (or goes back), and a slot registered again would otherwise take
// the id of another running call of the same process, whose lease then
// leaves the process's table, lapses, and is granted again while the call
// runs on.
func TestIdsNeverRepeatAcrossRestarts(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"empty", "file"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			r := startRedis(t)
			p := newProcess(t, r.URL(), "a", limiter.Config{MaxInflight: 8, QueueTimeout: time.Minute})
			first, slots := holding(t, p, 1)
			if kind == "file" {
				if _, err := r.Do("SAVE"); err != nil { // the file knows the first slot only
					t.Fatal(err)
				}
			}
			more, more2 := holding(t, p, 3)
			seen := map[string]bool{}
			for _, id := range append(first, more...) {
				seen[id] = true
			}
			all := append(slots, more2...)
			for i := range all {
				all[i].Release()
			}
			time.Sleep(1500 * time.Millisecond) // the file is older than a lease (1 s)
			r.Restart()                         // loads the file when there is one
			r.WaitUptime(time.Second)
			after, rest := holding(t, p, 4)
			defer func() {
				for i := range rest {
					rest[i].Release()
				}
			}()
			for _, id := range after {
				if seen[id] {
					t.Fatalf("after the restart (%s) a slot has the id %q, held before it by another call", kind, id)
				}
			}
		})
	}
}

// After Redis comes back from a file older than a lease, the lane has its
// quiet time as after any restart: the running calls register their slots
// again before any waiter is granted, so the lane never has more calls at
// work than its limit and no running call loses its slot. (The file holds
// the lane's old marks, its server's start included: read as they stand,
// the lane would grant at once.)
func TestRestoredFileGetsTheQuietTime(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	r.WaitUptime(3 * time.Second)
	// A lease of 3 s: a renews every second, so b's call, made as Redis
	// comes back, is first; with the lease of 1 s of most tests a's
	// renewal could come first and hide a lane that grants at once.
	ttl := func(c *Config) { c.LeaseTTL = 3 * time.Second }
	a := newProcess(t, r.URL(), "a", limiter.Config{MaxInflight: 4, QueueTimeout: time.Minute}, ttl)
	b := newProcess(t, r.URL(), "b", limiter.Config{MaxInflight: 4, QueueTimeout: time.Minute}, ttl)
	_, slots := holding(t, a, 1)
	slots[0].Release()
	if _, err := r.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	ids, running := holding(t, a, 4) // granted after the file was written
	defer func() {
		for i := range running {
			running[i].Release()
		}
	}()
	time.Sleep(3500 * time.Millisecond) // the file is older than a lease
	r.Restart()
	// b asks at once, before a's renewals have registered its four calls.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	c := b.start(ctx, limiter.Interactive)
	time.Sleep(5 * time.Second) // the quiet time, and a's renewals
	if c.ended() && c.err == nil {
		c.slot.Release()
		t.Fatal("a call was granted while the four running calls held the lane of 4")
	}
	a.b.mu.Lock()
	n := len(a.b.leases)
	a.b.mu.Unlock()
	if n != len(ids) {
		t.Fatalf("a holds %d leases after the restore, want its %d running calls'", n, len(ids))
	}
	for i := range running {
		select {
		case <-running[i].Lost():
			t.Fatalf("running call %d lost its slot across the restore", i)
		default:
		}
	}
	c.wait(t)
}
