package limiter

import (
	"errors"
	"fmt"
	"time"
)

// ErrQueueTimeout is matched (errors.Is) by every *QueueTimeoutError.
var ErrQueueTimeout = errors.New("limiter: queue timeout")

// QueueTimeoutError is returned by Acquire when a call waited
// Config.QueueTimeout without getting a slot. It is not worth retrying at
// once: a retry joins the same queue again.
type QueueTimeoutError struct {
	Lane         string        // the lane key
	Priority     Priority      // the call's own class
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
