// Package stats keeps a lane's statistics of the last 5 minutes: the waits
// (for the p50 and p90 of the snapshot), the queue timeouts, the upstream
// exchanges by outcome, and the service rate that the ETAs and a queue
// timeout's Retry-After are estimated from.
//
// A Window is recorded into with the lane's lock held, and read at any
// later time without being changed: a reading at now counts what a
// recording at now would still count, so that taking a snapshot never
// changes what the lane reports later.
//
// The window is kept in 10-second steps: a ring of 31 steps, the current
// partial one and 30 full ones. A sample therefore counts for at least
// 300 s and at most 310 s after it was taken.
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
package stats

import (
	"math/bits"
	"time"
)

const (
	// Step is the window's resolution, Span its length.
	Step  = 10 * time.Second
	Span  = 5 * time.Minute
	steps = int64(Span/Step) + 1

	histExact   = 512 // buckets 0..511 hold 0.0 .. 51.1 s exactly
	histSub     = 64  // sub-buckets per octave above histExact
	histSubBits = 6   // log2(histSub)
	histOctaves = 11  // up to 2^20 deciseconds (29 h); longer waits count in the last bucket
	histLog     = histSub * histOctaves
	histBuckets = histExact + histLog

	// Outcomes is how many outcomes an exchange may have (limiter.Outcome).
	Outcomes = 8
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

type slot struct {
	step     int64
	zeros    uint32
	timeouts uint32
	granted  uint32        // grants out of the queue
	busy     time.Duration // time the queue was non-empty
	gaveUp   GaveUp        // waits that ended because their callers gave up
	waits    *stepHist     // nil until a non-zero wait lands in this step
	upstream Upstream
}

// Causes of GaveUp: the caller left (its context ended), or its deadline
// came (or was foreseen) before a slot.
const (
	CallerGone = iota
	Deadline
	Causes
)

// GaveUp counts the waits that ended because their callers gave up, by
// cause (CallerGone, Deadline) and the call's own class (by index).
type GaveUp [Causes][3]uint32

func (g *GaveUp) add(o *GaveUp, sign uint32) {
	for c := range g {
		for p := range g[c] {
			g[c][p] += sign * o[c][p] // sign is 1 or ^0 (minus one, wrapping)
		}
	}
}

// Upstream counts exchanges by outcome, and retries.
type Upstream struct {
	Outcomes [Outcomes]uint32
	Retries  uint32
	Held     time.Duration // the exchanges' durations, summed
}

func (u *Upstream) add(o *Upstream) {
	for i := range u.Outcomes {
		u.Outcomes[i] += o.Outcomes[i]
	}
	u.Retries += o.Retries
	u.Held += o.Held
}

func (u *Upstream) sub(o *Upstream) {
	for i := range u.Outcomes {
		u.Outcomes[i] -= o.Outcomes[i]
	}
	u.Retries -= o.Retries
	u.Held -= o.Held
}

func (u *Upstream) total() uint64 {
	n := uint64(0)
	for _, c := range u.Outcomes {
		n += uint64(c)
	}
	return n
}

// Window is the 5-minute statistics of one lane. It is guarded by the
// lane's lock.
type Window struct {
	origin time.Time // the limiter's start; steps count from here
	cur    int64     // the newest step recorded
	slots  [steps]slot
	// Sums over the slots.
	zeros    uint64 // immediate grants (wait 0)
	timeouts uint64
	granted  uint64
	busy     time.Duration
	gaveUp   GaveUp
	waits    *sumHist // waits above 0 (queued grants and queue timeouts); nil until the first
	nwaits   uint64
	upstream Upstream
	// lastError is when the latest upstream error (429, 5xx, transport
	// error, stall) was recorded, so that a reader can tell a gateway
	// that is failing now from one that failed minutes ago.
	lastError time.Time
	// tokens are the tokens of each slot's step (by the same index); nil
	// until a call's tokens are counted, so that a lane whose calls carry
	// none pays nothing for them.
	tokens *[steps]Tokens
}

// Tokens are what settled calls used, by kind, and what they were
// estimated at.
type Tokens struct {
	Prompt, Completion, Estimate int64
}

// New returns a window whose steps count from origin.
func New(origin time.Time) Window { return Window{origin: origin} }

// StepOf returns the step of now.
func (w *Window) StepOf(now time.Time) int64 { return int64(now.Sub(w.origin) / Step) }

// Current returns the newest step recorded.
func (w *Window) Current() int64 { return w.cur }

// StepEnd returns when step k ends.
func (w *Window) StepEnd(k int64) time.Time { return w.origin.Add(time.Duration(k+1) * Step) }

// Advance moves the window to now, dropping the steps that fall out of it.
// A reading older than the newest step counts as the newest step.
//
// It is called on every queued grant, by whichever goroutine releases a
// slot, so its common case (still in the current step) is kept small
// enough to inline and the rest is a function of its own.
func (w *Window) Advance(now time.Time) {
	if k := w.StepOf(now); k > w.cur {
		w.moveTo(k)
	}
}

// moveTo makes step k the current one. The histograms are walked through
// pointers, never copied: a copy of one on the stack made every goroutine
// that released a slot grow its stack past Go's smallest, again after each
// collection shrank it.
func (w *Window) moveTo(k int64) {
	for s := max(w.cur+1, k-steps+1); s <= k; s++ {
		sl := &w.slots[s%steps]
		w.zeros -= uint64(sl.zeros)
		w.timeouts -= uint64(sl.timeouts)
		w.granted -= uint64(sl.granted)
		w.busy -= sl.busy
		w.gaveUp.add(&sl.gaveUp, ^uint32(0))
		sl.gaveUp = GaveUp{}
		w.upstream.sub(&sl.upstream)
		sl.upstream = Upstream{}
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
		if w.tokens != nil {
			w.tokens[s%steps] = Tokens{}
		}
	}
	w.cur = k
}

// Zero counts an immediate grant in the current step. The caller makes
// sure the current step is still current (see Advance).
func (w *Window) Zero() {
	w.slots[w.cur%steps].zeros++
	w.zeros++
}

// Wait counts a wait of d that ended at now, in a grant or a queue
// timeout.
func (w *Window) Wait(now time.Time, d time.Duration) {
	w.Advance(now)
	ds := uint64(max(0, (d+50*time.Millisecond)/(100*time.Millisecond)))
	if ds == 0 {
		w.Zero()
		return
	}
	sl := &w.slots[w.cur%steps]
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

// Sample counts a wait of d that ended at now without a grant, as a wait
// sample, unless it rounds to 0: a wait that ended as it began is no
// sample, and not an immediate grant either.
func (w *Window) Sample(now time.Time, d time.Duration) {
	if d >= 50*time.Millisecond {
		w.Wait(now, d)
	}
}

// Settled counts the tokens of a settled call in the current step. The
// caller makes sure the current step is still current (see Advance).
func (w *Window) Settled(t Tokens) {
	if w.tokens == nil {
		w.tokens = new([steps]Tokens)
	}
	c := &w.tokens[w.cur%steps]
	c.Prompt += max(0, t.Prompt)
	c.Completion += max(0, t.Completion)
	c.Estimate += t.Estimate
}

// TokensOf returns the tokens counted in the step of now and the n full
// steps before it (n+1 steps: 6 for the last minute, Steps-1 for the
// window), read without changing the window.
func (w *Window) TokensOf(now time.Time, n int) Tokens {
	var out Tokens
	if w.tokens == nil {
		return out
	}
	k := w.StepOf(now)
	for i := range w.slots {
		if s := w.slots[i].step; s <= k && s >= k-int64(n) {
			t := &w.tokens[i]
			out.Prompt += t.Prompt
			out.Completion += t.Completion
			out.Estimate += t.Estimate
		}
	}
	return out
}

// Steps is how many steps the window holds: the current one and the full
// ones of the last Span.
const Steps = int(steps)

// QueuedGrant counts a grant out of the queue, for the service rate. The
// caller has recorded its wait at the same time.
func (w *Window) QueuedGrant() {
	w.slots[w.cur%steps].granted++
	w.granted++
}

// Busy counts d of time with a non-empty queue, ending at now.
func (w *Window) Busy(now time.Time, d time.Duration) {
	w.Advance(now)
	w.slots[w.cur%steps].busy += d
	w.busy += d
}

// Timeout counts a queue timeout at now, after a wait of d, which is also
// a wait sample.
func (w *Window) Timeout(now time.Time, d time.Duration) {
	w.Wait(now, d)
	w.slots[w.cur%steps].timeouts++
	w.timeouts++
}

// GiveUp counts a wait of a call of class p (by index) that ended at now
// because its caller gave up, for cause (CallerGone or Deadline).
func (w *Window) GiveUp(now time.Time, cause, p int) {
	w.Advance(now)
	w.slots[w.cur%steps].gaveUp[cause][p]++
	w.gaveUp[cause][p]++
}

// Exchange counts an upstream exchange at now: its outcome (an index below
// Outcomes), whether it was a retry, how long it held its slot, and
// whether it was an upstream error.
func (w *Window) Exchange(now time.Time, outcome int, retry bool, held time.Duration, upstreamError bool) {
	w.Advance(now)
	sl := &w.slots[w.cur%steps]
	sl.upstream.Outcomes[outcome]++
	w.upstream.Outcomes[outcome]++
	held = max(0, held)
	sl.upstream.Held += held
	w.upstream.Held += held
	if retry {
		sl.upstream.Retries++
		w.upstream.Retries++
	}
	if upstreamError {
		w.lastError = now
	}
}

// gone returns the slots that Advance(now) would drop: their figures are
// out of the window at now. They are read around, never changed.
func (w *Window) gone(now time.Time) []*slot {
	var out []*slot
	for s := max(w.cur+1, w.StepOf(now)-steps+1); s <= w.StepOf(now); s++ {
		out = append(out, &w.slots[s%steps])
	}
	return out
}

// View is the window as it stands at one time, read without changing it.
type View struct {
	w    *Window
	gone []*slot
	now  time.Time
	// The sums of the window at now.
	zeros, timeouts, granted, nwaits uint64
	busy                             time.Duration
	gaveUp                           GaveUp
	upstream                         Upstream
}

// At returns the window as it stands at now. It changes nothing; the view
// is valid until the window is next recorded into.
func (w *Window) At(now time.Time) View {
	v := View{w: w, gone: w.gone(now), now: now, zeros: w.zeros, timeouts: w.timeouts, granted: w.granted,
		nwaits: w.nwaits, busy: w.busy, gaveUp: w.gaveUp, upstream: w.upstream}
	for _, sl := range v.gone {
		v.gaveUp.add(&sl.gaveUp, ^uint32(0))
		v.zeros -= uint64(sl.zeros)
		v.timeouts -= uint64(sl.timeouts)
		v.granted -= uint64(sl.granted)
		v.busy -= sl.busy
		v.upstream.sub(&sl.upstream)
		if h := sl.waits; h != nil {
			for _, n := range h.n {
				v.nwaits -= uint64(n)
			}
		}
	}
	return v
}

// Timeouts counts the queue timeouts in the window.
func (v *View) Timeouts() int { return int(v.timeouts) }

// GaveUp counts the waits in the window whose callers gave up.
func (v *View) GaveUp() GaveUp { return v.gaveUp }

// Upstream returns the exchanges in the window.
func (v *View) Upstream() Upstream { return v.upstream }

// LastErrorAge is the time since the latest upstream error, if one is in
// the window.
func (v *View) LastErrorAge() (time.Duration, bool) {
	if v.w.lastError.IsZero() || v.now.Sub(v.w.lastError) > Span {
		return 0, false
	}
	return max(0, v.now.Sub(v.w.lastError)), true
}

// Percentiles returns the p50 and p90 of the waits in the window (grants
// and queue timeouts), in seconds, using linear interpolation between
// closest ranks; ok is false when the window holds no wait.
func (v *View) Percentiles() (p50, p90 float64, ok bool) {
	n := v.zeros + v.nwaits
	if n == 0 {
		return 0, 0, false
	}
	if v.nwaits == 0 {
		return 0, 0, true // every grant was immediate
	}
	return v.percentile(0.5, n), v.percentile(0.9, n), true
}

// percentile returns the p-th percentile of the n waits in the window, in
// seconds: the value at rank h = p*(n-1), interpolated linearly between the
// closest ranks floor(h) and floor(h)+1.
func (v *View) percentile(p float64, n uint64) float64 {
	h := p * float64(n-1)
	lo := uint64(h)
	a, b := v.valuesAt(lo)
	return (a + (h-float64(lo))*(b-a)) / 10
}

// bucket returns the count of bucket i in the window at the view's time,
// and what it stands for, in deciseconds: its value when exact, otherwise
// the mean of its waits.
func (v *View) bucket(i int) (n uint64, value float64) {
	n = uint64(v.w.waits.n[i])
	var off uint64
	if i >= histExact {
		off = v.w.waits.off[i-histExact]
	}
	for _, sl := range v.gone {
		if h := sl.waits; h != nil {
			n -= uint64(h.n[i])
			if i >= histExact {
				off -= uint64(h.off[i-histExact])
			}
		}
	}
	lo, _ := histLow(i)
	if i < histExact || n == 0 {
		return n, float64(lo)
	}
	return n, float64(lo) + float64(off)/float64(n)
}

// valuesAt returns the values in deciseconds at 0-based ranks r and r+1 of
// the sorted waits; past the last rank it repeats the last value.
func (v *View) valuesAt(r uint64) (a, b float64) {
	if r+1 < v.zeros {
		return 0, 0
	}
	seen, found := v.zeros, r < v.zeros // found: a is known (it is 0)
	for i := 0; i < histBuckets; i++ {
		c, val := v.bucket(i)
		if c == 0 {
			continue
		}
		seen += c
		if !found && r < seen {
			a, found = val, true
		}
		if found && r+1 < seen {
			return a, val
		}
		b = val
	}
	if !found {
		a = b
	}
	return a, b
}

// ServiceRate estimates how many calls the lane serves per second with k
// slots usable: k over the mean duration of the window's upstream exchanges
// (the recent hold times), or, with no exchange reported (a program that
// calls Acquire and Release itself), the rate at which the queue was served
// while it was non-empty, busyNow being the queue's busy time not yet
// recorded. ok is false with neither.
func (v *View) ServiceRate(k int, busyNow time.Duration) (rate float64, ok bool) {
	if rate, ok := v.HoldRate(k); ok {
		return rate, true
	}
	if busy := v.busy + busyNow; v.granted >= minQueuedGrants && busy > 0 {
		return float64(v.granted) / busy.Seconds(), true
	}
	return 0, false
}

// HoldRate is the service rate of k slots from the exchanges' mean hold
// time alone: k calls per mean hold. A shared lane's process sees every
// hold of its own calls, a fair sample of the lane's, but not the grants
// of the others' queue.
func (v *View) HoldRate(k int) (rate float64, ok bool) {
	if n := v.upstream.total(); n > 0 && v.upstream.Held > 0 {
		return float64(k) / (v.upstream.Held.Seconds() / float64(n)), true
	}
	return 0, false
}

// minQueuedGrants is how many grants out of the queue the service rate
// needs when it is measured from the queue alone: one quick grant after a
// short queue says little.
const minQueuedGrants = 3
