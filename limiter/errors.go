package limiter

import (
	"errors"
	"fmt"
	"time"
)

// ErrQueueTimeout is matched (errors.Is) by every *QueueTimeoutError.
var ErrQueueTimeout = errors.New("limiter: queue timeout")

// QueueTimeoutError is returned by Acquire when a call waited
// Config.QueueTimeout without getting a slot, or could not get one before
// its deadline (Cause says which). It is not worth retrying at once: a
// retry joins the same queue again.
type QueueTimeoutError struct {
	Lane         string        // the lane key
	Priority     Priority      // the call's own class
	Cause        TimeoutCause  // why the wait ended
	Waited       time.Duration // how long this acquisition waited
	Position     int           // 1-based place in the serving order when the wait ended
	Queued       int           // waiters in the lane then, this one included
	Limit        int           // MaxInflight in force then
	QueueTimeout time.Duration // Config.QueueTimeout in force then
	// RetryAfter is when a new call of the same class could expect a slot,
	// estimated from the lane's recent service rate (the queue timeout when
	// the lane has none), rounded up to whole seconds, at least 1 s.
	RetryAfter time.Duration
}

func (e *QueueTimeoutError) Error() string {
	switch e.Cause {
	case CauseDeadline:
		return fmt.Sprintf("limiter: lane %q: no slot before the call's deadline, after waiting %s (position %d of %d queued, priority %s); "+
			"a new call would wait about %s: give it a longer timeout, or send less work to this lane",
			e.Lane, e.Waited.Round(100*time.Millisecond), e.Position, e.Queued, e.Priority, e.RetryAfter)
	case CauseEstimate:
		return fmt.Sprintf("limiter: lane %q: the wait for a slot, about %s (position %d of %d queued, priority %s), is longer than the time left before the call's deadline; "+
			"give it a longer timeout, or send less work to this lane",
			e.Lane, e.RetryAfter, e.Position, e.Queued, e.Priority)
	}
	return fmt.Sprintf("limiter: lane %q: no slot after waiting %s (position %d of %d queued, priority %s); "+
		"raise max_inflight (now %d) if the gateway has capacity to spare, raise queue_timeout (now %s), "+
		"or send less work to this lane; a new call would wait about %s",
		e.Lane, e.Waited.Round(100*time.Millisecond), e.Position, e.Queued, e.Priority, e.Limit, e.QueueTimeout, e.RetryAfter)
}

// Is reports whether target is ErrQueueTimeout.
func (e *QueueTimeoutError) Is(target error) bool { return target == ErrQueueTimeout }

// Timeout reports true, as net.Error does for timeouts.
func (e *QueueTimeoutError) Timeout() bool { return true }

// ErrLaneLimit is matched (errors.Is) by every *LaneLimitError.
var ErrLaneLimit = errors.New("limiter: lane limit reached")

// LaneLimitError is returned by Acquire when the call's lane does not exist
// and Config.MaxLanes lanes already do. Existing lanes keep working; a new
// one can be made once an idle lane has been evicted (Config.LaneIdleTTL).
type LaneLimitError struct {
	Lane     string        // the lane that could not be made
	MaxLanes int           // Config.MaxLanes in force
	IdleTTL  time.Duration // Config.LaneIdleTTL in force
}

func (e *LaneLimitError) Error() string {
	return fmt.Sprintf("limiter: lane %q: %d lanes exist already (max_lanes); idle lanes are forgotten after lane_idle_ttl (now %s)",
		e.Lane, e.MaxLanes, e.IdleTTL)
}

// Is reports whether target is ErrLaneLimit.
func (e *LaneLimitError) Is(target error) bool { return target == ErrLaneLimit }

// ErrShuttingDown is returned by Acquire once Shutdown has begun, to new
// calls and to every call that was waiting: none of them will be granted.
var ErrShuttingDown = errors.New("limiter: shutting down")

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

// A SettingError is one setting of a Config out of range. Validate
// returns them joined (errors.Join); errors.As finds the first.
type SettingError struct {
	// Setting names it as configuration files do: "max_inflight",
	// "queue_timeout", "adaptive.min_inflight".
	Setting string
	// Problem says what is wrong and what is wanted: "is -1: want 0 (off)
	// or more".
	Problem string
}

func (e *SettingError) Error() string { return "limiter: " + e.Setting + " " + e.Problem }

// ErrUnknownPriority is wrapped by the error ParsePriority returns for a name
// that is not a class.
var ErrUnknownPriority = errors.New("unknown priority")

// ErrTokenBudget is matched (errors.Is) by every *TokenBudgetError.
var ErrTokenBudget = errors.New("limiter: call larger than the lane's token budget")

// TokenBudgetError is returned by Acquire, at once, for a call whose
// estimate exceeds a whole budget of its lane: it could never be granted.
// It is not worth retrying unchanged; a smaller call (a shorter prompt, a
// lower max_tokens) or a larger budget is.
type TokenBudgetError struct {
	Lane string
	// Tokens is the call's estimate.
	Tokens int64
	// Budget names the budget, as configuration files do
	// ("tokens_per_minute", "max_inflight_tokens"), or "provider" for the
	// limit the gateway's rate-limit headers announced; Limit is its size.
	Budget string
	Limit  int64
}

func (e *TokenBudgetError) Error() string {
	return fmt.Sprintf("limiter: lane %q: the call is estimated at %d tokens, more than the whole %s (%d): "+
		"it could never be granted; send a shorter prompt or a lower max_tokens, or raise the budget",
		e.Lane, e.Tokens, e.Budget, e.Limit)
}

// Is reports whether target is ErrTokenBudget.
func (e *TokenBudgetError) Is(target error) bool { return target == ErrTokenBudget }
