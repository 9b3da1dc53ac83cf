package limiter

import "time"

// Clock is the limiter's source of time. Tests inject a fake one (see
// package limitertest) so that aging, queue timeouts, saturation and the
// 5-minute windows can be driven step by step without sleeping.
type Clock interface {
	// Now returns the current time. Readings must not go backwards.
	Now() time.Time
	// AfterFunc calls f in its own goroutine, or from the fake clock's
	// Advance, once d has passed. Stop cancels the call.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// SystemClock returns the clock of the system: time.Now and time.AfterFunc.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
