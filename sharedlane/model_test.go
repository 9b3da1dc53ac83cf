package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// model is the reference: the grant rules of an in-process lane, written
// plainly, without aging (the test sets the aging step to an hour so that
// the order depends on the steps alone).
type model struct {
	limit, reserve int
	held           []*mcall // granted, not released
	queue          []*mcall // waiting, in arrival order
}

type mcall struct {
	id    int
	class limiter.Priority
	proc  int
	real  *call
}

func (m *model) others() int {
	n := 0
	for _, c := range m.held {
		if c.class != limiter.Interactive {
			n++
		}
	}
	return n
}

func (m *model) fits(p limiter.Priority) bool {
	return len(m.held) < m.limit && (p == limiter.Interactive || m.others() < m.limit-m.reserve)
}

// next is the waiter served next, if one may be: the best by class then
// arrival; if the reserve stops it, the first interactive waiter.
func (m *model) next() int {
	if len(m.held) >= m.limit {
		return -1
	}
	best := -1
	for i, c := range m.queue {
		if best < 0 || c.class < m.queue[best].class {
			best = i
		}
	}
	if best < 0 {
		return -1
	}
	if m.fits(m.queue[best].class) {
		return best
	}
	for i, c := range m.queue {
		if c.class == limiter.Interactive {
			return i
		}
	}
	return -1
}

// dispatch grants what may be granted and returns those calls.
func (m *model) dispatch() []*mcall {
	var out []*mcall
	for i := m.next(); i >= 0; i = m.next() {
		c := m.queue[i]
		m.queue = append(m.queue[:i], m.queue[i+1:]...)
		m.held = append(m.held, c)
		out = append(out, c)
	}
	return out
}

// 6. A randomized test against the reference model: three processes on
// one Redis, random acquisitions of every class, releases and
// cancellations, one at a time; after each step the calls the model grants
// are exactly the ones granted, and the lane's global figures are the
// model's. Seeds are printed on failure.
func TestAgainstModel(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	for seed := range uint64(30) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { againstModel(t, r.URL(), seed) })
	}
}

func againstModel(t *testing.T, url string, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	limit := 1 + rng.IntN(4)
	cfg := limiter.Config{MaxInflight: limit, InteractiveReserve: rng.IntN(limit), QueueTimeout: time.Minute}
	// A lease of 10 s: the model has no lapsed leases, and under make
	// stress a 1 s one lapsed, its slot re-registered beside the model's.
	noAging := func(c *Config) {
		c.AgingStep, c.LeaseTTL = time.Hour, 10*time.Second
		c.KeyPrefix = fmt.Sprintf("model%d", seed)
	}
	var procs []*process
	for i := range 3 {
		procs = append(procs, newProcess(t, url, fmt.Sprint("p", i), cfg, noAging))
	}
	// The lane grants nothing for one lease after the server's start: say
	// it started long ago, as the scenario runner does.
	if err := procs[0].b.rdb.HSet(context.Background(), procs[0].b.keysOf(lane).keys[8], "boot", time.Now().Add(-2*time.Hour).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	m := &model{limit: limit, reserve: cfg.Reserve()}
	next := 0
	check := func(step string) {
		t.Helper()
		everyKeyExpires(t, procs[0].b.rdb, fmt.Sprintf("model%d", seed), step)
		want := len(m.held)
		l := procs[0].b.Lanes(context.Background(), []string{lane})[lane]
		q := l.QueuedByPriority
		if l.Inflight != want || q.Interactive+q.Default+q.Bulk != len(m.queue) {
			t.Fatalf("%s: Redis has %d held and %+v queued, the model %d and %d", step, l.Inflight, q, want, len(m.queue))
		}
	}
	granted := func(step string, cs []*mcall) {
		t.Helper()
		for _, c := range cs {
			select {
			case <-c.real.done:
				if c.real.err != nil {
					t.Fatalf("%s: call %d: %v", step, c.id, c.real.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the model grants call %d (%s, p%d); it was not granted", step, c.id, c.class, c.proc)
			}
		}
	}
	for i := range 150 {
		switch op := rng.IntN(10); {
		case op < 5 || len(m.held)+len(m.queue) == 0: // acquire
			p := rng.IntN(3)
			c := &mcall{id: next, class: limiter.Priority(rng.IntN(3) - 1), proc: p}
			next++
			c.real = procs[p].start(context.Background(), c.class)
			// Arrival order is the model's order: wait for the call to be
			// granted or queued before the next step.
			m.queue = append(m.queue, c)
			got := m.dispatch()
			step := fmt.Sprintf("step %d: acquire %d (%s, p%d)", i, c.id, c.class, p)
			if len(got) == 0 {
				waitQueued(t, procs[0], len(m.queue))
			}
			granted(step, got)
			check(step)
		case op < 8 && len(m.held) > 0: // release
			k := rng.IntN(len(m.held))
			c := m.held[k]
			m.held = append(m.held[:k], m.held[k+1:]...)
			c.real.slot.Release()
			step := fmt.Sprintf("step %d: release %d", i, c.id)
			granted(step, m.dispatch())
			check(step)
		case len(m.queue) > 0: // cancel a waiter
			k := rng.IntN(len(m.queue))
			c := m.queue[k]
			m.queue = append(m.queue[:k], m.queue[k+1:]...)
			c.real.cancel()
			select {
			case <-c.real.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("step %d: canceled call %d did not end", i, c.id)
			}
			if !errors.Is(c.real.err, context.Canceled) {
				t.Fatalf("step %d: canceled call %d: %v", i, c.id, c.real.err)
			}
			check(fmt.Sprintf("step %d: cancel %d", i, c.id))
		}
	}
	for _, c := range m.queue {
		c.real.cancel()
		<-c.real.done
	}
	for _, c := range m.held {
		c.real.slot.Release()
	}
}

// waitQueued waits until the lane has n waiters in Redis.
func waitQueued(t *testing.T, p *process, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		q := p.b.Lanes(context.Background(), []string{lane})[lane].QueuedByPriority
		if q.Interactive+q.Default+q.Bulk == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d queued: %+v", n, q)
		}
	}
}
