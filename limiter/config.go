package limiter

import (
	"errors"
	"fmt"
	"time"
)

// DefaultQueueTimeout is the longest one acquisition waits when
// Config.QueueTimeout is zero.
const DefaultQueueTimeout = 300 * time.Second

// agingStep is how long a waiter waits before its class rises one step.
// It is a constant, not a setting (ADR-0115 D6).
const agingStep = 60 * time.Second

// saturationAfter is how long queued > 0 must hold for a lane to count as
// saturated in the snapshot.
const saturationAfter = 60 * time.Second

// Config is the limiter's configuration. Every lane gets the same settings.
// The zero value turns the limiter off; DefaultConfig returns the documented
// defaults (off, 300 s queue timeout, one reserved interactive slot).
type Config struct {
	// MaxInflight is the most calls one lane lets through at once.
	// 0 turns the limiter off: Acquire returns at once and creates no lane.
	MaxInflight int

	// QueueTimeout bounds how long one acquisition waits for a slot; 0 means
	// DefaultQueueTimeout. A context deadline can shorten a wait, never
	// lengthen it.
	QueueTimeout time.Duration

	// InteractiveReserve is the number of slots that only calls whose own
	// class is Interactive may take. It is clamped to MaxInflight-1 (and
	// never below 0), so other work always has at least one slot.
	InteractiveReserve int
}

// DefaultConfig returns the documented defaults: MaxInflight 0 (off),
// QueueTimeout 300 s, InteractiveReserve 1.
func DefaultConfig() Config {
	return Config{QueueTimeout: DefaultQueueTimeout, InteractiveReserve: 1}
}

// Validate reports every setting that is out of range.
func (c Config) Validate() error {
	var errs []error
	if c.MaxInflight < 0 {
		errs = append(errs, fmt.Errorf("limiter: max_inflight is %d: want 0 (off) or more", c.MaxInflight))
	}
	if c.QueueTimeout < 0 {
		errs = append(errs, fmt.Errorf("limiter: queue_timeout is %s: want 0 (the default, %s) or more", c.QueueTimeout, DefaultQueueTimeout))
	}
	if c.InteractiveReserve < 0 {
		errs = append(errs, fmt.Errorf("limiter: interactive_reserve is %d: want 0 or more", c.InteractiveReserve))
	}
	return errors.Join(errs...)
}

// Reserve returns the reserve in force: InteractiveReserve clamped to
// [0, MaxInflight-1].
func (c Config) Reserve() int {
	return max(0, min(c.InteractiveReserve, c.MaxInflight-1))
}

func (c Config) queueTimeout() time.Duration {
	if c.QueueTimeout == 0 {
		return DefaultQueueTimeout
	}
	return c.QueueTimeout
}
