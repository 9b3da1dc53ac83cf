package limiter

import (
	"context"
	"time"
)

// EventKind says what happened to a call in a lane.
type EventKind uint8

const (
	// Enqueued: the call found no free slot and joined the queue.
	Enqueued EventKind = iota + 1
	// Acquired: the call got a slot; Wait is 0 for an immediate grant.
	Acquired
	// Released: a slot was given back; Priority is the holder's own class.
	Released
	// Canceled: the call's context ended while it waited; it left the
	// queue. Its Wait is not a wait sample (the caller chose its length).
	Canceled
	// TimedOut: the call waited QueueTimeout, or reached (or was foreseen
	// to miss) its deadline, and left the queue; Cause says which. Its
	// Wait is a wait sample, as a grant's is, except for CauseEstimate.
	TimedOut
	// Exchanged: an exchange with the upstream ended (see RecordExchange).
	Exchanged
	// Refused: the limiter is shutting down (see Shutdown): the call left
	// the queue, or never joined it, without a slot. Wait is how long it
	// had waited.
	Refused
	// Evicted: the lane was idle for Config.LaneIdleTTL and is forgotten,
	// with its statistics; only Lane is set.
	Evicted
)

func (k EventKind) String() string {
	switch k {
	case Enqueued:
		return "enqueued"
	case Acquired:
		return "acquired"
	case Released:
		return "released"
	case Canceled:
		return "canceled"
	case TimedOut:
		return "timed_out"
	case Exchanged:
		return "exchanged"
	case Refused:
		return "refused"
	case Evicted:
		return "evicted"
	}
	return "unknown"
}

// Event describes one step of one call in a lane.
type Event struct {
	// Kind and Priority side by side: one word for both. An Event is
	// passed by value, an Enqueued one on the stack a queued call is about
	// to wait on, which must stay small (docs/DESIGN.md, "A queued call's
	// stack").
	Kind     EventKind
	Priority Priority // the call's own class (aging not applied)
	// Cause is why a TimedOut wait ended: its queue timeout or its
	// caller's deadline (see QueueTimeoutError).
	Cause TimeoutCause
	Lane  string
	// Tenant is the call's tenant as its lane tracks it (a name, or
	// OtherTenant past the bound), for Enqueued, Acquired, Canceled,
	// TimedOut and Refused; "" for a call that names none (DefaultTenant).
	Tenant string
	// Wait is how long the acquisition waited (Acquired, Canceled,
	// TimedOut, Refused).
	Wait time.Duration
	// Position is the call's 1-based place in line: for Enqueued (and the
	// Acquired or Canceled that follows it), the waiters of the same or a
	// higher class when it queued, itself included (aging not counted); for
	// TimedOut, its exact place in the serving order; 0 for a call that
	// never queued.
	Position int
	// Exchange is the upstream exchange, for Exchanged.
	Exchange Exchange
}

// An Observer is told about every event of every lane of a limiter that is
// on. It is called synchronously on the goroutine of the call the event
// belongs to (for Released, the one that released; for Evicted, the
// limiter's sweep), never while a lane lock is held, with the call's context
// (context.Background for Released and Evicted). So a
// slow observer delays only that one call, never the lane or other callers;
// a panicking observer is recovered and logged, and the call goes on.
// Observers must be safe for concurrent use. Events of different calls may
// arrive in any order; for current values (inflight, queue depth) read
// Limiter.Snapshot instead of summing events.
type Observer func(ctx context.Context, e Event)
