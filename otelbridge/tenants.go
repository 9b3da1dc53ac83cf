package otelbridge

import (
	"sync"

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
// series that came and went with every scrape would be no series at all);
// a lane's other tenants are summed as limiter.OtherTenant, with the
// lane's own "other". The sum's service is kept monotonic, as a counter
// must be: it grows by what each tenant in it received since the last
// collection, not by what a tenant that left it had received.
type tenantSeries struct {
	mu    sync.Mutex
	max   int
	named map[tenantKey]bool
	other map[string]*otherSum // by lane
}

type tenantKey struct{ lane, tenant string }

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
	return &tenantSeries{max: max, named: map[tenantKey]bool{}, other: map[string]*otherSum{}}
}

// split returns, for each lane of lanes with tenants, the tenants reported
// by name and, if any are not, their sum as limiter.OtherTenant.
func (s *tenantSeries) split(lanes []limiter.LaneSnapshot) map[string][]limiter.TenantSnapshot {
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
			if t.Tenant != limiter.OtherTenant && (s.named[k] || len(s.named) < s.max) {
				s.named[k] = true
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
