package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
//
// With tokens, every call carries an estimate, and the lane has a
// tokens_per_minute budget (and in some seeds a max_inflight_tokens): the
// bucket refills continuously and is written at each grant and settlement,
// the first in line holds the line while the budgets have no room for it,
// a settlement gives back what the call did not use, and service is counted
// in tokens from the first estimated grant (package limiter's rules).
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

	tokens      bool
	tpm, maxtok float64 // the budgets
	level       float64 // the bucket as last written, at levelAt (ms); full until then
	levelAt     int64
	written     bool
	ti          float64 // the estimates of the calls holding slots
	inTok       bool    // service in tokens
	pc          float64 // the mean use of a call
}

// bucket returns the bucket's tokens at now (ms), as lane.lua's level.
func (m *tmodel) bucket(now int64) float64 {
	if !m.written {
		return m.tpm
	}
	return min(m.tpm, m.level+m.tpm*float64(max(0, now-m.levelAt))/60000)
}

func (m *tmodel) setBucket(l float64, now int64) { m.level, m.levelAt, m.written = l, now, true }

// tokensFit reports whether the budgets have room for a call of cost at now.
func (m *tmodel) tokensFit(cost float64, now int64) bool {
	if !m.tokens {
		return true
	}
	if m.maxtok > 0 && m.ti > 0 && m.ti+cost > m.maxtok {
		return false
	}
	return m.bucket(now)+1e-6 >= min(cost, m.tpm)
}

// settle replaces what c is charged in the bucket with used, at now.
func (m *tmodel) settle(c *tcall, used float64, now int64) {
	m.setBucket(max(-m.tpm, min(m.tpm, m.bucket(now)-(used-c.cost))), now)
	c.cost, c.used = used, used
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
	// With tokens: its estimate (est), what it is charged in the bucket
	// (cost: est until settled, then its use), and what it used, else its
	// estimate (used); inTok: charged in tokens.
	est, cost, used float64
	inTok           bool
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
	if m.tokens {
		m.setBucket(max(-m.tpm, m.bucket(now)-c.est), now)
		m.ti += c.est
		c.cost, c.used = c.est, c.est
	}
	if !m.measured {
		return
	}
	if m.tokens && !m.inTok {
		// The first estimated grant turns service to tokens.
		m.inTok, m.pc, m.mark = true, c.est, 0
		for t := range m.v {
			m.v[t] = 0
		}
		for t := range m.p {
			m.p[t] = 0
		}
	}
	e, ok := m.e[c.tenant]
	if !ok {
		e = m.est
	}
	if m.inTok {
		e = c.est
	}
	c.charge, c.charged, c.inTok = e/m.weight(c.tenant), true, m.inTok
	c.fresh = m.newcomer(c.tenant)
	m.seen[c.tenant] = now
	m.v[c.tenant] += c.charge
	m.p[c.tenant] += c.charge
}

func (m *tmodel) unhold(c *tcall, now int64) {
	m.held = slices.DeleteFunc(m.held, func(o *tcall) bool { return o == c })
	if m.tokens {
		m.ti -= c.est
	}
	if !c.charged {
		return
	}
	d := float64(max(0, now-c.at)) / 1000
	m.seen[c.tenant] = now
	used := d
	if c.inTok {
		used = c.used
		m.pc += (used - m.pc) / 8
	}
	if c.inTok == m.inTok {
		m.v[c.tenant] = m.v[c.tenant] + used/m.weight(c.tenant) - c.charge
		if c.fresh {
			m.mark += used/m.weight(c.tenant) - c.charge
		}
		m.p[c.tenant] = m.p[c.tenant] - c.charge
	}
	le := m.est
	e, ok := m.e[c.tenant]
	if !ok {
		e = le
	}
	m.e[c.tenant] = e + (d-e)/4
	m.est = le + (d-le)/8
}

// lift raises t's service, as it starts waiting in class p with a call
// estimated at cost, to the settled service of the tenant served next in
// p, or with none waiting there, of the tenant granted last.
func (m *tmodel) lift(t string, p limiter.Priority, cost float64) {
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
		if m.inTok {
			e = cost
		}
		m.mark = m.v[t] + e/m.weight(t)
	}
}

func (m *tmodel) dispatch(now int64) []*tcall {
	var out []*tcall
	for c := m.next(now); c != nil && m.tokensFit(c.est, now); c = m.next(now) {
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
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { tenantsAgainstModel(t, r, seed, false) })
	}
}

// TestTokensAgainstModel is TestTenantsAgainstModel with token budgets:
// every call carries an estimate, the lane a budget of 600 tokens a minute
// (and in half the seeds at most 500 in flight); some calls are settled
// below their estimates before they are released, and the clock's steps
// refill the bucket, so that waiters are granted as it does (the
// processes' polls look at the queue on the lane's clock). After each step
// the grants, the services, the bucket as written and the estimates in
// flight in Redis are the model's, to the float.
func TestTokensAgainstModel(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { tenantsAgainstModel(t, r, 100+seed, true) })
	}
}

func tenantsAgainstModel(t *testing.T, r *redistest.Server, seed uint64, tokens bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	limit := 1 + rng.IntN(4)
	weights := map[string]float64{"a": 2}
	cfg := limiter.Config{MaxInflight: limit, InteractiveReserve: rng.IntN(limit), QueueTimeout: time.Hour,
		Fairness: &limiter.Fairness{Weights: weights, MaxInflightPerTenant: []int{0, 0, 1, 2}[rng.IntN(4)]}}
	if tokens {
		cfg.TokensPerMinute = 600
		cfg.MaxInflightTokens = []int64{0, 500}[rng.IntN(2)]
	}
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
		v: map[string]float64{}, p: map[string]float64{}, e: map[string]float64{}, est: 1, seen: map[string]int64{},
		tokens: tokens, tpm: float64(cfg.TokensPerMinute), maxtok: float64(cfg.MaxInflightTokens)}
	mkey := procs[0].b.keysOf(lane).keys[8]
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
		everyKeyExpires(t, rdb, prefix, step)
		for tn, want := range m.v {
			got, err := rdb.HGet(context.Background(), tkey, "v:"+tn).Float64()
			if errors.Is(err, redis.Nil) {
				got, err = 0, nil // never charged nor lifted
			}
			if err != nil || got != want {
				t.Fatalf("%s: tenant %s's service %v in Redis (%v), the model's %v", step, tn, got, err, want)
			}
		}
		if !tokens {
			return
		}
		f, err := rdb.HMGet(context.Background(), mkey, "tl", "ta", "ti").Result()
		if err != nil {
			t.Fatal(err)
		}
		num := func(v any) float64 {
			if v == nil {
				return 0
			}
			x, err := strconv.ParseFloat(v.(string), 64)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			return x
		}
		if (f[0] != nil) != m.written || m.written && (num(f[0]) != m.level || int64(num(f[1])) != m.levelAt) || num(f[2]) != m.ti {
			t.Fatalf("%s: the bucket in Redis %v at %v, %v in flight; the model's %v at %v (written %v), %v in flight", step, f[0], f[1], f[2], m.level, m.levelAt, m.written, m.ti)
		}
	}
	next := 0
	for i := range 120 {
		clock.Advance(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
		if tokens {
			// The bucket refilled: the waiters' polls grant what now fits.
			granted(fmt.Sprintf("step %d: refill", i), m.dispatch(nowMs()))
		}
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
			if tokens {
				c.est = []float64{50, 100, 200, 400}[rng.IntN(4)]
				ctx = limiter.WithTokens(ctx, int64(c.est))
			}
			step := fmt.Sprintf("step %d: acquire %d (%s, %s, p%d)", i, c.id, c.class, tn, p)
			if m.newcomer(tn) {
				m.forget(tn, nowMs())
			}
			m.measured = m.measured || tn != "default"
			var got []*tcall
			if len(m.queue) == 0 && m.fits(c.class) && !m.capped(tn) && m.tokensFit(c.est, nowMs()) {
				m.hold(c, nowMs())
				got = []*tcall{c}
			} else {
				if !slices.ContainsFunc(m.queue, func(o *tcall) bool { return o.tenant == tn && o.class == c.class }) {
					m.lift(tn, c.class, c.est)
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
			if tokens && c.used == c.est && rng.IntN(2) == 0 {
				// Settled first, below its estimate: the rest comes back.
				used := math.Floor(c.est * []float64{0.3, 0.5, 1}[rng.IntN(3)])
				m.settle(c, used, nowMs())
				c.real.slot.Settle(limiter.Usage{Prompt: int64(used) / 2, Completion: int64(used) - int64(used)/2})
				step := fmt.Sprintf("step %d: settle %d at %v", i, c.id, used)
				granted(step, m.dispatch(nowMs()))
				check(step)
			}
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
			step := fmt.Sprintf("step %d: cancel %d", i, c.id)
			if tokens {
				// It may have held the line for tokens: its leave grants
				// the calls behind it that fit.
				granted(step, m.dispatch(nowMs()))
			}
			check(step)
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

// everyKeyExpires fails t if a key of the lanes under prefix has no expiry:
// lane.lua leaves every key it made with one at the end of every call, and
// re-expires only what a call may have made (see its expire and lasting).
func everyKeyExpires(t *testing.T, rdb redis.UniversalClient, prefix, step string) {
	t.Helper()
	for _, k := range rdb.Keys(context.Background(), prefix+":{*").Val() {
		if d := rdb.PTTL(context.Background(), k).Val(); d < 0 {
			t.Fatalf("%s: key %s has no expiry (PTTL %v)", step, k, d)
		}
	}
}
