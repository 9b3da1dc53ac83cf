package limiter

import (
	"context"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/budget"
	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// Snapshot is the state of every lane of a limiter, in the shape of
// DESIGN.md. Its JSON encoding is that shape, key for key; with the limiter
// off (the zero Snapshot) it is exactly {"enabled":false}. Limiter.Snapshot
// always sets GeneratedAt and a non-nil Lanes when on, so both keys are
// there, "lanes": [] included.
type Snapshot struct {
	Enabled     bool           `json:"enabled"`
	GeneratedAt time.Time      `json:"generated_at,omitzero"`
	Lanes       []LaneSnapshot `json:"lanes,omitzero"`
}

// LaneSnapshot is the state of one lane.
type LaneSnapshot struct {
	Lane             string           `json:"lane"`
	Limit            int              `json:"limit"`
	Reserve          int              `json:"reserve"` // the reserve in force, clamped
	Inflight         int              `json:"inflight"`
	Queued           int              `json:"queued"`
	QueuedByPriority QueuedByPriority `json:"queued_by_priority"`
	// OldestWait is how long the longest-waiting call has waited in this
	// acquisition; 0 with an empty queue.
	OldestWait Seconds `json:"oldest_wait_s"`
	// WaitP50 and WaitP90 are percentiles of the waits that ended in the
	// last 5 minutes, in a grant (an immediate grant counts as 0) or in a
	// queue timeout (its whole wait); nil when none did. A wait its caller
	// canceled is not a sample: its length was the caller's choice.
	WaitP50         *Seconds `json:"wait_p50_s_5m"`
	WaitP90         *Seconds `json:"wait_p90_s_5m"`
	QueueTimeouts5m int      `json:"queue_timeouts_5m"`
	// GaveUp5m counts the waits of the last 5 minutes that ended because
	// their callers gave up: they left (caller_gone), or their deadline
	// came or was foreseen before a slot (deadline; see WithDeadline), by
	// the call's own class. nil (and the key left out) when there were
	// none. An extra key.
	GaveUp5m *GaveUp `json:"gave_up_5m,omitempty"`
	// Saturated is true when the queue has been non-empty for 60 s or more
	// without a break.
	Saturated bool `json:"saturated"`
	// Abandoned is how many of this process's slots of the lane are held
	// for calls whose callers left while the upstream still works on them
	// (Slot.Abandon). An extra key, left out at 0.
	Abandoned int `json:"abandoned_inflight,omitempty"`
	// Upstream counts the lane's exchanges with the gateway in the last 5
	// minutes, as reported with RecordExchange; nil (and the key left out)
	// when there were none. It is an extra key beside the contract's.
	Upstream *UpstreamCounts `json:"upstream_5m,omitempty"`
	// ETA estimates how long a call of each class arriving now would wait
	// (see ETA). An extra key; Limiter.Snapshot always sets it.
	ETA *ETA `json:"eta_s,omitempty"`
	// Shared is set for a lane kept by a Backend (shared across
	// processes): then Inflight, Queued, QueuedByPriority, OldestWait and
	// Saturated are the lane's global figures, and Shared gives this
	// process's share and who holds the slots. An extra key.
	Shared *Shared `json:"shared,omitempty"`
	// ColdStart is true while the lane, made under Config.ColdStart, has
	// not heard from its gateway: Limit is 1 until it does. An extra key.
	ColdStart bool `json:"cold_start,omitempty"`
	// Tenants is the lane's share per tenant, busiest first (by queued,
	// then in flight): the first SnapshotTenantsShown, then the rest summed
	// as OtherTenant. nil (and the key left out) while the lane has seen
	// no named tenant. With a Backend, these are this process's calls.
	// An extra key.
	Tenants []TenantSnapshot `json:"tenants,omitempty"`
	// AllTenants is every tenant the lane tracks, sorted as Tenants, for
	// metrics: their series must not move between tenants as the top
	// ten changes. Not in the JSON.
	AllTenants []TenantSnapshot `json:"-"`
	// Tokens is the lane's token accounting (see Config.TokensPerMinute):
	// nil (and the key left out) until one of its calls carried an
	// estimate, a budget was set, or the provider's rate-limit headers
	// said something. An extra key.
	Tokens *TokenSnapshot `json:"tokens,omitempty"`
	// Adaptive is set for a lane with an adaptive limit: then Limit and
	// Reserve are the ones in force now. An extra key.
	Adaptive *AdaptiveState `json:"adaptive,omitempty"`
}

// Shared is the sharing of a lane kept by a Backend.
type Shared struct {
	// State is BackendOK, BackendLocalFallback or BackendUnavailable; with
	// either of the latter the global figures are this process's own.
	State string `json:"state"`
	// ProcessInflight and ProcessQueued are this process's share of the
	// lane: its calls holding a slot, and waiting by class. The lane's
	// metrics ({p}_llm_inflight, {p}_llm_queue_depth) report these, so
	// that summing them across processes gives the lane's figures.
	ProcessInflight int              `json:"process_inflight"`
	ProcessQueued   QueuedByPriority `json:"process_queued_by_priority"`
	// Holders counts the slots held, by process name; null when unknown.
	Holders map[string]int `json:"holders"`
	// FiguresAge is how old the global figures are: 0 when they were read
	// for this snapshot (or its scrape); more when the store did not answer
	// within SharedStateTimeout and the last figures read are shown.
	FiguresAge Seconds `json:"figures_age_s"`
}

// QueuedByPriority counts waiters by their own class.
// GaveUp counts waits whose callers gave up, by cause and class.
type GaveUp struct {
	CallerGone QueuedByPriority `json:"caller_gone"`
	Deadline   QueuedByPriority `json:"deadline"`
}

// gaveUpOf returns the snapshot's form of g, nil when it counts nothing.
func gaveUpOf(g stats.GaveUp) *GaveUp {
	if g == (stats.GaveUp{}) {
		return nil
	}
	by := func(c [3]uint32) QueuedByPriority {
		return QueuedByPriority{Interactive: int(c[0]), Default: int(c[1]), Bulk: int(c[2])}
	}
	return &GaveUp{CallerGone: by(g[stats.CallerGone]), Deadline: by(g[stats.Deadline])}
}

type QueuedByPriority struct {
	Interactive int `json:"interactive"`
	Default     int `json:"default"`
	Bulk        int `json:"bulk"`
}

// Seconds is a time in seconds, rounded to 0.1 and encoded in JSON with one
// decimal (38.0, 212.4).
type Seconds float64

func seconds(s float64) Seconds { return Seconds(math.Round(s*10) / 10) }

// Duration returns s as a time.Duration.
func (s Seconds) Duration() time.Duration { return time.Duration(float64(s) * float64(time.Second)) }

// MarshalJSON encodes s with exactly one decimal.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(seconds(float64(s))), 'f', 1, 64), nil
}

// snapshotLocked reports the lane at now. It changes nothing: the
// statistics are read as they stand at now, and a busy spell still going on
// is added to them rather than recorded.
func (l *lane) snapshotLocked(cfg *Config, now time.Time) LaneSnapshot {
	cfg = l.effLocked(cfg)
	s := LaneSnapshot{
		Lane:      l.key,
		Limit:     cfg.MaxInflight,
		Reserve:   cfg.Reserve(),
		Inflight:  l.slots.inflight,
		Queued:    l.q.n,
		Abandoned: l.slots.abandoned,
		QueuedByPriority: QueuedByPriority{
			Interactive: l.q.byClass[Interactive.Index()],
			Default:     l.q.byClass[Default.Index()],
			Bulk:        l.q.byClass[Bulk.Index()],
		},
	}
	s.AllTenants = l.snapshotTenantsLocked(cfg)
	s.Tokens = l.snapshotTokensLocked(cfg, now)
	s.Tenants = topTenants(s.AllTenants)
	if l.q.oldest != nil {
		s.OldestWait = seconds(now.Sub(l.q.oldest.enqueued).Seconds())
		s.Saturated = now.Sub(l.activity.since) >= saturationAfter
	}
	v := l.stats.At(now)
	if p50, p90, ok := v.Percentiles(); ok {
		a, b := seconds(p50), seconds(p90)
		s.WaitP50, s.WaitP90 = &a, &b
	}
	s.QueueTimeouts5m = v.Timeouts()
	s.GaveUp5m = gaveUpOf(v.GaveUp())
	s.Upstream = upstreamCounts(&v)
	s.ETA = l.etaLocked(cfg, now, &v)
	s.ColdStart, s.Adaptive = l.limit.state(cfg, now)
	if l.lim.backend != nil {
		s.ETA = nil // the local history says nothing of the other processes' calls
		s.Shared = &Shared{ProcessInflight: l.slots.inflight, ProcessQueued: QueuedByPriority{
			Interactive: l.slots.waiting[Interactive.Index()], Default: l.slots.waiting[Default.Index()], Bulk: l.slots.waiting[Bulk.Index()]}}
	}
	return s
}

// Snapshot reports every lane, sorted by key; with the limiter off it is
// Snapshot{Enabled: false}. It reads memory only, except with a Backend:
// then it asks the backend for the lanes' global figures, waiting at most
// SharedStateTimeout.
func (l *Limiter) Snapshot() Snapshot {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 {
		return Snapshot{}
	}
	now := l.clock.Now()
	s := Snapshot{Enabled: true, GeneratedAt: now.UTC().Truncate(time.Second), Lanes: []LaneSnapshot{}}
	l.lanes.Range(func(_, v any) bool {
		ln := v.(*lane)
		ln.mu.Lock()
		s.Lanes = append(s.Lanes, ln.snapshotLocked(cfg, now))
		ln.mu.Unlock()
		return true
	})
	sort.Slice(s.Lanes, func(i, j int) bool { return s.Lanes[i].Lane < s.Lanes[j].Lane })
	if l.backend != nil {
		l.mergeShared(s.Lanes, now)
	}
	return s
}

// snapshotTenantsLocked returns every tenant of the lane, the busiest first (by
// queued, then in flight, then name), or nil while it has seen no named
// tenant.
func (l *lane) snapshotTenantsLocked(cfg *Config) []TenantSnapshot {
	if !l.tenants.measured {
		return nil
	}
	var out []TenantSnapshot
	l.eachTenantLocked(func(t *tenant) {
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

// topTenants returns the first SnapshotTenantsShown of all (sorted as
// snapshotTenantsLocked sorts), then the rest summed as OtherTenant.
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

func (l *lane) snapshotTokensLocked(cfg *Config, now time.Time) *TokenSnapshot {
	tk := l.tok
	if tk == nil {
		return nil
	}
	ns := l.ns(now)
	s := &TokenSnapshot{TokensPerMinute: cfg.TokensPerMinute, MaxInflightTokens: cfg.MaxInflightTokens, Inflight: tk.Inflight}
	u1, u5 := l.stats.TokensOf(now, 6), l.stats.TokensOf(now, stats.Steps-1)
	s.Used1m = TokenCounts{Prompt: u1.Prompt, Completion: u1.Completion}
	s.Used5m = TokenCounts{Prompt: u5.Prompt, Completion: u5.Completion}
	if est := u5.Estimate; est > 0 {
		e := float64(u5.Prompt+u5.Completion-est) / float64(est)
		e = math.Round(e*1000) / 1000
		s.EstimateError5m = &e
	}
	if b := tk.Bucket; b.On {
		r := int64(b.LevelAt(ns))
		s.Remaining = &r
	} else if tk.Tokens.Active(ns) {
		r := int64(tk.Tokens.LevelAt(ns))
		s.Remaining = &r
	}
	if tk.said > 0 {
		p := &ProviderSnapshot{Age: seconds(float64(ns-tk.said) / 1e9)}
		p.Tokens, p.Requests = providerBudget(&tk.Tokens, ns), providerBudget(&tk.Requests, ns)
		if ns < tk.Hold {
			p.RetryAfter = seconds(float64(tk.Hold-ns) / 1e9)
		}
		if lim := tk.announcedLimitLocked(ns); lim > 0 {
			p.TokenLimit = &AnnouncedLimitSnapshot{Limit: lim, Binds: seconds(float64(tk.provUntil-ns) / 1e9)}
		}
		if c := tk.conc; c.at > 0 {
			p.Concurrency = &ConcurrencySnapshot{InflightAt429: c.inflight, Age: seconds(float64(ns-c.at) / 1e9), Count: c.count,
				Hold: seconds(float64(max(0, tk.ConcHold-ns)) / 1e9)}
		}
		s.Provider = p
	}
	if l.q.n > 0 {
		s.WaitingFor = map[string]string{}
		why := WaitSlot
		if w := l.q.best(ns); w != nil {
			if ok, r, _ := l.tokensFitAtLocked(cfg, w.cost, ns); !ok {
				why = r
			}
		}
		for _, p := range []Priority{Interactive, Default, Bulk} {
			if l.q.byClass[p.Index()] == 0 {
				continue
			}
			if l.fitsLocked(cfg, p) {
				s.WaitingFor[p.String()] = why
			} else {
				s.WaitingFor[p.String()] = WaitSlot
			}
		}
	}
	return s
}

func providerBudget(m *budget.Mirror, ns int64) *ProviderBudgetSnapshot {
	if !m.Active(ns) {
		return nil
	}
	return &ProviderBudgetSnapshot{Limit: int64(m.Limit), Remaining: int64(m.LevelAt(ns)), Reset: seconds(float64(max(0, m.Until-ns)) / 1e9),
		Binds: seconds(float64(m.BindsFor(ns)) / 1e9)}
}

// sharedCache is the last global figures read from the Backend, by lane,
// with when each was read (on the system clock: it bounds waits for the
// store, not lane time). reading is set while one snapshot reads the
// store: a snapshot taken meanwhile shows the figures as they are, with
// their age, rather than wait too.
type sharedCache struct {
	mu      sync.Mutex
	lanes   map[string]sharedRead
	reading bool
}

type sharedRead struct {
	SharedLane
	at time.Time
}

// mergeShared puts the backend's global figures into the snapshot's lanes.
// It waits for the store at most SharedStateTimeout, and not at all while
// another snapshot does; a lane the store does not report in time shows
// its last figures, and how old they are. A lane the store has never
// reported keeps this process's own figures, and says so in Shared.State.
func (l *Limiter) mergeShared(lanes []LaneSnapshot, now time.Time) {
	c := &l.shared
	c.mu.Lock()
	ask := !c.reading
	c.reading = true
	c.mu.Unlock()
	if ask {
		keys := make([]string, len(lanes))
		for i, s := range lanes {
			keys[i] = s.Lane
		}
		ctx, cancel := context.WithTimeout(context.Background(), SharedStateTimeout)
		global := l.backend.Lanes(ctx, keys)
		cancel()
		at := time.Now()
		c.mu.Lock()
		if c.lanes == nil {
			c.lanes = map[string]sharedRead{}
		}
		for k, g := range global {
			c.lanes[k] = sharedRead{g, at}
		}
		for k := range c.lanes { // forget lanes gone from the limiter
			if !slices.ContainsFunc(lanes, func(s LaneSnapshot) bool { return s.Lane == k }) {
				delete(c.lanes, k)
			}
		}
		c.reading = false
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wall := time.Now()
	for i := range lanes {
		s := &lanes[i]
		g, ok := c.lanes[s.Lane]
		if !ok {
			s.Shared.State = BackendUnavailable
			continue
		}
		if age := wall.Sub(g.at); age >= 50*time.Millisecond { // read for another snapshot, or long ago
			s.Shared.FiguresAge = seconds(age.Seconds())
		}
		s.Shared.State, s.Shared.Holders = g.State, g.Holders
		if g.State != BackendOK {
			continue
		}
		s.Inflight, s.QueuedByPriority = g.Inflight, g.QueuedByPriority
		if g.TokensRemaining != nil || g.TokensInflight != 0 || g.Provider != nil {
			cfg := l.cfg.Load()
			s.Tokens = &TokenSnapshot{TokensPerMinute: cfg.TokensPerMinute, MaxInflightTokens: cfg.MaxInflightTokens,
				Inflight: g.TokensInflight, Remaining: g.TokensRemaining, Provider: g.Provider}
			if s.Tokens.Remaining == nil && g.Provider != nil && g.Provider.Tokens != nil {
				r := g.Provider.Tokens.Remaining
				s.Tokens.Remaining = &r
			}
		}
		s.Queued = g.QueuedByPriority.Interactive + g.QueuedByPriority.Default + g.QueuedByPriority.Bulk
		s.OldestWait = seconds((g.OldestWait + wall.Sub(g.at)*time.Duration(boolInt(s.Queued > 0))).Seconds())
		s.Saturated = s.Queued > 0 && g.QueuedFor+wall.Sub(g.at) >= saturationAfter
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
