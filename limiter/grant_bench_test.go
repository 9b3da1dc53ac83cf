package limiter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkGrant measures the cost of one grant decision with n calls
// queued in a lane of mixed classes and arrivals: pick the next waiter,
// dequeue it, grant it, and queue a new one so that n stays constant. It
// isolates the data structure from goroutine scheduling, to show how the
// cost grows with the queue.
func BenchmarkGrant(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("waiters-%d", n), func(b *testing.B) { benchGrant(b, n, 0) })
	}
}

// BenchmarkGrantTenants is BenchmarkGrant with 100,000 calls queued by 1,
// 10 and 1,000 named tenants (round robin), so that their shares are
// measured: the grant stays O(log n) in the waiters and the tenants.
func BenchmarkGrantTenants(b *testing.B) {
	for _, tenants := range []int{1, 10, 1000} {
		b.Run(fmt.Sprintf("tenants-%d", tenants), func(b *testing.B) { benchGrant(b, 100000, tenants) })
	}
}

func benchGrant(b *testing.B, n, tenants int) {
	start := time.Unix(0, 0)
	cfg := Config{MaxInflight: 1, InteractiveReserve: 0, Fairness: &Fairness{MaxTenants: tenants}}
	lim, _ := New(cfg, WithClock(frozen{start}))
	l := newLane(lim, "lane", lim.cfg.Load())
	ts := []*tenant{l.tenants.deflt} // 0 tenants: calls that name none
	if tenants > 0 {
		ts = ts[:0]
		for i := range tenants {
			ts = append(ts, l.tenantLocked(&cfg, fmt.Sprintf("t%d", i)))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	now := start.Add(time.Hour)
	// Arrivals come in order, as they do, except that one in ten is
	// a retry that carries an arrival up to 5 minutes old.
	mk := func(i int) *waiter {
		arrival := now.Add(time.Duration(i) * time.Microsecond)
		if rng.IntN(10) == 0 {
			arrival = now.Add(-time.Duration(rng.IntN(300)) * time.Second)
		}
		w := &waiter{prio: Priority(rng.IntN(3) - 1), t: ts[i%len(ts)], arrival: arrival, at: int64(arrival.Sub(start)), enqueued: now, seq: l.q.seq, ready: make(chan struct{}, 1)}
		l.q.seq++
		return w
	}
	for i := range n {
		l.enqueueLocked(mk(i), time.Hour)
	}
	fresh := make([]*waiter, b.N) // made before timing: only the grant is measured
	for i := range fresh {
		fresh[i] = mk(n + i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.slots.inflight = 0
		l.dispatchLocked(now)
		l.enqueueLocked(fresh[i], time.Hour)
	}
}

type frozen struct{ t time.Time }

func (f frozen) Now() time.Time                        { return f.t }
func (f frozen) AfterFunc(time.Duration, func()) Timer { return stopped{} }

type stopped struct{}

func (stopped) Stop() bool { return false }
