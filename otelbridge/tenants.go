package otelbridge

import (
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// DefaultMaxTenantSeries is how many (lane, tenant) series a bridge reports
// by name when Options.MaxTenantSeries is 0.
const DefaultMaxTenantSeries = 1000

// tenantSeries bounds the tenant series a bridge reports across all its
// lanes: a lane bounds its own tenants (Fairness.MaxTenants), but a
// thousand lanes of a hundred tenants each would be a hundred thousand
// series per metric. The first max (lane, tenant) pairs seen are reported
// by name, and keep their series while the lane tracks the tenant (a
// series that came and went with every scrape would be no series at all)
// and while it is active: a named tenant idle for tenantSeriesIdle (no
// call in flight or queued, no service received) gives its name up to an
// active tenant that has none, so that one caller's burst of names cannot
// keep the honest tenants unnamed after it has gone quiet. A lane's other
// tenants are summed as limiter.OtherTenant, with the lane's own "other". The sum's service is kept monotonic, as a counter
// must be: it grows by what each tenant in it received since the last
// collection, not by what a tenant that left it had received.
type tenantSeries struct {
	mu    sync.Mutex
	max   int
	named map[tenantKey]*namedSeries
	other map[string]*otherSum // by lane
}

type tenantKey struct{ lane, tenant string }

// namedSeries is a tenant reported by name: when it was last active, and
// its service then.
type namedSeries struct {
	active  time.Time
	service float64
}

// tenantSeriesIdle is how long a named tenant stays idle before an active
// tenant with no name of its own may take its place.
const tenantSeriesIdle = 5 * time.Minute

// otherSum is one lane's tenants past the bound: their service so far
// (monotonic), and each one's service when last counted.
type otherSum struct {
	service float64
	last    map[string]float64
}

func newTenantSeries(max int) *tenantSeries {
	if max <= 0 {
		max = DefaultMaxTenantSeries
	}
	return &tenantSeries{max: max, named: map[tenantKey]*namedSeries{}, other: map[string]*otherSum{}}
}

// split returns, for each lane of lanes (a snapshot taken at now) with
// tenants, the tenants reported by name and, if any are not, their sum as
// limiter.OtherTenant.
func (s *tenantSeries) split(lanes []limiter.LaneSnapshot, now time.Time) map[string][]limiter.TenantSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	present := map[tenantKey]bool{}
	for _, l := range lanes {
		for _, t := range l.AllTenants {
			present[tenantKey{l.Lane, t.Tenant}] = true
		}
	}
	for k := range s.named {
		if !present[k] {
			delete(s.named, k) // forgotten by its lane, or the lane is gone
		}
	}
	var idle []tenantKey // named tenants that may give their names up, found once
	idleFound := false
	take := func(k tenantKey) bool { // a name for active tenant k, if one is free or idle
		if len(s.named) < s.max {
			return true
		}
		if !idleFound {
			idleFound = true
			for n, st := range s.named {
				if now.Sub(st.active) >= tenantSeriesIdle {
					idle = append(idle, n)
				}
			}
		}
		if len(idle) == 0 {
			return false
		}
		delete(s.named, idle[len(idle)-1])
		idle = idle[:len(idle)-1]
		return true
	}
	// The named tenants' activity first, then the active unnamed ones take
	// the names of idle ones, before any series is reported.
	for _, l := range lanes {
		for _, t := range l.AllTenants {
			if st := s.named[tenantKey{l.Lane, t.Tenant}]; st != nil && (t.Inflight > 0 || t.Queued > 0 || float64(t.Service) != st.service) {
				st.active, st.service = now, float64(t.Service)
			}
		}
	}
	for _, l := range lanes {
		for _, t := range l.AllTenants {
			k := tenantKey{l.Lane, t.Tenant}
			if s.named[k] == nil && t.Tenant != limiter.OtherTenant && (t.Inflight > 0 || t.Queued > 0) && take(k) {
				s.named[k] = &namedSeries{active: now, service: float64(t.Service)}
			}
		}
	}
	out := make(map[string][]limiter.TenantSnapshot, len(lanes))
	seen := map[string]bool{}
	for _, l := range lanes {
		seen[l.Lane] = true
		if len(l.AllTenants) == 0 {
			continue
		}
		var named []limiter.TenantSnapshot
		sum := limiter.TenantSnapshot{Tenant: limiter.OtherTenant, Weight: 1}
		o := s.other[l.Lane]
		in := map[string]bool{}
		for _, t := range l.AllTenants {
			k := tenantKey{l.Lane, t.Tenant}
			if s.named[k] == nil && t.Tenant != limiter.OtherTenant && len(s.named) < s.max {
				s.named[k] = &namedSeries{active: now, service: float64(t.Service)}
			}
			if s.named[k] != nil {
				named = append(named, t)
				continue
			}
			if o == nil {
				o = &otherSum{last: map[string]float64{}}
				s.other[l.Lane] = o
			}
			sum.Inflight += t.Inflight
			sum.Queued += t.Queued
			got := float64(t.Service)
			if last := o.last[t.Tenant]; got >= last {
				o.service += got - last
			} else {
				o.service += got // forgotten and back: its service started again
			}
			o.last[t.Tenant] = got
			in[t.Tenant] = true
		}
		if o != nil {
			for t := range o.last {
				if !in[t] {
					delete(o.last, t)
				}
			}
			sum.Service = limiter.Seconds(o.service)
			named = append(named, sum)
		}
		out[l.Lane] = named
	}
	for lane := range s.other {
		if !seen[lane] {
			delete(s.other, lane)
		}
	}
	return out
}
