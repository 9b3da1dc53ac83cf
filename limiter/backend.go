package limiter

import (
	"context"
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
	// MaxWait, if above 0, bounds the wait below Config.QueueTimeout: the
	// call's deadline comes first (see WithDeadline). A wait it ends ends
	// as a queue timeout does. 0 means the queue timeout; below 0, the
	// call may not wait: it is granted at once or leaves the queue.
	MaxWait time.Duration
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

// Backend states, as SharedLane.State and the snapshot show them.
const (
	BackendOK            = "ok"
	BackendLocalFallback = "local_fallback"
	BackendUnavailable   = "unavailable"
)

// WithBackend makes the limiter keep its lanes' slots and queues in b (see
// Backend). Config.MaxInflight 0 still turns the limiter off.
func WithBackend(b Backend) Option { return func(l *Limiter) { l.backend = b } }

// SharedStateTimeout bounds how long Snapshot waits for a Backend's
// global figures; past it, a lane shows the last figures read, with their
// age (Shared.FiguresAge).
const SharedStateTimeout = time.Second
