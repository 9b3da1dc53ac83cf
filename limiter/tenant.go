package limiter

import (
	"context"
	"fmt"
	"math"
	"sort"
)

// Tenant names the lane keeps for itself.
const (
	// DefaultTenant is the tenant of a call that carries none: a lane whose
	// calls name no tenant has this one only, and orders them exactly as
	// it would with no tenants at all.
	DefaultTenant = "default"
	// OtherTenant is the tenant of the calls whose own tenant a lane does
	// not track by name, beyond Fairness.MaxTenants; the snapshot's
	// "tenants" also sums the tenants past its first ten under it.
	OtherTenant = "other"
)

// MaxTenantLen is the longest tenant name ValidTenant accepts.
const MaxTenantLen = 64

// ValidTenant reports whether name is a valid tenant name: 1 to
// MaxTenantLen bytes of A-Z, a-z, 0-9 and . _ : -. Tenant names become
// metric labels; a caller that takes them from its own callers (a proxy's
// header) should refuse the others.
func ValidTenant(name string) error {
	if name == "" || len(name) > MaxTenantLen {
		return fmt.Errorf("limiter: tenant %q: want 1 to %d bytes", truncate(name, MaxTenantLen), MaxTenantLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return fmt.Errorf("limiter: tenant %q: byte %d is not one of A-Z a-z 0-9 . _ : -", truncate(name, MaxTenantLen), i)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

type tenantKey struct{}

// WithTenant returns a context whose model calls are tenant name's: within
// a class, a lane shares its slots fairly between tenants (see Fairness).
// Goroutines started with the returned context inherit the tenant. The
// empty name is DefaultTenant.
func WithTenant(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, tenantKey{}, name)
}

// TenantFrom returns the tenant carried by ctx, or "" when it carries none.
func TenantFrom(ctx context.Context) string {
	s, _ := ctx.Value(tenantKey{}).(string)
	return s
}

// initialSlotTime is what a grant is charged, in seconds of slot-time,
// before any call of its lane has ended (see tenant.est).
const initialSlotTime = 1.0

// tenant is one tenant of one lane: its share of the lane's service and
// its calls there. Guarded by the lane's lock.
//
// Its service is the slot-time its calls held, divided by its weight. A
// call is charged when it is granted, with an estimate (est: the mean
// slot-time of the tenant's calls, or the lane's before the tenant has
// any), and the difference to its real slot-time is settled when it is
// released, so that a tenant holding many slots at once is charged for
// them while they run, not only once they end.
type tenant struct {
	name     string
	label    string  // for events: name, or "" for DefaultTenant
	vs       float64 // weighted service, in seconds of slot-time per unit of weight
	pending  float64 // the part of vs charged to calls still in flight
	est      float64 // the mean slot-time of its calls, in seconds, once one has ended (hasEst)
	hasEst   bool
	served   float64 // slot-time received, in seconds (unweighted)
	inflight int
	queued   int
	parked   bool // at its cap: its calls are out of the queue's heads
	q        [3]fifo
	// over is how far its calls' use has lately run past their estimates
	// (see calibrateLocked).
	over over
}

func newTenant(name string) *tenant {
	t := &tenant{name: name, label: name}
	if name == DefaultTenant {
		t.label = ""
	}
	for i := range t.q {
		t.q[i] = fifo{t: t, class: int8(i)}
	}
	return t
}

// tenants is a lane's tenants.
type tenants struct {
	byName map[string]*tenant // every tenant but the default
	deflt  *tenant
	other  *tenant // made with the first tenant past the bound
	// last is the tenant granted last: the service a tenant that starts
	// waiting while no other waits is raised to.
	last *tenant
	// measured is set once a call named a tenant: from then on grants
	// read the clock, to charge their slot-time. A lane of the default
	// tenant alone has no one to be fair to, and reads no clock for it.
	measured bool
	est      float64 // the mean slot-time of the lane's calls, in seconds
	// tokens is set once a call with a token estimate (WithTokens) was
	// granted while the lane measures service: from then on service is
	// counted in tokens (the call's estimate at the grant, settled to what
	// it used at the release), so that a tenant of long prompts does not
	// get the share of one of short ones. perCall is the mean tokens of a
	// call, charged to a call that carries no estimate.
	tokens  bool
	perCall float64
}

// tenantLocked returns the tenant called name, made if need be; past
// cfg's bound of tenants, OtherTenant.
func (l *lane) tenantLocked(cfg *Config, name string) *tenant {
	ts := &l.tenants
	if name == "" || name == DefaultTenant {
		return ts.deflt
	}
	if t, ok := ts.byName[name]; ok {
		return t
	}
	ts.measured = true
	if ts.byName == nil {
		ts.byName = map[string]*tenant{}
	}
	named := len(ts.byName)
	if ts.other != nil {
		named--
	}
	if name == OtherTenant || (cfg.fairness().MaxTenants > 0 && named >= cfg.fairness().MaxTenants) {
		if ts.other == nil {
			ts.other = newTenant(OtherTenant)
			ts.byName[OtherTenant] = ts.other
		}
		return ts.other
	}
	t := newTenant(name)
	ts.byName[name] = t
	return t
}

// estOf returns what a grant to t is charged, in seconds of slot-time: the
// mean slot-time of its calls, or before one has ended, the lane's as it
// is then (so a tenant's first call is charged what the lane knows at its
// grant, not at the tenant's first sight).
func (ts *tenants) estOf(t *tenant) float64 {
	if t.hasEst {
		return t.est
	}
	return ts.est
}

// weight returns t's weight under cfg.
func (cfg *Config) weight(t *tenant) float64 { return cfg.Fairness.Weight(t.name) }

// Weight returns the weight of tenant under f: its entry in Weights, or 1.
// A nil *Fairness gives every tenant 1.
func (f *Fairness) Weight(tenant string) float64 {
	if f != nil {
		if w, ok := f.Weights[tenant]; ok {
			return w
		}
	}
	return 1
}

// nowNS returns the clock's time in ns since the limiter's origin.
func (l *lane) nowNS() int64 { return int64(l.lim.clock.Now().Sub(l.lim.origin)) }

// liftLocked raises the service of t, which starts waiting in class index
// c, to the settled service of the tenant served next in that class (the
// least there; with none waiting in it, the tenant granted last), so that
// a tenant that was idle banks no credit to spend in a burst later: it is
// served as if it had been backlogged all along, from its first call
// (start-time fair queuing's virtual time; VTC's lift). Settled service
// leaves out what the others' calls in flight were charged ahead: an
// estimate that may exceed what they turn out to hold, and they are being
// served while t waits.
func (l *lane) liftLocked(t *tenant, c int) {
	floor, ok := l.q.settledIn(c)
	if !ok {
		if l.tenants.last == nil {
			return
		}
		floor = l.tenants.last.vs - l.tenants.last.pending
	}
	if t.vs < floor {
		t.vs = floor
		l.q.serviceChanged(t) // its heads, if parked with waiters, are out
	}
}

// chargeLocked counts a grant to t, held by h, of a call estimated at cost
// tokens (0: none), at now (ns since the origin; read only if the lane
// measures service).
func (l *lane) chargeLocked(cfg *Config, t *tenant, h *hold, cost int64) {
	h.t = t
	t.inflight++
	l.tenants.last = t
	if l.tenants.measured {
		if cost > 0 && !l.tenants.tokens {
			l.inTokensLocked(cost)
		}
		h.timed, h.at = true, l.nowNS()
		c := l.tenants.estOf(t)
		if h.inTokens = l.tenants.tokens; h.inTokens {
			c = l.tenants.perCall
			if cost > 0 {
				c = float64(cost)
			}
		}
		h.charge = c / cfg.weight(t)
		t.vs += h.charge
		t.pending += h.charge
		l.q.serviceChanged(t)
	}
	if capped(cfg, t) && !t.parked {
		l.q.park(t)
	}
}

// settleLocked counts the release of h: its slot-time, less what its grant
// was charged, and the tenant's cap.
func (l *lane) settleLocked(cfg *Config, h *hold) {
	t := h.t
	h.t = nil
	t.inflight--
	if h.timed {
		d := float64(l.nowNS()-h.at) / 1e9
		switch {
		case h.inTokens != l.tenants.tokens:
			// Charged in slot-time before the lane turned to tokens, which
			// started every tenant's service again: nothing to settle.
		case h.inTokens:
			used := l.tenants.perCall // a call with no estimate: the mean
			if h.est > 0 {
				used = float64(h.cost) // what it used (Slot.Settle), else its estimate
				l.tenants.perCall += (used - l.tenants.perCall) / 8
			}
			t.vs += used/cfg.weight(t) - h.charge
			t.pending -= h.charge
		default:
			t.vs += d/cfg.weight(t) - h.charge
			t.pending -= h.charge
		}
		t.served += d
		e := l.tenants.estOf(t)
		t.est, t.hasEst = e+(d-e)/4, true
		l.tenants.est += (d - l.tenants.est) / 8
		h.timed, h.at, h.charge, h.inTokens = false, 0, 0, false
		l.q.serviceChanged(t)
	}
	if t.parked && !capped(cfg, t) {
		l.q.unpark(t)
	}
}

// inTokensLocked turns the lane's service to tokens, at its first grant
// with an estimate, of cost: every tenant's service starts again from 0
// (slot-time and tokens do not compare), and a call with no estimate is
// charged cost until the lane has measured its mean.
func (l *lane) inTokensLocked(cost int64) {
	l.tenants.tokens, l.tenants.perCall = true, float64(cost)
	l.eachTenant(func(t *tenant) {
		t.vs, t.pending = 0, 0
		l.q.serviceChanged(t)
	})
}

func capped(cfg *Config, t *tenant) bool {
	// Off (MaxInflight 0), a lane admits every waiter: no cap either.
	f := cfg.Fairness
	return cfg.MaxInflight > 0 && f != nil && f.MaxInflightPerTenant > 0 && t.inflight >= f.MaxInflightPerTenant
}

// recapLocked parks and unparks the tenants after the cap changed.
func (l *lane) recapLocked(cfg *Config) {
	l.eachTenant(func(t *tenant) {
		switch c := capped(cfg, t); {
		case c && !t.parked:
			l.q.park(t)
		case !c && t.parked:
			l.q.unpark(t)
		}
	})
}

func (l *lane) eachTenant(f func(*tenant)) {
	f(l.tenants.deflt)
	for _, t := range l.tenants.byName {
		f(t)
	}
}

// TenantSnapshot is one tenant's share of a lane.
type TenantSnapshot struct {
	Tenant   string `json:"tenant"`
	Inflight int    `json:"inflight"`
	Queued   int    `json:"queued"`
	// Service is the slot-time its calls have held since the lane first
	// saw a named tenant, in seconds (weights not applied); a call counts
	// when it ends.
	Service Seconds `json:"service_s"`
	Weight  float64 `json:"weight"`
}

// snapshotTenants returns every tenant of the lane, the busiest first (by
// queued, then in flight, then name), or nil while it has seen no named
// tenant.
func (l *lane) snapshotTenants(cfg *Config) []TenantSnapshot {
	if !l.tenants.measured {
		return nil
	}
	var out []TenantSnapshot
	l.eachTenant(func(t *tenant) {
		out = append(out, TenantSnapshot{Tenant: t.name, Inflight: t.inflight, Queued: t.queued,
			Service: Seconds(t.served), Weight: cfg.weight(t)})
	})
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Queued != b.Queued {
			return a.Queued > b.Queued
		}
		if a.Inflight != b.Inflight {
			return a.Inflight > b.Inflight
		}
		return a.Tenant < b.Tenant
	})
	return out
}

// SnapshotTenantsShown is how many tenants a lane's snapshot names; the
// rest are summed as OtherTenant.
const SnapshotTenantsShown = 10

// topTenants returns the first SnapshotTenantsShown of all (sorted as
// snapshotTenants sorts), then the rest summed as OtherTenant.
func topTenants(all []TenantSnapshot) []TenantSnapshot {
	if all == nil {
		return nil
	}
	var top []TenantSnapshot
	other := TenantSnapshot{Tenant: OtherTenant, Weight: 1}
	seen := false
	for _, t := range all {
		if t.Tenant != OtherTenant && len(top) < SnapshotTenantsShown {
			top = append(top, t)
			continue
		}
		other.Inflight += t.Inflight
		other.Queued += t.Queued
		other.Service += t.Service
		seen = true
	}
	if seen {
		top = append(top, other)
	}
	for i := range top {
		top[i].Service = seconds(float64(top[i].Service))
	}
	return top
}

func validWeight(w float64) bool { return w > 0 && !math.IsInf(w, 0) && !math.IsNaN(w) }
