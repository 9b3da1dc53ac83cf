package limiter

import (
	"math/bits"
	"time"
)

// The rolling statistics of a lane (wait percentiles, queue timeouts,
// upstream outcomes and the service rate of the last 5 minutes) are kept in
// 10-second steps: a ring of 31 steps, the current partial one and 30 full
// ones. A sample therefore counts for at least 300 s and at most 310 s after
// it was taken.
//
// Waits are rounded to 0.1 s and counted in a histogram whose buckets are
// exact up to 51.1 s and 1/64 of an octave wide above that. Above 51.1 s a
// bucket also sums how far its waits lie above its lower bound, and stands
// for their mean: exact when its waits are equal (a lane whose callers all
// time out at 300 s reports 300.0), and never off by more than the bucket's
// width, 1.6%. Memory per lane is bounded whatever the grant rate: 31 step
// histograms of 7.7 KB plus their 10.5 KB sum, about 250 KB at most,
// allocated only once a queued wait has ended (the sum) and for the steps in
// which one did. A lane whose calls never queue keeps none: immediate grants
// (wait 0) are a counter and allocate nothing.
const (
	windowStep  = 10 * time.Second
	windowSpan  = 5 * time.Minute
	windowSteps = int64(windowSpan/windowStep) + 1

	histExact   = 512 // buckets 0..511 hold 0.0 .. 51.1 s exactly
	histSub     = 64  // sub-buckets per octave above histExact
	histSubBits = 6   // log2(histSub)
	histOctaves = 11  // up to 2^20 deciseconds (29 h); longer waits count in the last bucket
	histLog     = histSub * histOctaves
	histBuckets = histExact + histLog
)

// stepHist is the waits of one step; off sums, per bucket above histExact,
// the waits' distance above the bucket's lower bound, in deciseconds. The
// sums cannot wrap in practice: that would take over 500,000 waits of more
// than 14 hours in one bucket within 10 s.
type stepHist struct {
	n   [histBuckets]uint32
	off [histLog]uint32
}

// sumHist is the sum of the step histograms in the window.
type sumHist struct {
	n   [histBuckets]uint32
	off [histLog]uint64
}

// histIndex returns the bucket of a wait of ds deciseconds.
func histIndex(ds uint64) int {
	if ds < histExact {
		return int(ds)
	}
	e := bits.Len64(ds) - 1 // 2^e <= ds < 2^(e+1), e >= 9
	i := histExact + (e-9)*histSub + int(ds>>(e-histSubBits))&(histSub-1)
	return min(i, histBuckets-1)
}

// histLow returns the lowest value, in deciseconds, of bucket i, and the
// bucket's width.
func histLow(i int) (lo, width uint64) {
	if i < histExact {
		return uint64(i), 1
	}
	e := 9 + (i-histExact)/histSub
	sub := (i - histExact) % histSub
	return uint64(histSub+sub) << (e - histSubBits), uint64(1) << (e - histSubBits)
}

// histOffset returns how far ds lies above the lower bound of its bucket i,
// at most the bucket's width less one (the last bucket takes every longer
// wait).
func histOffset(ds uint64, i int) uint64 {
	lo, width := histLow(i)
	return min(ds-lo, width-1)
}

type windowSlot struct {
	step     int64
	zeros    uint32
	timeouts uint32
	granted  uint32        // grants out of the queue
	busy     time.Duration // time the queue was non-empty
	waits    *stepHist     // nil until a non-zero wait lands in this step
	upstream upstreamCounts
}

// upstreamCounts counts exchanges by outcome, and retries.
type upstreamCounts struct {
	outcomes [numOutcomes]uint32
	retries  uint32
	held     time.Duration // the exchanges' durations, summed
}

func (u *upstreamCounts) sub(o *upstreamCounts) {
	for i := range u.outcomes {
		u.outcomes[i] -= o.outcomes[i]
	}
	u.retries -= o.retries
	u.held -= o.held
}

func (u *upstreamCounts) total() uint64 {
	n := uint64(0)
	for _, c := range u.outcomes {
		n += uint64(c)
	}
	return n
}

// window is the 5-minute statistics of one lane. It is guarded by the lane's
// lock.
type window struct {
	origin time.Time // the limiter's start; steps count from here
	cur    int64     // the newest step recorded or read
	slots  [windowSteps]windowSlot
	// Sums over the slots.
	zeros    uint64 // immediate grants (wait 0)
	timeouts uint64
	granted  uint64
	busy     time.Duration
	waits    *sumHist // waits above 0 (queued grants and queue timeouts); nil until the first
	nwaits   uint64
	upstream upstreamCounts
	// lastError is when the latest upstream error (429, 5xx, transport
	// error, stall) was recorded, so that a reader can tell a gateway
	// that is failing now from one that failed minutes ago.
	lastError time.Time
}

func (w *window) stepOf(now time.Time) int64 { return int64(now.Sub(w.origin) / windowStep) }

// advance moves the window to now, dropping the steps that fall out of it.
// A reading older than the newest step counts as the newest step.
//
// It is called on every queued grant, by whichever goroutine releases a
// slot, so its common case (still in the current step) is kept small
// enough to inline and the rest is a function of its own.
func (w *window) advance(now time.Time) {
	if k := w.stepOf(now); k > w.cur {
		w.moveTo(k)
	}
}

// moveTo makes step k the current one. The histograms are walked through
// pointers, never copied: a copy of one on the stack made every goroutine
// that released a slot grow its stack to 8 KiB, again after each
// collection shrank it.
func (w *window) moveTo(k int64) {
	for s := max(w.cur+1, k-windowSteps+1); s <= k; s++ {
		sl := &w.slots[s%windowSteps]
		w.zeros -= uint64(sl.zeros)
		w.timeouts -= uint64(sl.timeouts)
		w.granted -= uint64(sl.granted)
		w.busy -= sl.busy
		w.upstream.sub(&sl.upstream)
		sl.upstream = upstreamCounts{}
		if h := sl.waits; h != nil {
			for i := range h.n {
				if n := h.n[i]; n != 0 {
					w.waits.n[i] -= n
					w.nwaits -= uint64(n)
					h.n[i] = 0
				}
			}
			for i := range h.off {
				if o := h.off[i]; o != 0 {
					w.waits.off[i] -= uint64(o)
					h.off[i] = 0
				}
			}
		}
		sl.step, sl.zeros, sl.timeouts, sl.granted, sl.busy = s, 0, 0, 0, 0
	}
	w.cur = k
}

// nextBoundary returns when the current step ends.
func (w *window) nextBoundary() time.Time {
	return w.origin.Add(time.Duration(w.cur+1) * windowStep)
}

// recordZero counts an immediate grant in the current step. The caller
// makes sure the current step is still current (see lane.fresh).
func (w *window) recordZero() {
	w.slots[w.cur%windowSteps].zeros++
	w.zeros++
}

// recordWait counts a wait of d that ended at now, in a grant or a queue
// timeout.
func (w *window) recordWait(now time.Time, d time.Duration) {
	w.advance(now)
	ds := uint64(max(0, (d+50*time.Millisecond)/(100*time.Millisecond)))
	if ds == 0 {
		w.recordZero()
		return
	}
	sl := &w.slots[w.cur%windowSteps]
	if sl.waits == nil {
		sl.waits = new(stepHist)
	}
	i := histIndex(ds)
	if w.waits == nil {
		w.waits = new(sumHist)
	}
	sl.waits.n[i]++
	w.waits.n[i]++
	w.nwaits++
	if i >= histExact {
		o := histOffset(ds, i)
		sl.waits.off[i-histExact] += uint32(o)
		w.waits.off[i-histExact] += o
	}
}

// recordQueuedGrant counts a grant out of the queue, for the service rate.
// The caller has recorded its wait at the same time.
func (w *window) recordQueuedGrant() {
	w.slots[w.cur%windowSteps].granted++
	w.granted++
}

// recordBusy counts d of time with a non-empty queue, ending at now.
func (w *window) recordBusy(now time.Time, d time.Duration) {
	w.advance(now)
	w.slots[w.cur%windowSteps].busy += d
	w.busy += d
}

// recordTimeout counts a queue timeout at now, after a wait of d, which is
// also a wait sample.
func (w *window) recordTimeout(now time.Time, d time.Duration) {
	w.recordWait(now, d)
	w.slots[w.cur%windowSteps].timeouts++
	w.timeouts++
}

// recordExchange counts an upstream exchange at now.
func (w *window) recordExchange(now time.Time, x Exchange) {
	w.advance(now)
	sl := &w.slots[w.cur%windowSteps]
	sl.upstream.outcomes[x.Outcome]++
	w.upstream.outcomes[x.Outcome]++
	d := max(0, x.Duration)
	sl.upstream.held += d
	w.upstream.held += d
	if x.Retry {
		sl.upstream.retries++
		w.upstream.retries++
	}
	if x.Outcome.IsUpstreamError() {
		w.lastError = now
	}
}

// upstreamCounts returns the exchanges of the window at now, or nil if
// none.
func (w *window) upstreamCounts(now time.Time) *UpstreamCounts {
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
		ClientStalls:    int(u.outcomes[OutcomeClientStall]),
		Retries:         int(u.retries),
		LastErrorAge:    w.lastErrorAge(now),
	}
}

// lastErrorAge is the time since the latest upstream error, if one is in
// the window.
func (w *window) lastErrorAge(now time.Time) *Seconds {
	if w.lastError.IsZero() || now.Sub(w.lastError) > windowSpan {
		return nil
	}
	s := seconds(max(0, now.Sub(w.lastError)).Seconds())
	return &s
}

// percentiles returns the p50 and p90 of the waits in the window (grants
// and queue timeouts), in seconds, using linear interpolation between
// closest ranks; ok is false when the window holds no wait.
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

// value returns what bucket i of the window stands for, in deciseconds: its
// value when exact, otherwise the mean of its waits.
func (w *window) value(i int) float64 {
	lo, _ := histLow(i)
	if i < histExact {
		return float64(lo)
	}
	return float64(lo) + float64(w.waits.off[i-histExact])/float64(w.waits.n[i])
}

// valuesAt returns the values in deciseconds at 0-based ranks r and r+1 of
// the sorted waits; past the last rank it repeats the last value.
func (w *window) valuesAt(r uint64) (a, b float64) {
	if r+1 < w.zeros {
		return 0, 0
	}
	seen, found := w.zeros, r < w.zeros // found: a is known (it is 0)
	for i := 0; i < histBuckets; i++ {
		c := uint64(w.waits.n[i])
		if c == 0 {
			continue
		}
		seen += c
		v := w.value(i)
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

// serviceRate estimates how many calls the lane serves per second with k
// slots usable: k over the mean duration of the window's upstream exchanges
// (the recent hold times), or, with no exchange reported (a program that
// calls Acquire and Release itself), the rate at which the queue was served
// while it was non-empty. ok is false with neither.
func (w *window) serviceRate(k int) (rate float64, ok bool) {
	if n := w.upstream.total(); n > 0 && w.upstream.held > 0 {
		hold := w.upstream.held.Seconds() / float64(n)
		return float64(k) / hold, true
	}
	if w.granted >= minQueuedGrants && w.busy > 0 {
		return float64(w.granted) / w.busy.Seconds(), true
	}
	return 0, false
}

// minQueuedGrants is how many grants out of the queue the service rate
// needs when it is measured from the queue alone: one quick grant after a
// short queue says little.
const minQueuedGrants = 3
