package limiter

import (
	"math/bits"
	"time"
)

// The rolling statistics of a lane (wait percentiles and queue timeouts of
// the last 5 minutes) are kept in 10-second steps: a ring of 31 steps, the
// current partial one and 30 full ones. A grant therefore counts for at
// least 300 s and at most 310 s after it was made.
//
// Waits are rounded to 0.1 s and counted in a histogram whose buckets are
// exact up to 51.1 s and 1/32 of an octave wide above that (at most 1.6%
// off), so memory per lane is bounded whatever the grant rate: 31 steps of
// 3.4 KB plus one 3.4 KB sum, about 110 KB at most, allocated only for the
// steps in which a queued grant landed. Immediate grants (wait 0) are a
// counter and allocate nothing.
const (
	windowStep  = 10 * time.Second
	windowSpan  = 5 * time.Minute
	windowSteps = int64(windowSpan/windowStep) + 1

	histExact   = 512 // buckets 0..511 hold 0.0 .. 51.1 s exactly
	histSub     = 32  // sub-buckets per octave above histExact
	histOctaves = 11  // up to 2^20 deciseconds (29 h); longer waits count in the last bucket
	histBuckets = histExact + histSub*histOctaves
)

type hist [histBuckets]uint32

// histIndex returns the bucket of a wait of ds deciseconds.
func histIndex(ds uint64) int {
	if ds < histExact {
		return int(ds)
	}
	e := bits.Len64(ds) - 1 // 2^e <= ds < 2^(e+1), e >= 9
	i := histExact + (e-9)*histSub + int(ds>>(e-5))&(histSub-1)
	return min(i, histBuckets-1)
}

// histValue returns the deciseconds a bucket stands for: its value when
// exact, otherwise its midpoint.
func histValue(i int) float64 {
	if i < histExact {
		return float64(i)
	}
	e := 9 + (i-histExact)/histSub
	sub := (i - histExact) % histSub
	lo := uint64(histSub+sub) << (e - 5)
	return float64(lo) + float64(uint64(1)<<(e-5))/2
}

type windowSlot struct {
	step     int64
	zeros    uint32
	timeouts uint32
	waits    *hist // nil until a non-zero wait lands in this step
	upstream upstreamCounts
}

// upstreamCounts counts exchanges by outcome, and retries.
type upstreamCounts struct {
	outcomes [numOutcomes]uint32
	retries  uint32
}

func (u *upstreamCounts) sub(o *upstreamCounts) {
	for i := range u.outcomes {
		u.outcomes[i] -= o.outcomes[i]
	}
	u.retries -= o.retries
}

// window is the 5-minute statistics of one lane. It is guarded by the lane's
// lock.
type window struct {
	origin   time.Time // the limiter's start; steps count from here
	cur      int64     // the newest step recorded or read
	slots    [windowSteps]windowSlot
	zeros    uint64 // sums over the slots
	timeouts uint64
	waits    hist
	nwaits   uint64
	upstream upstreamCounts
}

func (w *window) stepOf(now time.Time) int64 { return int64(now.Sub(w.origin) / windowStep) }

// advance moves the window to now, dropping the steps that fall out of it.
// A reading older than the newest step counts as the newest step.
func (w *window) advance(now time.Time) {
	k := w.stepOf(now)
	if k <= w.cur {
		return
	}
	for s := max(w.cur+1, k-windowSteps+1); s <= k; s++ {
		sl := &w.slots[s%windowSteps]
		w.zeros -= uint64(sl.zeros)
		w.timeouts -= uint64(sl.timeouts)
		w.upstream.sub(&sl.upstream)
		sl.upstream = upstreamCounts{}
		if sl.waits != nil {
			for i, n := range sl.waits {
				if n != 0 {
					w.waits[i] -= n
					w.nwaits -= uint64(n)
					sl.waits[i] = 0
				}
			}
		}
		sl.step, sl.zeros, sl.timeouts = s, 0, 0
	}
	w.cur = k
}

// nextBoundary returns when the current step ends.
func (w *window) nextBoundary() time.Time {
	return w.origin.Add(time.Duration(w.cur+1) * windowStep)
}

// recordZero counts an immediate grant in the current step. The caller
// makes sure the current step is still current (see lane.stale).
func (w *window) recordZero() {
	w.slots[w.cur%windowSteps].zeros++
	w.zeros++
}

// recordWait counts a grant that waited d, at now.
func (w *window) recordWait(now time.Time, d time.Duration) {
	w.advance(now)
	ds := uint64(max(0, (d+50*time.Millisecond)/(100*time.Millisecond)))
	if ds == 0 {
		w.recordZero()
		return
	}
	sl := &w.slots[w.cur%windowSteps]
	if sl.waits == nil {
		sl.waits = new(hist)
	}
	i := histIndex(ds)
	sl.waits[i]++
	w.waits[i]++
	w.nwaits++
}

// recordTimeout counts a queue timeout at now.
func (w *window) recordTimeout(now time.Time) {
	w.advance(now)
	w.slots[w.cur%windowSteps].timeouts++
	w.timeouts++
}

// recordExchange counts an upstream exchange at now.
func (w *window) recordExchange(now time.Time, x Exchange) {
	w.advance(now)
	sl := &w.slots[w.cur%windowSteps]
	sl.upstream.outcomes[x.Outcome]++
	w.upstream.outcomes[x.Outcome]++
	if x.Retry {
		sl.upstream.retries++
		w.upstream.retries++
	}
}

// upstreamCounts returns the exchanges of the window, or nil if none.
func (w *window) upstreamCounts() *UpstreamCounts {
	u := &w.upstream
	if u.retries == 0 && u.outcomes == ([numOutcomes]uint32{}) {
		return nil
	}
	return &UpstreamCounts{
		OK:              int(u.outcomes[OutcomeOK]),
		ClientErrors:    int(u.outcomes[OutcomeClientError]),
		RateLimited:     int(u.outcomes[OutcomeRateLimited]),
		ServerErrors:    int(u.outcomes[OutcomeServerError]),
		TransportErrors: int(u.outcomes[OutcomeTransportError]),
		Stalls:          int(u.outcomes[OutcomeStall]),
		Canceled:        int(u.outcomes[OutcomeCanceled]),
		Retries:         int(u.retries),
	}
}

// percentiles returns the p50 and p90 of the waits in the window, in
// seconds, using linear interpolation between closest ranks; ok is false
// when the window holds no grant.
func (w *window) percentiles() (p50, p90 float64, ok bool) {
	n := w.zeros + w.nwaits
	if n == 0 {
		return 0, 0, false
	}
	if w.nwaits == 0 {
		return 0, 0, true // every grant was immediate
	}
	return w.percentile(0.5, n), w.percentile(0.9, n), true
}

// percentile returns the p-th percentile of the n waits in the window, in
// seconds: the value at rank h = p*(n-1), interpolated linearly between the
// closest ranks floor(h) and floor(h)+1.
func (w *window) percentile(p float64, n uint64) float64 {
	h := p * float64(n-1)
	lo := uint64(h)
	a, b := w.valuesAt(lo)
	return (a + (h-float64(lo))*(b-a)) / 10
}

// valuesAt returns the values in deciseconds at 0-based ranks r and r+1 of
// the sorted waits; past the last rank it repeats the last value.
func (w *window) valuesAt(r uint64) (a, b float64) {
	if r+1 < w.zeros {
		return 0, 0
	}
	seen, found := w.zeros, r < w.zeros // found: a is known (it is 0)
	for i := 0; i < histBuckets; i++ {
		c := uint64(w.waits[i])
		if c == 0 {
			continue
		}
		seen += c
		v := histValue(i)
		if !found && r < seen {
			a, found = v, true
		}
		if found && r+1 < seen {
			return a, v
		}
		b = v
	}
	if !found {
		a = b
	}
	return a, b
}
