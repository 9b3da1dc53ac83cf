package limiter

import (
	"fmt"
	"math"
	"time"
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
	// joined is set at its first grant (DefaultTenant's from the start):
	// until then it is a newcomer, lifted to at least the lane's mark and
	// estimated with the newcomers' record (see liftLocked, calibrateLocked).
	joined bool
	// seen is its last grant or release, in ns since the limiter's origin:
	// idle since then, it is forgotten (see forgetLocked).
	seen int64
}

func newTenant(name string) *tenant {
	t := &tenant{name: name, label: name}
	if name == DefaultTenant {
		t.label, t.joined = "", true
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
	// mark is the newcomers' own service: a tenant that starts waiting
	// before its first grant is lifted to at least it, and moves it on by
	// what that grant will be charged (see liftLocked). fresh is the
	// newcomers' record of under-estimates (see calibrateLocked).
	mark  float64
	fresh over
	// pruned is when the lane last looked for idle tenants (swept: it
	// has), in ns since the limiter's origin (see forgetLocked).
	pruned int64
	swept  bool
}

// tenantLocked returns the tenant called name, made if need be; past
// cfg's bound of tenants, OtherTenant. A call of a newcomer (a tenant not
// yet granted one) first forgets the tenants gone idle (forgetLocked).
func (l *lane) tenantLocked(cfg *Config, name string) *tenant {
	ts := &l.tenants
	if name == "" || name == DefaultTenant {
		return ts.deflt
	}
	t, ok := ts.byName[name]
	if ok && t.joined {
		return t
	}
	l.forgetLocked(t)
	if ok {
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
	t = newTenant(name)
	ts.byName[name] = t
	return t
}

// Idle tenants are forgotten, so that a caller that changes its name per
// call cannot fill a lane's table (Fairness.MaxTenants: OtherTenant is
// for the tenants past it that are active at once) nor keep its
// bookkeeping growing. A tenant is idle when it has nothing queued and
// nothing in flight, and either was never granted a call or had none
// granted or ended for TenantIdle. Forgetting loses nothing a returning
// tenant would be owed: it comes back as a newcomer, lifted as every
// tenant that starts waiting is, and its record of under-estimates has
// faded by then (overHalfLife).
const (
	// TenantIdle is how long a tenant stays known after its last grant
	// or release.
	TenantIdle = 5 * time.Minute
	// tenantSweepEvery bounds how often a lane looks for idle tenants: at
	// a newcomer's call, at most once a minute, so that a rotating name
	// costs O(tenants) once a minute, not per call.
	tenantSweepEvery = time.Minute
)

// forgetLocked forgets the tenants gone idle, keep aside, at most once
// per tenantSweepEvery. Both engines sweep at the same calls (a
// newcomer's) and by the same rule, so that they know the same tenants.
func (l *lane) forgetLocked(keep *tenant) {
	ts := &l.tenants
	now := l.nowNS()
	if ts.swept && now-ts.pruned < int64(tenantSweepEvery) {
		return
	}
	ts.swept, ts.pruned = true, now
	for name, t := range ts.byName {
		if t == keep || t.queued > 0 || t.inflight > 0 || t.joined && now-t.seen < int64(TenantIdle) {
			continue
		}
		delete(ts.byName, name)
		if t == ts.other {
			ts.other = nil
		}
		if t == ts.last {
			ts.last = nil
		}
	}
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
// c with a call estimated at cost tokens, to the settled service of the
// tenant served next in that class (the least there; with none waiting in
// it, the tenant granted last), so that a tenant that was idle banks no
// credit to spend in a burst later: it is served as if it had been
// backlogged all along, from its first call (start-time fair queuing's
// virtual time; VTC's lift). Settled service leaves out what the others'
// calls in flight were charged ahead: an estimate that may exceed what
// they turn out to hold, and they are being served while t waits.
//
// A newcomer (not yet granted a call) is lifted to at least the lane's
// mark, and moves the mark on by what its grant will be charged: the
// newcomers are served as one more tenant would be. Without it a caller
// that names a new tenant for every call would have each call lifted to
// the least service, level with the tenant served next, and take a
// share per name (docs/DESIGN.md, "Tenants and fair shares").
func (l *lane) liftLocked(cfg *Config, t *tenant, c int, cost int64) {
	ts := &l.tenants
	floor, ok := l.q.settledIn(c)
	if !ok && ts.last != nil {
		floor, ok = ts.last.vs-ts.last.pending, true
	}
	if !t.joined {
		floor, ok = max(floor, ts.mark), true
	}
	if ok && t.vs < floor {
		t.vs = floor
		l.q.serviceChanged(t) // its heads, if parked with waiters, are out
	}
	if !t.joined {
		ts.mark = t.vs + l.chargeOfLocked(cfg, t, cost)
	}
}

// chargeOfLocked returns what a grant to t of a call estimated at cost tokens
// (0: none) is charged, in the lane's unit of service, per its weight.
func (l *lane) chargeOfLocked(cfg *Config, t *tenant, cost int64) float64 {
	c := l.tenants.estOf(t)
	if l.tenants.tokens {
		c = l.tenants.perCall
		if cost > 0 {
			c = float64(cost)
		}
	}
	return c / cfg.weight(t)
}

// chargeLocked counts a grant to t, held by h, of a call estimated at cost
// tokens (0: none), at now (ns since the origin; read only if the lane
// measures service).
func (l *lane) chargeLocked(cfg *Config, t *tenant, h *hold, cost int64) {
	h.t = t
	t.inflight++
	if !t.joined { // its first grant (h.fresh is false otherwise: see settleLocked)
		h.fresh, t.joined = true, true
	}
	l.tenants.last = t
	if l.tenants.measured {
		if cost > 0 && !l.tenants.tokens {
			l.inTokensLocked(cost)
		}
		h.timed, h.at = true, l.nowNS()
		t.seen = h.at
		h.inTokens = l.tenants.tokens
		h.charge = l.chargeOfLocked(cfg, t, cost)
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
	t, fresh := h.t, h.fresh
	h.t, h.fresh = nil, false
	t.inflight--
	if h.timed {
		now := l.nowNS()
		t.seen = now
		d := float64(now-h.at) / 1e9
		dv := 0.0 // its service, settled
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
			dv = used/cfg.weight(t) - h.charge
			t.pending -= h.charge
		default:
			dv = d/cfg.weight(t) - h.charge
			t.pending -= h.charge
		}
		t.vs += dv
		if fresh {
			// A newcomer's first call moved the mark on by its charge:
			// the mark is settled as its service is, so that the
			// newcomers pay what their calls held, not what they said.
			l.tenants.mark += dv
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
	l.tenants.tokens, l.tenants.perCall, l.tenants.mark = true, float64(cost), 0
	l.eachTenantLocked(func(t *tenant) {
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
	l.eachTenantLocked(func(t *tenant) {
		switch c := capped(cfg, t); {
		case c && !t.parked:
			l.q.park(t)
		case !c && t.parked:
			l.q.unpark(t)
		}
	})
}

func (l *lane) eachTenantLocked(f func(*tenant)) {
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

// SnapshotTenantsShown is how many tenants a lane's snapshot names; the
// rest are summed as OtherTenant.
const SnapshotTenantsShown = 10

func validWeight(w float64) bool { return w > 0 && !math.IsInf(w, 0) && !math.IsNaN(w) }
