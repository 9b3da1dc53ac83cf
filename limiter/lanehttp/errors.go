package lanehttp

import (
	"errors"
	"fmt"
	"time"
)

// ErrStall is matched (errors.Is) by every *StallError.
var ErrStall = errors.New("lanehttp: upstream stalled")

// StallError ends an exchange whose upstream went quiet for longer than the
// Transport allows. It is not a queue timeout: the call had its slot.
//
// Phase "caller" is the other way round: the caller stopped reading the
// response for StallTimeout, and the exchange was ended to free its slot.
type StallError struct {
	Lane  string
	Phase string        // "response headers", "response body" (first byte or next chunk), or "caller"
	After time.Duration // the limit that was exceeded
}

func (e *StallError) Error() string {
	switch e.Phase {
	case "response headers":
		return fmt.Sprintf("lanehttp: lane %q: upstream sent no response headers for %s (the transport's ResponseHeaderTimeout)", e.Lane, e.After)
	case "caller":
		return fmt.Sprintf("lanehttp: lane %q: the caller read nothing for %s (the transport's StallTimeout); the exchange was ended to free its slot", e.Lane, e.After)
	}
	return fmt.Sprintf("lanehttp: lane %q: upstream sent no %s for %s (the transport's StallTimeout)", e.Lane, e.Phase, e.After)
}

// Is reports whether target is ErrStall.
func (e *StallError) Is(target error) bool { return target == ErrStall }

// Timeout reports true, as net.Error does for timeouts.
func (e *StallError) Timeout() bool { return true }

// ErrSlotLost is returned when a call's slot was lost: its lane is shared
// (limiter.Backend) and the slot's lease could not be kept, so the call was
// stopped for the lane's limit to hold. Sending the call again is safe.
var ErrSlotLost = errors.New("lanehttp: the call's shared slot was lost")

// lostError names the lane of an ErrSlotLost.
type lostError struct{ lane string }

func (e *lostError) Error() string {
	return fmt.Sprintf("lanehttp: lane %q: the shared slot's lease could not be kept (the shared store was unreachable), so the call was stopped to keep the lane's limit; send it again", e.lane)
}

func (e *lostError) Is(target error) bool { return target == ErrSlotLost }
