package limiter

import (
	"context"
	"strings"
	"time"
)

// A call's deadline: when its caller gives up on it. A wait in the queue
// never runs into it: a call still queued DeadlineMargin before its
// deadline leaves the queue with a *QueueTimeoutError (Cause
// CauseDeadline), a typed answer its caller gets before its own timer
// fires, rather than a timeout its SDK would retry to the back of the
// queue (docs/DESIGN.md, "The caller's deadline").

// DefaultDeadlineMargin is Config.DeadlineMargin's default: long enough
// for an answer to cross a network to its caller, short beside the
// seconds an SDK's timeout counts.
const DefaultDeadlineMargin = 500 * time.Millisecond

// maxDeadlineMargin bounds Config.DeadlineMargin.
const maxDeadlineMargin = time.Minute

// DeadlinePolicy says what a lane does with a call whose deadline comes
// before the wait the lane estimates for it (see Config.Deadline).
type DeadlinePolicy uint8

const (
	// AnswerEarly answers the call at once, when it queues, with a
	// *QueueTimeoutError whose Cause is CauseEstimate: its caller learns
	// now, with the lane's Retry-After, what it would otherwise learn at
	// its deadline, and its place goes to calls that can be served in
	// time. A lane with nothing to estimate from queues the call: the
	// estimate is the lane's ETA, from the mean hold time of the exchanges
	// reported (RecordExchange), else, in an in-process lane, from its
	// queue's recent grants.
	AnswerEarly DeadlinePolicy = iota
	// WaitForDeadline queues the call until its deadline all the same: the
	// estimate may be wrong, and the call is served if a slot frees early.
	WaitForDeadline
)

// ParseDeadlinePolicy reads "answer_early" or "wait" (any case).
func ParseDeadlinePolicy(s string) (DeadlinePolicy, bool) {
	switch {
	case s == "" || strings.EqualFold(s, "answer_early"):
		return AnswerEarly, true
	case strings.EqualFold(s, "wait"):
		return WaitForDeadline, true
	}
	return 0, false
}

func (d DeadlinePolicy) String() string {
	if d == WaitForDeadline {
		return "wait"
	}
	return "answer_early"
}

// TimeoutCause says why a wait ended in a *QueueTimeoutError.
type TimeoutCause uint8

const (
	// CauseQueueTimeout: the call waited Config.QueueTimeout.
	CauseQueueTimeout TimeoutCause = iota
	// CauseDeadline: the call's deadline came within
	// Config.DeadlineMargin while it waited.
	CauseDeadline
	// CauseEstimate: the lane estimated, as the call queued, a wait longer
	// than the time left before its deadline (Config.Deadline AnswerEarly).
	CauseEstimate
)

func (c TimeoutCause) String() string {
	switch c {
	case CauseDeadline:
		return "deadline"
	case CauseEstimate:
		return "estimate"
	}
	return "queue_timeout"
}

// WithDeadline returns a context whose model call's caller gives up at t,
// on the limiter's clock (a proxy reads it from the client's timeout
// header). Without it, the context's own deadline is the call's.
func WithDeadline(ctx context.Context, t time.Time) context.Context {
	return with(ctx, func(c *call) { c.deadline = t })
}

// DeadlineFrom returns the deadline WithDeadline put in ctx, if any.
func DeadlineFrom(ctx context.Context) (time.Time, bool) {
	if c := callOf(ctx); c != nil && !c.deadline.IsZero() {
		return c.deadline, true
	}
	return time.Time{}, false
}

// deadlineMargin is Config.DeadlineMargin with its default.
func (c *Config) deadlineMargin() time.Duration {
	if c.DeadlineMargin == 0 {
		return DefaultDeadlineMargin
	}
	return c.DeadlineMargin
}

// maxWait returns how long the call may wait at now: the queue timeout, or
// less when its deadline (less the margin) comes first, in which case
// cause is CauseDeadline. The deadline is WithDeadline's, else ctx's own
// moved onto the limiter's clock. The wait is never below 0.
func (c *call) maxWait(ctx context.Context, cfg *Config, now time.Time) (time.Duration, TimeoutCause) {
	qt := cfg.queueTimeout()
	var left time.Duration
	switch d, ok := ctx.Deadline(); {
	case !c.deadline.IsZero():
		left = c.deadline.Sub(now)
	case ok:
		left = time.Until(d)
	default:
		return qt, CauseQueueTimeout
	}
	if left -= cfg.deadlineMargin(); left < qt {
		return max(0, left), CauseDeadline
	}
	return qt, CauseQueueTimeout
}
