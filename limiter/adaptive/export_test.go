package adaptive

// The controller's constants, for the tests (package adaptive_test), which
// drive a real limiter step by step and check the limit against them.
const (
	Tolerance   = tolerance
	HoldOff     = holdOff
	LatencyHold = latencyHold
)
