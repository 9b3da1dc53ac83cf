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
type StallError struct {
	Lane  string
	Phase string        // "response headers", or "response body" (first byte or next chunk)
	After time.Duration // the limit that was exceeded
}

func (e *StallError) Error() string {
	setting := "StallTimeout"
	if e.Phase == "response headers" {
		setting = "ResponseHeaderTimeout"
	}
	return fmt.Sprintf("lanehttp: lane %q: upstream sent no %s for %s (the transport's %s)", e.Lane, e.Phase, e.After, setting)
}

// Is reports whether target is ErrStall.
func (e *StallError) Is(target error) bool { return target == ErrStall }

// Timeout reports true, as net.Error does for timeouts.
func (e *StallError) Timeout() bool { return true }
