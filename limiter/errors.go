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
