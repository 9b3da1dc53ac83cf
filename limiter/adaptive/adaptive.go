package adaptive

import (
	"math"
	"slices"
	"time"
)

// Settings are an adaptive limit's (limiter.Adaptive).
type Settings struct {
	// MinInflight is the floor, at least 1; the lane's MaxInflight is the
	// ceiling.
	MinInflight int
	// Initial is the limit once the probe is done; 0 means MinInflight.
	Initial int
}

// The controller's constants (see the package documentation).
const (
	// tolerance is how far above the no-load baseline first-byte times may
	// be before the gateway counts as past its capacity, on a gateway that
	// does not jitter (the learned jitter adds to it).
	tolerance = 0.05
	// lossFactor multiplies the limit on a loss signal.
	lossFactor = 0.75
	// holdOff is how long increases stay one slot below the load a lost
	// call was sent into.
	holdOff = 5 * time.Minute
	// latencyHold is how long increases stay one slot below a limit that
	// latency cut: long enough that a lane at its capacity does not probe
	// one slot above it every few calls (each probe that fails leaves one
	// call too many in flight, which the next interactive call waits for),
	// short enough to find capacity that comes back.
	latencyHold = time.Minute
	// window is the fewest fresh samples a decision takes.
	window = 2
	// severe is the ratio to the baseline at which one fresh first byte
	// cuts at once: a gateway that lost half its capacity may not finish
	// another call for minutes (long generations hold their slots, so
	// nothing new is sent), and waiting for a second sample would keep it
	// at twice its load all that time.
	severe = 1.25
	// probeSamples is how many first-byte times the probe collects.
	probeSamples = 3
	// jitterK is how many mean differences of the jitter the tolerance
	// adds (see jitter), minPairs how many pairs it takes to learn.
	jitterK          = 4
	minPairs         = 8
	jitterWindow     = 64 // the gain's inverse, once past it
	bucketsPerOctave = 16
)

// FirstByte is one attempt's first byte, as the transport saw it.
type FirstByte struct {
	Sent         time.Time     // when the request was sent, its slot held
	After        time.Duration // from sending to the first byte of the body
	RequestBytes int           // the request body's size
}

// Controller is one lane's adaptive limit. The lane's lock guards it.
type Controller struct {
	set       Settings
	max       int
	limit     int
	probing   bool
	slowStart bool
	changed   time.Time // samples of calls sent before this are stale
	fresh     []float64 // ratios of fresh samples, since the last change
	good      int       // fresh samples within tolerance
	holdAt    int       // increases stop here until holdUntil
	holdUntil time.Time
	lossHeld  int // the limit the latest loss held increases at
	// interactiveAt is when an interactive call last took a slot (see
	// full).
	interactiveAt time.Time
	raisedFrom    int // the limit before the last change, if it was a raise
	// ceiling caps increases until ceilingUntil (see cutAt).
	ceiling      int
	ceilingUntil time.Time
	reason       string
	reasonAt     time.Time
	lossAt       time.Time
	base         map[int]*baseline // by request size bucket
	lastBase     time.Duration     // the baseline of the latest sample's size
	// loads is the lane's calls in flight after each of its last changes,
	// so that a first byte is judged by the load its call was sent into.
	loads     [64]loadAt
	nload     int
	loadsSent []int // the load each fresh sample's call was sent into
	jitter    jitter
	undo      *undo // the latest latency cut, while it may be taken back
}

// jitter learns how much first bytes vary that the load does not explain:
// the mean relative difference between two first bytes of requests of one
// size bucket whose calls were sent into the same load, each paired with
// the latest such sample before it (among the last 8 samples); a running mean over the first pairs, then an exponentially
// weighted one over about the last 128 (gain 1/64). A gateway whose first
// byte does not grow with load but jitters has a large one, and its ratios
// may go that far above the baseline before they count as past its
// capacity (see tolerance); a steady gateway has none, and the tolerance is
// tolerance alone. As TCP's retransmission timer bounds round trips by four
// mean deviations learned from them (RFC 6298: SRTT + 4·RTTVAR), not by a
// fixed share, so does this.
type jitter struct {
	mean   float64
	n      int             // pairs seen
	recent [8]jitterSample // the latest samples, newest at (next-1)
	next   int
}

type jitterSample struct {
	after  time.Duration
	bucket int
	load   int // 0: none
}

// pair takes a first byte after, of a request of size bucket k, sent
// into load.
func (j *jitter) pair(after time.Duration, k, load int) {
	for i := 1; i <= len(j.recent); i++ {
		p := j.recent[(j.next-i+len(j.recent))%len(j.recent)]
		if p.load == load && p.bucket == k && p.after > 0 && after > 0 {
			d := float64(max(p.after, after)-min(p.after, after)) / float64(min(p.after, after))
			j.n++
			j.mean += (d - j.mean) / float64(min(j.n, jitterWindow))
			break
		}
	}
	j.recent[j.next] = jitterSample{after, k, load}
	j.next = (j.next + 1) % len(j.recent)
}

// spread is the mean difference, 0 until minPairs pairs have been seen.
func (j *jitter) spread() float64 {
	if j.n < minPairs {
		return 0
	}
	return j.mean
}

// tolerance is how far above 1 a ratio may be and still count as no load:
// tolerance plus four times the learned jitter.
func (c *Controller) tolerance() float64 { return tolerance + jitterK*c.jitter.spread() }

type loadAt struct {
	at time.Time
	n  int
}

// Load notes that the lane has n calls in flight from now on (after each
// grant and release).
func (c *Controller) Load(now time.Time, n int) {
	c.loads[c.nload%len(c.loads)] = loadAt{now, n}
	c.nload++
}

// loadAt returns the calls in flight just after t (the send counted), as
// far back as the log goes; def if it does not.
func (c *Controller) loadAt(t time.Time, def int) int {
	n := def
	for i := 1; i <= min(c.nload, len(c.loads)); i++ {
		e := c.loads[(c.nload-i)%len(c.loads)]
		if e.at.After(t) {
			continue
		}
		return max(e.n, 1)
	}
	return n
}

// baseline is the smallest first-byte time of one size bucket over the
// last 5 minutes, kept per minute.
type baseline struct {
	minute [5]int64
	min    [5]time.Duration
}

func (b *baseline) add(now time.Time, d time.Duration) {
	m := now.Unix() / 60
	i := m % 5
	if b.minute[i] != m {
		b.minute[i], b.min[i] = m, d
		return
	}
	b.min[i] = min(b.min[i], d)
}

func (b *baseline) get(now time.Time) (time.Duration, bool) {
	m := now.Unix() / 60
	best, ok := time.Duration(0), false
	for i := range b.minute {
		if b.minute[i] > m-5 && b.minute[i] <= m && (!ok || b.min[i] < best) {
			best, ok = b.min[i], true
		}
	}
	return best, ok
}

func bucket(bytes int) int {
	return int(math.Floor(math.Log2(float64(max(bytes, 1))) * bucketsPerOctave))
}

// New returns the controller of a new lane with settings s and ceiling
// max, probing for its no-load first-byte time from now.
func New(s Settings, max int, now time.Time) *Controller {
	c := &Controller{set: s, max: max, probing: true, slowStart: true, changed: now,
		base: map[int]*baseline{}, reason: "probe: measuring the no-load first-byte time", reasonAt: now}
	c.limit = c.floor()
	return c
}

// Settings returns the settings the controller was made with.
func (c *Controller) Settings() Settings { return c.set }

// SetCeiling makes max the ceiling (the lane's MaxInflight, reloaded).
func (c *Controller) SetCeiling(max int) { c.max = max }

// Limit is the limit in force. It changes nothing.
func (c *Controller) Limit() int { return c.current() }

func (c *Controller) floor() int { return max(1, c.set.MinInflight) }

// current is the limit in force.
func (c *Controller) current() int {
	if c.probing {
		return max(1, c.set.MinInflight)
	}
	return c.limit
}

func (c *Controller) change(now time.Time, limit int, reason string) bool {
	limit = max(c.floor(), min(c.max, limit))
	raised := limit > c.current()
	c.raisedFrom = 0
	if raised {
		c.raisedFrom = c.current()
	}
	c.limit, c.changed, c.fresh, c.loadsSent, c.good = limit, now, c.fresh[:0], c.loadsSent[:0], 0
	c.reason, c.reasonAt = reason, now
	return raised
}

// FirstByte takes one sample; it reports whether the limit went up.
// inflight is the lane's calls in flight now: the load the first byte met,
// as far as this lane knows; reserve is the lane's interactive reserve in
// force; busy, whether the lane uses its slots now (every one held, or
// calls waiting for one).
func (c *Controller) FirstByte(now time.Time, fb FirstByte, inflight, reserve int, busy bool) bool {
	k := bucket(fb.RequestBytes)
	b := c.base[k]
	if b == nil {
		b = &baseline{}
		c.base[k] = b
	}
	// The reference: this size's baseline, or, for the first call of its
	// size, a neighbouring size's (within 1/16 of an octave more or less,
	// where no-load times differ by a few percent at most).
	base, known := b.get(now)
	for _, n := range []int{k - 1, k + 1} {
		if nb := c.base[n]; nb != nil && !known {
			base, known = nb.get(now)
		}
	}
	b.add(now, fb.After)
	if !known {
		base, _ = b.get(now)
	}
	c.lastBase = base
	if fb.Sent.Before(c.changed) {
		return false // stale: sent under the old limit
	}
	if !c.probing {
		// Past the probe, a sample speaks for the current limit only if
		// its call was sent with every slot in use: a good first byte of a
		// call sent into a half-empty lane says nothing about one more.
		busy = busy && c.loadAt(fb.Sent, inflight) >= c.full(now, reserve)
	}
	if !known && !c.probing {
		// Nothing to compare it with: it only sets a baseline, but in slow
		// start, with every slot in use, it stands for a good one (the
		// next known sizes correct a wrong guess).
		if c.slowStart && busy && c.loadAt(fb.Sent, inflight) >= c.full(now, reserve) {
			c.good++
			if c.good >= window {
				return c.change(now, c.capped(now, grow(c.current())), "slow start")
			}
		}
		return false
	}
	if c.probing {
		c.fresh = append(c.fresh, 1)
		if busy {
			c.good++
		}
		if len(c.fresh) < min(probeSamples, max(1, c.set.MinInflight)) {
			return false
		}
		c.probing = false
		if initial := orDefault(c.set.Initial, c.set.MinInflight); initial > c.limit {
			return c.change(now, initial, "probe done: the no-load first-byte time is known; starting at initial")
		}
		// Starting from the floor: the probe's calls, sent with every slot
		// in use, are the first window of slow start.
		if c.good >= min(window, c.limit) {
			return c.change(now, c.capped(now, grow(c.limit)), "probe done; slow start")
		}
		return c.change(now, c.limit, "probe done: the no-load first-byte time is known")
	}
	r := 1.0
	if base > 0 {
		r = float64(fb.After) / float64(base)
	}
	// The decision looks at the latest fresh samples (a sliding window of
	// three), and a cut scales the load their calls were sent into. Their
	// ratios are judged against the tolerance, which grows with the
	// gateway's jitter (see jitter), and a cut scales by the part of the
	// ratio the jitter does not explain.
	c.fresh = append(c.fresh, r)
	c.loadsSent = append(c.loadsSent, c.loadAt(fb.Sent, inflight))
	c.jitter.pair(fb.After, k, c.loadsSent[len(c.loadsSent)-1])
	jit := c.tolerance() - tolerance
	if len(c.fresh) > 3 {
		c.fresh, c.loadsSent = c.fresh[1:], c.loadsSent[1:]
	}
	switch {
	case r > 1+tolerance+jit:
		c.good = 0 // an increase takes good first bytes in a row
	case busy:
		c.good++
	}
	if done, raised := c.takeBack(now); done {
		return raised
	}
	limit := c.current()
	switch m := median(c.fresh); {
	case len(c.fresh) >= window && m > 1+tolerance+jit:
		return c.latencyCut(now, cut(min(limit, slices.Max(c.loadsSent)), m-jit), m, "latency: first bytes past the no-load baseline")
	case r >= severe+jit:
		return c.latencyCut(now, cut(min(limit, c.loadsSent[len(c.loadsSent)-1]), r-jit), r, "latency: a first byte far past the no-load baseline")
	case r > 1+tolerance+jit || !busy:
		return false
	case c.slowStart && c.good >= window:
		return c.change(now, c.capped(now, grow(limit)), "slow start")
	case !c.slowStart && c.good >= window:
		// Each slot added is checked by first bytes of calls sent with
		// every slot in use: window good ones earn the next.
		return c.change(now, c.capped(now, limit+1), "latency within tolerance while every slot is used")
	}
	return false
}

// latencyCut lowers the limit to to, at least one slot. When the limit
// was just raised (the first fresh samples since are the slow ones), the
// raise was the mistake: the limit goes no lower than where it was, which
// served within tolerance. (Going back exactly there was tried, and settled
// later in the sweep of docs/ADAPTIVE.md.) In slow start this is TCP's
// return to the window before the one that lost; later, it keeps a failed
// probe from costing more than its one slot.
func (c *Controller) latencyCut(now time.Time, to int, ratio float64, reason string) bool {
	limit := c.current()
	if c.raisedFrom > 0 {
		to = max(to, c.raisedFrom)
	}
	switch u := c.undo; {
	case c.jitter.n >= jitterWindow:
		c.undo = nil // judged with the jitter well known: it stands
	case u != nil:
		// Cuts in a row are taken back together, to the state before the
		// first, once the jitter explains the largest.
		u.at, u.ratio = now, max(u.ratio, ratio)
	default:
		c.undo = &undo{at: now, ratio: ratio, limit: limit, slowStart: c.slowStart, holdAt: c.holdAt, holdUntil: c.holdUntil,
			ceiling: c.ceiling, ceilingUntil: c.ceilingUntil}
	}
	c.cutAt(now, limit)
	c.hold(now, limit-1, latencyHold)
	return c.change(now, min(limit-1, to), reason)
}

// undo is what a latency cut made before the jitter was well known (from
// fewer than jitterWindow pairs) changed, kept for latencyHold: if the
// jitter learned since explains the ratio that made the cut (it is within
// the tolerance now), the cut is taken back. A lane learns its gateway's
// jitter from its first pairs of samples, roughly from the first minPairs;
// a cut made before, on a jittery gateway, would otherwise hold the limit
// down for minutes.
type undo struct {
	at           time.Time
	ratio        float64
	limit        int
	slowStart    bool
	holdAt       int
	holdUntil    time.Time
	ceiling      int
	ceilingUntil time.Time
}

// takeBack undoes the latest latency cut if the jitter now explains it
// (done), and reports whether that raised the limit.
func (c *Controller) takeBack(now time.Time) (done, raised bool) {
	u := c.undo
	if u == nil {
		return false, false
	}
	if now.Sub(u.at) >= latencyHold {
		c.undo = nil
		return false, false
	}
	if u.ratio > 1+c.tolerance() {
		return false, false
	}
	c.undo = nil
	c.slowStart, c.holdAt, c.holdUntil, c.ceiling, c.ceilingUntil = u.slowStart, u.holdAt, u.holdUntil, u.ceiling, u.ceilingUntil
	return true, c.change(now, u.limit, "latency cut taken back: the gateway's jitter, learned since, explains it")
}

// capped bounds an increase by the hold after a loss.
func (c *Controller) capped(now time.Time, want int) int {
	if now.Before(c.ceilingUntil) {
		want = min(want, c.ceiling)
	}
	if now.Before(c.holdUntil) {
		want = min(want, c.holdAt)
	}
	return max(c.current(), want)
}

// cutAt records a latency cut from limit, before hold ends slow start.
// Past slow start, increases stop at the highest limit latency cut in the
// last holdOff: the slot above the gateway's capacity is probed again
// (after latencyHold), the one above that is not, however lucky a few
// first bytes are (calls sent as others ended). A lower cut (the capacity
// dipped) does not lower the ceiling while it lasts, so capacity that
// comes back is found again. Slow start's overshoot sets no ceiling.
func (c *Controller) cutAt(now time.Time, limit int) {
	if c.slowStart {
		return
	}
	if limit-1 >= c.ceiling || !now.Before(c.ceilingUntil) {
		c.ceiling, c.ceilingUntil = max(1, limit-1), now.Add(holdOff)
	}
}

// full is the load at which the lane uses every slot it can: the limit
// when interactive calls took a slot in the last holdOff, so that the
// slot their reserve keeps is inside what the gateway was found to serve
// (the limit settles at the capacity, not one above it, and an interactive
// call does not push the gateway past it); else the limit less the
// reserve, because with no interactive call the reserved slot stays free
// and a lane of background work must still be able to grow.
func (c *Controller) full(now time.Time, reserve int) int {
	if !c.interactiveAt.IsZero() && now.Sub(c.interactiveAt) < holdOff {
		return c.current()
	}
	return c.current() - reserve
}

// hold ends slow start and stops increases at limit (at least one slot)
// for d: a limit that was too many is not tried again before d has passed.
// The latest hold replaces any earlier one.
func (c *Controller) hold(now time.Time, limit int, d time.Duration) {
	c.slowStart = false
	c.holdAt, c.holdUntil = max(1, limit), now.Add(d)
}

// Interactive notes that an interactive call took a slot at now (see
// full).
func (c *Controller) Interactive(now time.Time) { c.interactiveAt = now }

// maxRetryAfter bounds how long one loss's Retry-After holds the limit
// down, twice the hold-off: a gateway's answer must not pin a lane's limit
// for a day (limiter.MaxRetryAfterHold bounds its hold of the grants).
const maxRetryAfter = 2 * holdOff

// Loss takes a loss signal (what: "rate_limited", "server_error", ...)
// from an exchange sent at sent, with the Retry-After it asked for.
func (c *Controller) Loss(now, sent time.Time, what string, retryAfter time.Duration) {
	if sent.Before(c.changed) || c.probing {
		return
	}
	limit := c.current()
	next := int(float64(limit) * lossFactor)
	if c.lossHeld != 0 && limit == c.lossHeld+1 {
		// The probe one slot past a loss hold failed: the slot below it
		// served without loss for holdOff; go back there.
		next = c.lossHeld
	}
	// The load the lost call was sent into was too many.
	at := min(limit, c.loadAt(sent, limit)) - 1
	c.undo = nil // a loss is no jitter
	c.hold(now, at, max(holdOff, min(retryAfter, maxRetryAfter)))
	c.lossHeld = at
	next = min(next, at)
	c.lossAt = now
	c.change(now, next, "loss: "+what)
}

// cut is the limit a lane with load calls in flight whose first bytes run
// ratio times the baseline drops to. Past a gateway's capacity c, its first bytes grow as
// (F + T·a/c) / (F + T): only the token time T grows with the calls in
// progress a, not the fixed part F (prompt processing). Taking T to be
// half of the no-load time, c = a / (1 + 2(ratio - 1)); where T is more,
// the cut falls below the capacity and the increases win the rest back.
func cut(load int, ratio float64) int {
	return int(float64(load) / (1 + 2*(ratio-1)))
}

func orDefault(a, b int) int {
	if a > 0 {
		return a
	}
	return b
}

// median is the lower median: of two, the smaller, so that a cut takes
// two slow first bytes, not one.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// grow is slow start's next limit: double, as in TCP. (Half again
// overshoots less but, with long generations, takes minutes more to get
// there: new first bytes come only as calls end.)
func grow(limit int) int { return 2 * limit }

// State is a controller's state, for the lane's snapshot.
type State struct {
	Min, Max int
	Probing  bool
	// BaselineTTFB is the no-load first-byte time of the latest sample's
	// size; 0 before the first.
	BaselineTTFB time.Duration
	// LastChange says why the limit last changed, LastChangeAgo how long
	// ago.
	LastChange    string
	LastChangeAgo time.Duration
	// CutByLoss is true when loss signals cut the limit in the last 5
	// minutes.
	CutByLoss bool
	// Tolerance is how far above the no-load baseline (as a share of it)
	// first bytes may be before they count as past the gateway's capacity:
	// 0.05, plus four times the jitter the lane has learned.
	Tolerance float64
}

// lossWindow is how long a cut by loss shows in State: the snapshot's 5
// minutes.
const lossWindow = 5 * time.Minute

// State returns the controller's state at now. It changes nothing.
func (c *Controller) State(now time.Time) State {
	return State{Min: c.floor(), Max: c.max, Probing: c.probing, BaselineTTFB: c.lastBase,
		LastChange: c.reason, LastChangeAgo: now.Sub(c.reasonAt),
		CutByLoss: !c.lossAt.IsZero() && now.Sub(c.lossAt) <= lossWindow, Tolerance: math.Round(c.tolerance()*1000) / 1000}
}
