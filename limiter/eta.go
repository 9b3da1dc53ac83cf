package limiter

import (
	"math"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// ETA estimates, for each class, how long a call of that class arriving now
// would wait for a slot. nil means no estimate: the lane has no recent hold
// times to go by. It is an extra key of the snapshot ("eta_s"), beside the
// contract's.
type ETA struct {
	Interactive *Seconds `json:"interactive"`
	Default     *Seconds `json:"default"`
	Bulk        *Seconds `json:"bulk"`
}

// maxETA bounds an estimate, so that a lane served very slowly gives a
// large, finite figure.
const maxETA = 24 * time.Hour

// etaLocked estimates the wait of a newcomer of each class at now, from
// the statistics as they stand then (v). It changes nothing.
//
// A newcomer that would be granted at once waits 0. Otherwise it waits for
// the calls served before it (the waiters whose effective class, aging
// included, is as high or higher: they rank first or arrived earlier) and
// then for one more slot to free: (ahead+1) / rate, where rate is the
// lane's service rate for the slots the class may use (View.ServiceRate).
func (l *lane) etaLocked(cfg *Config, now time.Time, v *stats.View) *ETA {
	ahead := l.q.aheadOf(l.ns(now))
	var e ETA
	for _, p := range []Priority{Interactive, Default, Bulk} {
		var est *Seconds
		if l.fitsLocked(cfg, p) {
			z := Seconds(0)
			est = &z
		} else if d, ok := waitFor(v, l.busyNowLocked(now), cfg, p, ahead[p.Index()]); ok {
			s := max(0.1, seconds(d.Seconds())) // 0 only for a call granted at once
			est = &s
		}
		switch p {
		case Interactive:
			e.Interactive = est
		case Default:
			e.Default = est
		default:
			e.Bulk = est
		}
	}
	return &e
}

// waitFor estimates the wait of a call of class p with n calls ahead of it
// and no slot it may take free now, from the statistics v and the busy time
// they do not hold yet.
func waitFor(v *stats.View, busyNow time.Duration, cfg *Config, p Priority, n int) (time.Duration, bool) {
	rate, ok := v.ServiceRate(max(1, capFor(cfg, p)), busyNow)
	if !ok {
		return 0, false
	}
	d := float64(n+1) / rate
	if d > maxETA.Seconds() || math.IsNaN(d) {
		return maxETA, true
	}
	return time.Duration(d * float64(time.Second)), true
}

// retryAfterLocked suggests when a call of class p that just timed out in
// the queue, with ahead calls now served before a newcomer of its class,
// could come back: the estimated wait of that newcomer, rounded up to
// whole seconds, at least 1 s; the queue timeout when there is no
// estimate.
func (l *lane) retryAfterLocked(cfg *Config, p Priority, now time.Time, ahead int) time.Duration {
	v := l.stats.At(now)
	d, ok := waitFor(&v, l.busyNowLocked(now), cfg, p, ahead)
	if !ok {
		d = cfg.queueTimeout()
	}
	return max(time.Second, (d + time.Second - 1).Truncate(time.Second))
}
