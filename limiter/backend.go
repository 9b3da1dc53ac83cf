package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// A Backend keeps the slots and queues of lanes outside this process, in a
// store that several processes share, so that they share one budget per
// lane (package sharedlane keeps them in Redis). With a backend set
// (WithBackend), Acquire asks it for every slot, and the backend decides
// grants with the same rules as an in-process lane: the limit and the
// reserve of Config, classes with aging from the logical arrival, FIFO
// within a class, the queue timeout. The Limiter keeps, per lane, this
// process's share (its holders and waiters) and its statistics (waits,
// queue timeouts, exchanges), and its snapshot reports the lane's global
// figures beside them.
//
// A Backend must be safe for concurrent use.
type Backend interface {
	// Acquire blocks until the call r describes holds a slot in lane
	// r.Lane, its wait reaches r.Config.QueueTimeout (it returns an error
	// for which errors.Is(err, ErrQueueTimeout) holds), or ctx ends (it
	// returns ctx.Err()). A call whose wait ends without a slot leaves
	// nothing in the backend. It returns an error for which
	// errors.Is(err, ErrLaneUnavailable) holds when the backend can neither
	// reach its store nor fall back.
	Acquire(ctx context.Context, r Request) (Lease, error)
	// Lanes returns the global state of the lanes named by keys, as far as
	// the backend can tell within ctx; a key it knows nothing of is absent.
	Lanes(ctx context.Context, keys []string) map[string]SharedLane
}

// Request is one acquisition asked of a Backend.
type Request struct {
	Lane     string
	Priority Priority // the call's own class
	// Tenant is the call's tenant (DefaultTenant when it names none): the
	// backend shares the lane between tenants as Config.Fairness says.
	Tenant  string
	Arrival time.Time // its logical arrival (see WithArrival), on the limiter's clock
	Config  Config    // the settings in force: MaxInflight, the reserve, QueueTimeout, Fairness, the token budgets
	// Tokens is the call's estimate (WithTokens), 0 for none: a Backend
	// that keeps token budgets (TokenBackend) charges it.
	Tokens int64
	// Queued, if the call has to wait, is called once, on the goroutine
	// that called Acquire and before Acquire returns, with its place in
	// line (waiters of the same or a higher class, itself included).
	Queued func(position int)
}

// A Lease is a slot granted by a Backend.
type Lease interface {
	// Release gives the slot back. It is called once.
	Release()
	// Lost is closed when the backend could not keep the slot (its lease
	// in the shared store lapsed, so the store may have granted it again):
	// the call must stop, so that the lane's limit holds. nil if it never
	// happens.
	Lost() <-chan struct{}
}

// SharedLane is a lane's state in a Backend's store, across every process.
type SharedLane struct {
	// State says how this process reaches the lane: "ok"; "local_fallback"
	// (the store is unreachable and this process uses lanes of its own);
	// "unavailable" (the store is unreachable and calls are refused).
	State            string
	Inflight         int
	QueuedByPriority QueuedByPriority
	// QueuedFor is how long the lane's queue has been non-empty (0 when
	// empty), on the store's clock; OldestWait is the longest wait now.
	QueuedFor  time.Duration
	OldestWait time.Duration
	// Holders counts the slots held, by process name.
	Holders map[string]int
	// TokensRemaining is the lane's token budget left, nil without one;
	// TokensInflight the estimates of the calls holding its slots.
	TokensRemaining *int64
	TokensInflight  int64
	// Provider is what the provider's rate-limit headers last said of the
	// lane, as its store keeps it; nil if nothing.
	Provider *ProviderSnapshot
}

// A TokenBackend is a Backend that keeps the token budgets of
// Config.TokensPerMinute and MaxInflightTokens itself, decided with the
// slot, and whose Leases settle (Settle) what their calls used. With any
// other Backend, limiter.New refuses the budgets.
type TokenBackend interface {
	Backend
	// KeepsTokenBudgets reports whether the backend keeps them.
	KeepsTokenBudgets() bool
}

// A SettlingLease is a Lease of a TokenBackend: Settle replaces what its
// grant was charged in the lane's token budget with u (see Slot.Settle).
type SettlingLease interface {
	Lease
	Settle(u Usage)
}

// A LimitsLease is a Lease whose Backend follows a provider's rate-limit
// headers for the whole lane: RecordLimits reports what the answer of its
// call said (see Limiter.RecordLimits).
type LimitsLease interface {
	Lease
	RecordLimits(pl ProviderLimits)
}

// A Reloader is a Backend that takes a reload at once. SetConfig calls
// Reload with the keys of the lanes this process knows and the new
// settings, so that, as in a lane kept here, the waiters get at once what
// the new settings allow (a higher limit, a cap lifted), and what the
// provider said of the lanes is forgotten in every process. What cannot
// reach the store within ctx is left: the settings apply from the lane's
// next acquisition, and the provider's word binds for at most two provider
// windows anyway.
type Reloader interface {
	Backend
	Reload(ctx context.Context, keys []string, cfg Config)
}

// forgetTimeout bounds how long a reload waits for a Backend to forget the
// provider's word.
const forgetTimeout = 2 * time.Second

// Backend states, as SharedLane.State and the snapshot show them.
const (
	BackendOK            = "ok"
	BackendLocalFallback = "local_fallback"
	BackendUnavailable   = "unavailable"
)

// BackendQueueTimeout is the error a Backend's Acquire returns when a
// call's wait reached its queue timeout, telling where the call stood in
// the shared queue then, so that the limiter's *QueueTimeoutError reports
// the lane's global figures (its place, the waiters, and a RetryAfter from
// the calls ahead of a newcomer). errors.Is(err, ErrQueueTimeout) holds. A
// Backend that cannot tell returns ErrQueueTimeout itself.
type BackendQueueTimeout struct {
	Position int // the call's 1-based place in the serving order
	Queued   int // waiters in the lane, the call included
	// Ahead counts, for a newcomer of each class (by Priority.Index), the
	// waiters that would be served before it once this call has left.
	Ahead [3]int
}

func (e *BackendQueueTimeout) Error() string {
	return fmt.Sprintf("limiter: queue timeout at position %d of %d queued", e.Position, e.Queued)
}

// Is reports whether target is ErrQueueTimeout.
func (e *BackendQueueTimeout) Is(target error) bool { return target == ErrQueueTimeout }

// ErrLaneUnavailable is returned by Acquire when the lane's shared store
// cannot be reached and the backend is set to refuse calls then: the call
// may be retried (elsewhere, or later).
var ErrLaneUnavailable = errors.New("limiter: the lane's shared store is unavailable")

// WithBackend makes the limiter keep its lanes' slots and queues in b (see
// Backend). Config.MaxInflight 0 still turns the limiter off.
func WithBackend(b Backend) Option { return func(l *Limiter) { l.backend = b } }

// acquireShared is Acquire with a backend: the backend decides; the lane
// here counts this process's share and keeps the statistics.
func (l *Limiter) acquireShared(ctx context.Context, key string, cfg *Config, p Priority) (Slot, error) {
	ln, err := l.openLane(ctx, key, cfg, p)
	if err != nil {
		return Slot{}, err
	}
	start := l.clock.Now()
	arrival := start
	if a, ok := ArrivalFrom(ctx); ok && a.Before(start) {
		arrival = a
	}
	t := ln.tenantLocked(cfg, TenantFrom(ctx))
	cost, open := ln.estimateLocked(cfg, ctx)
	if err := tooLarge(cfg, key, cost); err != nil {
		ln.mu.Unlock()
		return Slot{}, err
	}
	ln.waiting[p.Index()]++
	t.queued++
	ln.touchLocked(start)
	ln.adaptLocked(l.cfg.Load())
	// An adaptive limit is this process's (see Adaptive). A copy: the
	// call goes on with it once the lane's lock is let go.
	eff := *ln.effLocked(l.cfg.Load())
	cfg = &eff
	ln.mu.Unlock()
	place := 0
	// Shutdown ends the backend's wait too.
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.down, cancel)()
	lease, err := l.backend.Acquire(bctx, Request{Lane: key, Priority: p, Tenant: t.name, Arrival: arrival, Config: *cfg, Tokens: cost, Queued: func(pos int) {
		place = pos
		l.emit(ctx, Event{Kind: Enqueued, Lane: key, Priority: p, Tenant: t.label, Position: pos})
	}})
	if err != nil && ctx.Err() == nil && l.closed.Load() {
		err = ErrShuttingDown
	}
	now := l.clock.Now()
	waited := now.Sub(start)
	if place == 0 {
		waited = 0 // granted without queueing: the round trip is not a wait
	}
	e := Event{Lane: key, Priority: p, Tenant: t.label, Wait: waited, Position: place}
	ln.mu.Lock()
	ln.waiting[p.Index()]--
	t.queued--
	ln.touchLocked(now)
	var s Slot
	switch {
	case err == nil:
		h := ln.takeLocked(cfg, p, t, 0)
		h.lease, h.open = lease, open
		s = Slot{h: h, gen: h.gen, lost: lease.Lost()}
		if place == 0 {
			ln.stats.Advance(now)
			ln.stats.Zero()
		} else {
			ln.stats.Wait(now, waited)
			ln.stats.QueuedGrant()
		}
		e.Kind = Acquired
	case errors.Is(err, ErrQueueTimeout):
		ln.stats.Timeout(now, waited)
		qe := &QueueTimeoutError{Lane: key, Priority: p, Waited: waited, Position: place, Queued: place, Limit: cfg.MaxInflight, QueueTimeout: cfg.queueTimeout()}
		ahead := 0
		var st *BackendQueueTimeout
		if errors.As(err, &st) {
			qe.Position, qe.Queued, ahead = st.Position, st.Queued, st.Ahead[p.Index()]
		}
		qe.RetryAfter = ln.retryAfterLocked(cfg, p, now, ahead)
		err, e.Position = qe, qe.Position
		e.Kind = TimedOut
	case errors.Is(err, ErrShuttingDown), errors.Is(err, ErrLaneUnavailable):
		e.Kind = Refused
	default:
		e.Kind = Canceled
	}
	ln.mu.Unlock()
	l.emit(ctx, e)
	return s, err
}

// SharedStateTimeout bounds how long Snapshot waits for a Backend's
// global figures; past it, a lane shows the last figures read, with their
// age (Shared.FiguresAge).
const SharedStateTimeout = time.Second

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
