package limiter_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// fairRun drives a lane of limit slots on the fake clock, with tenants that
// each keep backlog calls queued at every moment (continuously
// backlogged), call lengths drawn from [1 s, 20 s] by seed, and tenant
// late joining after join. It checks, at every release and grant, that
// check(received) holds, where received is each tenant's slot-time so far
// (calls ended plus the elapsed part of calls running), and returns the
// grants' tenants in order.
//
// The calls are Interactive: interactive calls never age, so every waiter
// stays in one effective class all along (with a deeper class, aging
// would move the longest waiters up a class, which the reserve and class
// tests cover, not this one).
type fairRun struct {
	limit, backlog int
	tenants        []string
	weights        map[string]float64
	late           string        // joins at join
	join           time.Duration // when late joins
	length         time.Duration // of the run
	seed           uint64
}

type running struct {
	id, tenant string
	slot       *limiter.Slot
	start, end time.Time
}

func (f fairRun) run(t *testing.T, check func(now time.Time, received map[string]float64, longest float64, grants int)) []string {
	t.Helper()
	cfg := cfgN(f.limit)
	cfg.QueueTimeout = 24 * time.Hour
	cfg.Fairness = &limiter.Fairness{Weights: f.weights}
	h := newHarness(t, cfg)
	rng := rand.New(rand.NewPCG(f.seed, 1))
	var run []running
	done := map[string]float64{}
	tenantOf, lengthOf := map[string]string{}, map[string]time.Duration{}
	longest := 0.0
	n := 0
	var order []string
	ctxs := map[string]context.Context{}
	ctxOf := func(tn string) context.Context {
		if ctxs[tn] == nil {
			ctxs[tn] = limiter.WithTenant(context.Background(), tn)
		}
		return ctxs[tn]
	}
	start := func(r result, now time.Time) {
		if r.err != nil {
			t.Fatalf("%s: %v", r.id, r.err)
		}
		s := r.slot
		tn := tenantOf[r.id]
		run = append(run, running{id: r.id, tenant: tn, slot: &s, start: now, end: now.Add(lengthOf[r.id])})
		order = append(order, tn)
	}
	submit := func(tn string) {
		n++
		id := fmt.Sprintf("%s-%d", tn, n)
		tenantOf[id] = tn
		lengthOf[id] = time.Duration(10+rng.IntN(191)) * 100 * time.Millisecond
		if granted, r := h.call(ctxOf(tn), "L", id, limiter.Interactive); granted {
			start(r, h.clock.Now())
		}
	}
	active := func(now time.Time) []string {
		var a []string
		for _, tn := range f.tenants {
			if tn != f.late || now.Sub(t0) >= f.join {
				a = append(a, tn)
			}
		}
		return a
	}
	received := func(now time.Time) map[string]float64 {
		r := map[string]float64{}
		for _, tn := range active(now) {
			r[tn] = done[tn]
		}
		for _, c := range run {
			r[c.tenant] += now.Sub(c.start).Seconds()
		}
		return r
	}
	queued := func(tn string) int {
		snap := h.lim.Snapshot()
		if len(snap.Lanes) == 0 {
			return 0
		}
		for _, s := range snap.Lanes[0].AllTenants {
			if s.Tenant == tn {
				return s.Queued
			}
		}
		return 0
	}
	// topUp queues calls round robin, a call per tenant at a time, so
	// that tenants that start together share the slots from the start.
	topUp := func(now time.Time) {
		for more := true; more; {
			more = false
			for _, tn := range active(now) {
				if queued(tn) < f.backlog {
					submit(tn)
					more = true
				}
			}
		}
	}
	topUp(t0)
	joined := f.late == ""
	for h.clock.Now().Sub(t0) < f.length {
		// The next event: the first call to end, or the late tenant's join.
		slices.SortFunc(run, func(a, b running) int { return a.end.Compare(b.end) })
		next := run[0].end
		if !joined && t0.Add(f.join).Before(next) {
			h.clock.Advance(t0.Add(f.join).Sub(h.clock.Now()))
			joined = true
			topUp(h.clock.Now())
			check(h.clock.Now(), received(h.clock.Now()), longest, len(order))
			continue
		}
		h.clock.Advance(next.Sub(h.clock.Now()))
		now := h.clock.Now()
		check(now, received(now), longest, len(order))
		c := run[0]
		run = run[1:]
		c.slot.Release()
		d := c.end.Sub(c.start).Seconds()
		done[c.tenant] += d
		longest = max(longest, d)
		start(h.next(), now) // the slot goes on at once: every tenant is backlogged
		topUp(now)
		check(now, received(now), longest, len(order))
	}
	for _, c := range run {
		c.slot.Release()
	}
	for range len(tenantOf) - len(order) {
		r := h.next() // the calls left queued are granted as slots free
		r.slot.Release()
	}
	return order
}

// spread returns the largest difference between two tenants' received
// slot-time, each divided by its weight.
func spread(received map[string]float64, weights map[string]float64) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for tn, r := range received {
		w := 1.0
		if x, ok := weights[tn]; ok {
			w = x
		}
		lo, hi = min(lo, r/w), max(hi, r/w)
	}
	return hi - lo
}

// TestFairnessBound: continuously backlogged tenants in one class receive
// slot-time (divided by their weights) that differs, at every moment, by
// at most the longest single call's slot-time in a lane of one slot, and
// by at most the lane's slots times it in a lane of more: each of a
// tenant's calls in flight was charged an estimate, which its real length
// may exceed by up to the longest call; plus the newcomers' stagger, one
// charge per tenant that was a newcomer before it (package limiter's
// documentation has the bound and where it comes from). Lanes of 1, 2 and 4 slots; 2, 3
// and 5 tenants, of equal weights and 2:1; call lengths uniform in
// [1 s, 20 s]; six seeds each; 90 simulated minutes. The worst spread
// measured is logged, as a fraction of the longest call.
func TestFairnessBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenants []string
		weights map[string]float64
	}{
		{"two", []string{"a", "b"}, nil},
		{"five", []string{"a", "b", "c", "d", "e"}, nil},
		{"weights 2:1", []string{"a", "b"}, map[string]float64{"a": 2}},
		{"weights 2:1:1", []string{"a", "b", "c"}, map[string]float64{"a": 2}},
	} {
		for _, limit := range []int{1, 2, 4} {
			for seed := range uint64(6) {
				t.Run(fmt.Sprintf("%s/limit %d/seed %d", tc.name, limit, seed), func(t *testing.T) {
					worst := 0.0
					// The tenants are newcomers together: each one queued
					// is lifted to the newcomers' mark, one charge (the
					// lane's mean slot-time then, 1 s, over its weight)
					// past the one before it.
					stagger := float64(len(tc.tenants) - 1)
					r := fairRun{limit: limit, backlog: 2, tenants: tc.tenants, weights: tc.weights, length: 90 * time.Minute, seed: seed}
					r.run(t, func(now time.Time, received map[string]float64, longest float64, grants int) {
						// Before the first call ends there is no longest call
						// yet: every call is at most 20 s.
						d := max(longest, 20)
						s := spread(received, tc.weights)
						worst = max(worst, (s-stagger)/d)
						if s > float64(limit)*d+stagger+1e-9 {
							t.Fatalf("at %s: received %v (weights %v) spread %.1f s, over %d slots times the longest call, %.1f s, plus the newcomers' stagger, %.1f s",
								now.Sub(t0), received, tc.weights, s, limit, d, stagger)
						}
					})
					t.Logf("worst spread %.2f of the longest call", worst)
				})
			}
		}
	}
}

// TestFairnessLateTenant: a tenant that starts an hour after the others
// gets its share from its first call and no catch-up burst. Its first call
// is granted within three grants of its join, and from then on it is
// served as if it had been backlogged all along at the level of the least
// served tenant at its join, within the bound of TestFairnessBound plus
// one call.
func TestFairnessLateTenant(t *testing.T) {
	for _, limit := range []int{1, 2, 4} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("limit %d/seed %d", limit, seed), func(t *testing.T) {
				join := time.Hour
				var base map[string]float64
				joinedAt := 0
				r := fairRun{limit: limit, backlog: 2, tenants: []string{"a", "b", "late"}, late: "late", join: join, length: 90 * time.Minute, seed: seed}
				order := r.run(t, func(now time.Time, received map[string]float64, longest float64, grants int) {
					if now.Sub(t0) < join {
						return
					}
					if base == nil {
						joinedAt = grants
						base = map[string]float64{}
						for tn, v := range received {
							base[tn] = v
						}
						base["late"] = 0
					}
					// The late tenant is served as if it had been backlogged
					// all along at the level of the least served at its join:
					// that level plus what it received since stays within the
					// fairness bound of the others' slot-time, neither behind
					// (its share from its first call) nor ahead (no catch-up),
					// by one call more than the bound: the join falls within
					// a running call, which the lane had charged ahead and
					// this level counts as received.
					floor := math.Inf(1)
					for tn, v := range base {
						if tn != "late" {
							floor = min(floor, v)
						}
					}
					level := map[string]float64{}
					for tn, v := range received {
						level[tn] = v
					}
					level["late"] = floor + received["late"]
					d := max(longest, 20)
					if s := spread(level, nil); s > float64(limit+1)*d+1e-9 {
						t.Fatalf("at %s: the late tenant's level (from the least served at its join, %.1f s) and the others' slot-time %v: spread %.1f s, over %d slots plus one times the longest call, %.1f s",
							now.Sub(t0), floor, level, s, limit, d)
					}
				})
				// Its first call is granted within the next grants, one per
				// tenant waiting, as a newcomer in round robin would be.
				if first := slices.Index(order, "late"); first < 0 || first > joinedAt+3 {
					t.Fatalf("late tenant: first granted %d grants after its join, want within 3 (order %v)", first-joinedAt, order[joinedAt:min(len(order), joinedAt+20)])
				}
			})
		}
	}
}
