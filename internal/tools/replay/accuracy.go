package replay

import (
	"time"

	"github.com/llmlanes/llmlanes/classify"
)

// Accuracy compares the classification route's answers, one per poll, with
// the replay's ground truth.
//
// The gateway question: did the route list a gateway reason (retries,
// upstream errors) exactly while the gateway was failing? The state
// itself says local_queue whenever the lane also queues, as the ADR
// wants, so the gateway's verdict is read from the reasons.
//
// The local question: did the route say local_queue exactly while some
// call had waited in the queue longer than the wait_p90 threshold?
type Accuracy struct {
	Polls          int
	GatewayCorrect int
	LocalCorrect   int
	// DetectOnset and DetectRecovery are the time from the fault's start
	// (end) to the first poll whose gateway verdict agreed; -1 if none did.
	DetectOnset, DetectRecovery time.Duration
	// FalseAlarms counts spells of a degraded verdict that began while the
	// gateway was healthy.
	FalseAlarms int
}

// GatewayShare and LocalShare are the shares of polls answered right.
func (a Accuracy) GatewayShare() float64 { return share(a.GatewayCorrect, a.Polls) }
func (a Accuracy) LocalShare() float64   { return share(a.LocalCorrect, a.Polls) }

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// Accuracy scores the polls of a run with lanes; it is zero without them.
func (r Report) Accuracy() Accuracy {
	a := Accuracy{DetectOnset: -1, DetectRecovery: -1}
	o := r.Options
	prev := false
	for _, s := range r.Samples {
		if s.State == "" {
			continue
		}
		a.Polls++
		if s.GatewayVerdict == s.Fault {
			a.GatewayCorrect++
		}
		if (s.State == classify.LocalQueue) == (s.OldestWait > o.Thresholds.WaitP90) {
			a.LocalCorrect++
		}
		if s.GatewayVerdict && !prev && !s.Fault {
			a.FalseAlarms++
		}
		prev = s.GatewayVerdict
		if o.FaultEnd > o.FaultStart {
			if a.DetectOnset < 0 && s.At >= o.FaultStart && s.GatewayVerdict {
				a.DetectOnset = s.At - o.FaultStart
			}
			if a.DetectRecovery < 0 && s.At >= o.FaultEnd && !s.GatewayVerdict {
				a.DetectRecovery = s.At - o.FaultEnd
			}
		}
	}
	return a
}
