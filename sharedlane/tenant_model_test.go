package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// tmodel is the reference for a lane shared by tenants: package limiter's
// rules (the three steps: the class whose oldest waiter ranks first, with
// aging; within it the tenant with the least service; its earliest call;
// the reserve; a cap per tenant; a grant charged the tenant's mean
// slot-time over its weight and settled at release; a tenant that starts
// waiting in a class lifted to the settled service of the one served next
// there, or the last granted tenant's; a newcomer to at least the
// newcomers' mark, which it moves on by its charge; idle tenants forgotten
// at a newcomer's call, at most once a minute), written plainly, with
// lane.lua's arithmetic on the lane's clock in ms.
type tmodel struct {
	limit, reserve, cap int
	step                time.Duration // aging
	weights             map[string]float64
	held, queue         []*tcall
	v, p, e             map[string]float64
	est                 float64
	last                string
	measured            bool             // a call has named a tenant: grants are charged
	seen                map[string]int64 // a tenant granted a call: its last grant or release (ms)
	mark                float64          // the newcomers' service
	pruned              int64            // when idle tenants were last looked for (ms), once swept
	swept               bool
}

func (m *tmodel) newcomer(t string) bool {
	_, ok := m.seen[t]
	return t != "default" && !ok
}

// forget drops the tenants gone idle but keep, at most once a minute.
func (m *tmodel) forget(keep string, now int64) {
	if m.swept && now-m.pruned < time.Minute.Milliseconds() {
		return
	}
	m.swept, m.pruned = true, now
	names := map[string]bool{}
	for _, f := range []map[string]float64{m.v, m.p, m.e} {
		for n := range f {
			names[n] = true
		}
	}
	for n := range m.seen {
		names[n] = true
	}
	for n := range names {
		busy := slices.ContainsFunc(append(slices.Clone(m.held), m.queue...), func(c *tcall) bool { return c.tenant == n })
		if at, ok := m.seen[n]; n == "default" || n == keep || busy || ok && now-at < limiter.TenantIdle.Milliseconds() {
			continue
		}
		delete(m.v, n)
		delete(m.p, n)
		delete(m.e, n)
		delete(m.seen, n)
		if m.last == n {
			m.last = ""
		}
	}
}

type tcall struct {
	id      int
	class   limiter.Priority
	tenant  string
	proc    int
	at      int64 // arrival; for a holder, its grant (ms)
	charge  float64
	charged bool
	fresh   bool // its tenant's first grant: its settlement moves the mark
	real    *call
}

func (m *tmodel) weight(t string) float64 {
	if w, ok := m.weights[t]; ok {
		return w
	}
	return 1
}

func (m *tmodel) inflight(t string) int {
	n := 0
	for _, c := range m.held {
		if c.tenant == t {
			n++
		}
	}
	return n
}

func (m *tmodel) capped(t string) bool { return m.cap > 0 && m.inflight(t) >= m.cap }

func (m *tmodel) fits(p limiter.Priority) bool {
	others := 0
	for _, c := range m.held {
		if c.class != limiter.Interactive {
			others++
		}
	}
	return len(m.held) < m.limit && (p == limiter.Interactive || others < m.limit-m.reserve)
}

// served orders two waiters of one class: service, arrival, enqueue order.
func (m *tmodel) served(a, b *tcall) bool {
	if m.v[a.tenant] != m.v[b.tenant] {
		return m.v[a.tenant] < m.v[b.tenant]
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.id < b.id
}

// heads are the first waiter of each tenant and class, its tenant not at
// its cap.
func (m *tmodel) heads() []*tcall {
	first := map[string]*tcall{}
	for _, c := range m.queue {
		k := fmt.Sprint(c.tenant, c.class)
		if m.capped(c.tenant) {
			continue
		}
		if f := first[k]; f == nil || c.at < f.at || (c.at == f.at && c.id < f.id) {
			first[k] = c
		}
	}
	var out []*tcall
	for _, c := range first {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *tcall) int { return a.id - b.id })
	return out
}

// rank is a waiter's effective class at now (ms): its own, raised a step
// per aging step waited since its arrival.
func (m *tmodel) rank(c *tcall, now int64) limiter.Priority {
	return max(limiter.Interactive, c.class-limiter.Priority(min(2, max(0, (now-c.at)/m.step.Milliseconds()))))
}

// next returns the waiter granted next at now, in three steps: the class
// whose oldest waiter (of a tenant not at its cap) has the highest
// effective class, then the earliest arrival; within it, the tenant with
// the least service, then arrival (served). Only an interactive call may
// take a reserved slot.
func (m *tmodel) next(now int64) *tcall {
	if len(m.held) >= m.limit {
		return nil
	}
	var reps [3]*tcall
	for _, h := range m.heads() {
		if r := reps[h.class.Index()]; r == nil || h.at < r.at || (h.at == r.at && h.id < r.id) {
			reps[h.class.Index()] = h
		}
	}
	var rep *tcall
	for _, r := range reps {
		if r == nil {
			continue
		}
		if rep == nil {
			rep = r
			continue
		}
		if ra, rb := m.rank(r, now), m.rank(rep, now); ra < rb || ra == rb && (r.at < rep.at || r.at == rep.at && r.id < rep.id) {
			rep = r
		}
	}
	if rep == nil {
		return nil
	}
	class := rep.class
	if !m.fits(limiter.Default) {
		class = limiter.Interactive
	}
	var best *tcall
	for _, h := range m.heads() {
		if h.class == class && (best == nil || m.served(h, best)) {
			best = h
		}
	}
	return best
}

func (m *tmodel) hold(c *tcall, now int64) {
	c.at = now
	m.last = c.tenant
	m.held = append(m.held, c)
	if !m.measured {
		return
	}
	e, ok := m.e[c.tenant]
	if !ok {
		e = m.est
	}
	c.charge, c.charged = e/m.weight(c.tenant), true
	c.fresh = m.newcomer(c.tenant)
	m.seen[c.tenant] = now
	m.v[c.tenant] += c.charge
	m.p[c.tenant] += c.charge
}

func (m *tmodel) unhold(c *tcall, now int64) {
	m.held = slices.DeleteFunc(m.held, func(o *tcall) bool { return o == c })
	if !c.charged {
		return
	}
	d := float64(max(0, now-c.at)) / 1000
	m.seen[c.tenant] = now
	m.v[c.tenant] = m.v[c.tenant] + d/m.weight(c.tenant) - c.charge
	if c.fresh {
		m.mark += d/m.weight(c.tenant) - c.charge
	}
	m.p[c.tenant] = m.p[c.tenant] - c.charge
	le := m.est
	e, ok := m.e[c.tenant]
	if !ok {
		e = le
	}
	m.e[c.tenant] = e + (d-e)/4
	m.est = le + (d-le)/8
}

// lift raises t's service, as it starts waiting in class p, to the
// settled service of the tenant served next in p, or with none waiting
// there, of the tenant granted last.
func (m *tmodel) lift(t string, p limiter.Priority) {
	var first *tcall
	for _, h := range m.heads() {
		if h.class == p && (first == nil || m.served(h, first)) {
			first = h
		}
	}
	var floor float64
	ok := true
	switch {
	case first != nil:
		floor = m.v[first.tenant] - m.p[first.tenant]
	case m.last != "":
		floor = m.v[m.last] - m.p[m.last]
	default:
		ok = false
	}
	newcomer := m.newcomer(t)
	if newcomer {
		floor, ok = max(floor, m.mark), true
	}
	if ok && m.v[t] < floor {
		m.v[t] = floor
	}
	if newcomer {
		e, has := m.e[t]
		if !has {
			e = m.est
		}
		m.mark = m.v[t] + e/m.weight(t)
	}
}

func (m *tmodel) dispatch(now int64) []*tcall {
	var out []*tcall
	for c := m.next(now); c != nil; c = m.next(now) {
		m.queue = slices.DeleteFunc(m.queue, func(o *tcall) bool { return o == c })
		m.hold(c, now)
		out = append(out, c)
	}
	return out
}

// TestTenantsAgainstModel: three processes share a lane in one Redis,
// with four tenants (one of weight 2), a cap per tenant in some seeds, and
// random acquisitions of every class, releases and cancellations one at a
// time, on a clock the test moves (a second or more per step, so that
// arrivals never tie). After each step the calls granted are exactly the
// model's, and so are the tenants' services in Redis, to the float.
func TestTenantsAgainstModel(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { tenantsAgainstModel(t, r, seed) })
	}
}

func tenantsAgainstModel(t *testing.T, r *redistest.Server, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	limit := 1 + rng.IntN(4)
	weights := map[string]float64{"a": 2}
	cfg := limiter.Config{MaxInflight: limit, InteractiveReserve: rng.IntN(limit), QueueTimeout: time.Hour,
		Fairness: &limiter.Fairness{Weights: weights, MaxInflightPerTenant: []int{0, 0, 1, 2}[rng.IntN(4)]}}
	clock := limitertest.NewClock(time.Now().Add(time.Hour))
	prefix := fmt.Sprintf("tmodel%d", seed)
	// Steps of 1 to 4 s: a waiter ages a class in a few steps.
	const agingStep = 20 * time.Second
	tweak := func(c *Config) {
		c.AgingStep, c.KeyPrefix, c.Clock, c.LeaseTTL = agingStep, prefix, clock, time.Hour
	}
	var procs []*process
	for i := range 3 {
		procs = append(procs, newProcess(t, r.URL(), fmt.Sprint("p", i), cfg, tweak))
	}
	// The lane grants nothing for one lease after the server's start, as
	// seen on the lane's clock: pass it.
	first := procs[0].start(context.Background(), limiter.Default)
	waitQueued(t, procs[0], 1)
	clock.Advance(2 * time.Hour)
	first.cancel()
	first.wait(t)
	if first.err == nil {
		first.slot.Release()
	}
	rdb := procs[0].b.rdb
	tkey := procs[0].b.keysOf(lane).keys[9]
	rdb.Del(context.Background(), tkey)

	m := &tmodel{step: agingStep, limit: limit, reserve: cfg.Reserve(), cap: cfg.Fairness.MaxInflightPerTenant, weights: weights,
		v: map[string]float64{}, p: map[string]float64{}, e: map[string]float64{}, est: 1, seen: map[string]int64{}}
	nowMs := func() int64 { return clock.Now().UnixMilli() }
	granted := func(step string, cs []*tcall) {
		t.Helper()
		for _, c := range cs {
			select {
			case <-c.real.done:
				if c.real.err != nil {
					t.Fatalf("%s: call %d: %v", step, c.id, c.real.err)
				}
			case <-time.After(10 * time.Second):
				var ended []string
				for _, o := range append(append([]*tcall{}, m.queue...), m.held...) {
					select {
					case <-o.real.done:
						ended = append(ended, fmt.Sprintf("%d(%s,%s,at %d)", o.id, o.class, o.tenant, o.at))
					default:
					}
				}
				var q []string
				for _, o := range m.queue {
					q = append(q, fmt.Sprintf("%d(%s,%s,at %d)", o.id, o.class, o.tenant, o.at))
				}
				t.Fatalf("%s: the model grants call %d (%s, %s, p%d); it was not granted. ended: %v; model queue %v; v %v p %v cap %d",
					step, c.id, c.class, c.tenant, c.proc, ended, q, m.v, m.p, m.cap)
			}
		}
	}
	check := func(step string) {
		t.Helper()
		l := procs[0].b.Lanes(context.Background(), []string{lane})[lane]
		q := l.QueuedByPriority
		if l.Inflight != len(m.held) || q.Interactive+q.Default+q.Bulk != len(m.queue) {
			t.Fatalf("%s: Redis has %d held and %+v queued, the model %d and %d", step, l.Inflight, q, len(m.held), len(m.queue))
		}
		for tn, want := range m.v {
			got, err := rdb.HGet(context.Background(), tkey, "v:"+tn).Float64()
			if errors.Is(err, redis.Nil) {
				got, err = 0, nil // never charged nor lifted
			}
			if err != nil || got != want {
				t.Fatalf("%s: tenant %s's service %v in Redis (%v), the model's %v", step, tn, got, err, want)
			}
		}
	}
	next := 0
	for i := range 120 {
		clock.Advance(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 5 || len(m.held)+len(m.queue) == 0: // acquire
			p := rng.IntN(3)
			tn := []string{"a", "b", "c", "default"}[rng.IntN(4)]
			c := &tcall{id: next, class: limiter.Priority(rng.IntN(3) - 1), tenant: tn, proc: p, at: nowMs()}
			next++
			ctx := context.Background()
			if tn != "default" {
				ctx = limiter.WithTenant(ctx, tn)
			}
			step := fmt.Sprintf("step %d: acquire %d (%s, %s, p%d)", i, c.id, c.class, tn, p)
			if m.newcomer(tn) {
				m.forget(tn, nowMs())
			}
			m.measured = m.measured || tn != "default"
			var got []*tcall
			if len(m.queue) == 0 && m.fits(c.class) && !m.capped(tn) {
				m.hold(c, nowMs())
				got = []*tcall{c}
			} else {
				if !slices.ContainsFunc(m.queue, func(o *tcall) bool { return o.tenant == tn && o.class == c.class }) {
					m.lift(tn, c.class)
				}
				m.queue = append(m.queue, c)
				got = m.dispatch(nowMs())
			}
			c.real = procs[p].start(ctx, c.class)
			if !slices.Contains(got, c) {
				waitQueued(t, procs[0], len(m.queue))
			}
			granted(step, got)
			check(step)
		case op < 8 && len(m.held) > 0: // release
			c := m.held[rng.IntN(len(m.held))]
			m.unhold(c, nowMs())
			c.real.slot.Release()
			step := fmt.Sprintf("step %d: release %d (%s)", i, c.id, c.tenant)
			granted(step, m.dispatch(nowMs()))
			check(step)
		case len(m.queue) > 0: // cancel a waiter
			c := m.queue[rng.IntN(len(m.queue))]
			m.queue = slices.DeleteFunc(m.queue, func(o *tcall) bool { return o == c })
			c.real.cancel()
			c.real.wait(t)
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
