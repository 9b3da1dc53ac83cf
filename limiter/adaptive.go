package limiter

import (
	"context"
	"math"
	"slices"
	"time"
)

// Adaptive turns on the adaptive limit: each lane's limit moves between
// MinInflight and Config.MaxInflight (the ceiling) from what its calls
// see at the gateway. Priority semantics hold at every limit: class order,
// aging, FIFO, and the reserve, clamped to the current limit (at limit 1
// there is none). A limit that drops never revokes a held slot, and does
// not take the reserve away: while non-interactive calls still hold more
// slots than the lowered limit leaves them, an interactive call may take a
// slot up to the limit before the drop (no more interactive holders than
// the reserve), so the gateway never sees more than it did before the
// drop and the operator's chat does not wait for the background work to
// drain. (With a Backend, grants are decided by the backend, by the
// limit alone.)
//
// # The algorithm
//
// It learns from each attempt, not from whole retry chains, through two
// signals the transport reports:
//
//   - Time to first byte, against the lane's no-load baseline for requests
//     of that size: the smallest first-byte time seen in the last 5 minutes
//     among requests whose body size is within 1/16 of an octave (about
//     4 %) of this one's, because long prompts take longer to their first
//     token even on an idle gateway. A ratio above 1 + Tolerance means the
//     gateway is past its capacity: it is slowing every call down. But
//     gateways jitter whatever their load, and the 5-minute minimum is
//     their luckiest call: so the tolerance also grows with the jitter
//     the lane has learned, four times the mean relative difference
//     between first bytes of calls of about one size sent into the same
//     load (the load cannot explain that difference; RFC 6298 bounds
//     round trips the same way, by four mean deviations). A steady gateway
//     keeps the 5 %; one whose first bytes spread uniformly over a third
//     of their value gets about 50 %, and its jitter alone never cuts.
//     The jitter counts once 8 pairs are known; a latency cut made before
//     it is well known (64 pairs) is taken back, within LatencyHold, if
//     the jitter learned since explains it.
//   - Loss: a 429, a 5xx, a transport error or a stall; a Retry-After holds
//     increases for as long as it asks.
//
// A sample counts only if its call was sent after the limit last changed:
// calls sent before reflect the old limit. Decisions look at the last
// three fresh samples:
//
//   - Latency above tolerance: when the lower median of at least Window
//     fresh samples is past the tolerance, or one sample is past Severe
//     (plus the jitter's share)
//     (a quarter over the baseline: a gateway that lost half its capacity
//     may not finish another call for minutes, so no second sample would
//     come), the limit drops toward the point where the gateway stops
//     slowing down, scaled from the load the samples' calls were sent
//     into. limit / ratio is the gradient of Netflix's concurrency-limits
//     and Envoy's adaptive concurrency; here, as only part of a first
//     byte's time grows with load (the tokens, not the prompt's
//     processing), load / (1 + 2(ratio - 1)) (see cut). If the limit had
//     just been raised, the raise was the mistake: it goes no lower than
//     the limit before (in slow start, TCP's return to the last good
//     window). Increases then stop one slot below the limit that
//     was too many for LatencyHold (1 minute); past slow start, they stop
//     at that limit for HoldOff (see cutAt), so the slot above the
//     capacity is probed every minute and the one above that not at all.
//   - Loss: the limit is multiplied by LossFactor (0.75), and increases
//     stop one slot below the load the lost call was sent into, for
//     HoldOff (5 minutes) or the Retry-After if longer, so a gateway that
//     answers 429 above a threshold is probed once every few minutes, not
//     in a retry storm; a loss at that one-slot probe goes straight back to
//     the limit below it. A 429 is the gateway saying what its capacity is;
//     Vector's ARC users found that treating it as noise misbehaves.
//   - Latency within tolerance while the lane uses its slots: the limit
//     grows, doubling from the start until the first cut (slow start, as
//     in TCP), then one slot for each Window such first bytes in a row
//     since the last change (additive increase: each slot added is checked
//     by calls it let through). Using its slots means that when the call
//     was sent, the lane held every slot it could (see full) and, when its
//     first byte came, every slot was held or calls waited for one. A lane
//     that does not use its slots learns nothing about more of them, so it
//     does not grow.
//
// Until the lane has a baseline it admits MinInflight calls (the probe),
// so the first first-byte times are no-load ones; then the limit starts at
// Initial. Envoy's filter measures its minimum latency the same way.
type Adaptive struct {
	// MinInflight is the floor, at least 1; Config.MaxInflight is the
	// ceiling.
	MinInflight int
	// Initial is the limit once the probe is done; 0 means MinInflight.
	Initial int
}

// The controller's constants (see Adaptive).
const (
	// Tolerance is how far above the no-load baseline first-byte times may
	// be before the gateway counts as past its capacity, on a gateway that
	// does not jitter (the learned jitter adds to it: see Adaptive).
	Tolerance = 0.05
	// LossFactor multiplies the limit on a loss signal.
	LossFactor = 0.75
	// HoldOff is how long increases stay one slot below the load a lost
	// call was sent into.
	HoldOff = 5 * time.Minute
	// LatencyHold is how long increases stay one slot below a limit that
	// latency cut: long enough that a lane at its capacity does not probe
	// one slot above it every few calls (each probe that fails leaves one
	// call too many in flight, which the next interactive call waits for),
	// short enough to find capacity that comes back.
	LatencyHold = time.Minute
	// Window is the fewest fresh samples a decision takes.
	Window = 2
	// Severe is the ratio to the baseline at which one fresh first byte
	// cuts at once: a gateway that lost half its capacity may not finish
	// another call for minutes (long generations hold their slots, so
	// nothing new is sent), and waiting for a second sample would keep it
	// at twice its load all that time.
	Severe = 1.25
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

// RecordFirstByte reports the first byte of an attempt in lane key, for
// the adaptive limit (see Adaptive); without one it does nothing. Like
// RecordExchange it never creates a lane.
func (l *Limiter) RecordFirstByte(_ context.Context, key string, fb FirstByte) {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 || cfg.Adaptive == nil {
		return
	}
	ln := l.lockedLane(key)
	if ln == nil {
		return
	}
	defer ln.mu.Unlock()
	eff := ln.effLocked(cfg)
	// Using its slots when the first byte came: every one held, or calls
	// waiting for one (firstByte also asks that the call was sent into a
	// full lane: see full).
	busy := ln.inflight >= eff.MaxInflight || ln.q.n > 0 || ln.waiting != [3]int{}
	if now := l.clock.Now(); ln.adapt.firstByte(now, fb, ln.inflight, eff.Reserve(), busy) {
		ln.dispatchLocked(now)
	}
}

// controller is one lane's adaptive limit. Guarded by the lane's lock.
type controller struct {
	set       Adaptive
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
	drainFrom     int // the limit before it dropped, while the lane drains
	// ceiling caps increases until ceilingUntil (see cutAt).
	ceiling      int
	ceilingUntil time.Time
	reason       string
	reasonAt     time.Time
	lossAt       time.Time
	base         map[int]*baseline // by request size bucket
	lastBase     time.Duration     // the baseline of the latest sample's size
	eff          Config            // the config with the limit in force
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
// Tolerance alone. As TCP's retransmission timer bounds round trips by four
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
// Tolerance plus four times the learned jitter.
func (c *controller) tolerance() float64 { return Tolerance + jitterK*c.jitter.spread() }

type loadAt struct {
	at time.Time
	n  int
}

func (c *controller) logLoad(now time.Time, n int) {

	c.loads[c.nload%len(c.loads)] = loadAt{now, n}
	c.nload++
}

// loadAt returns the calls in flight just after t (the send counted), as
// far back as the log goes; def if it does not.
func (c *controller) loadAt(t time.Time, def int) int {
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

func newController(cfg *Config, now time.Time) *controller {
	c := &controller{set: *cfg.Adaptive, max: cfg.MaxInflight, probing: true, slowStart: true, changed: now,
		base: map[int]*baseline{}, reason: "probe: measuring the no-load first-byte time", reasonAt: now}
	c.limit = max(1, c.set.MinInflight)
	return c
}

// current is the limit in force.
func (c *controller) current() int {
	if c.probing {
		return max(1, c.set.MinInflight)
	}
	return c.limit
}

func (c *controller) change(now time.Time, limit int, reason string) bool {
	limit = max(max(1, c.set.MinInflight), min(c.max, limit))
	raised := limit > c.current()
	if limit < c.current() {
		c.drainFrom = max(c.drainFrom, c.current())
	}
	c.raisedFrom = 0
	if raised {
		c.raisedFrom = c.current()
	}
	c.limit, c.changed, c.fresh, c.loadsSent, c.good = limit, now, c.fresh[:0], c.loadsSent[:0], 0
	c.reason, c.reasonAt = reason, now
	return raised
}

// firstByte takes one sample; it reports whether the limit went up.
// inflight is the lane's calls in flight now: the load the first byte
// met, as far as this lane knows.
func (c *controller) firstByte(now time.Time, fb FirstByte, inflight, reserve int, busy bool) bool {
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
			if c.good >= Window {
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
		if c.good >= min(Window, c.limit) {
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
	jit := c.tolerance() - Tolerance
	if len(c.fresh) > 3 {
		c.fresh, c.loadsSent = c.fresh[1:], c.loadsSent[1:]
	}
	switch {
	case r > 1+Tolerance+jit:
		c.good = 0 // an increase takes good first bytes in a row
	case busy:
		c.good++
	}
	if done, raised := c.takeBack(now); done {
		return raised
	}
	limit := c.current()
	switch m := median(c.fresh); {
	case len(c.fresh) >= Window && m > 1+Tolerance+jit:
		return c.latencyCut(now, cut(min(limit, slices.Max(c.loadsSent)), m-jit), m, "latency: first bytes past the no-load baseline")
	case r >= Severe+jit:
		return c.latencyCut(now, cut(min(limit, c.loadsSent[len(c.loadsSent)-1]), r-jit), r, "latency: a first byte far past the no-load baseline")
	case r > 1+Tolerance+jit || !busy:
		return false
	case c.slowStart && c.good >= Window:
		return c.change(now, c.capped(now, grow(limit)), "slow start")
	case !c.slowStart && c.good >= Window:
		// Each slot added is checked by first bytes of calls sent with
		// every slot in use: Window good ones earn the next.
		return c.change(now, c.capped(now, limit+1), "latency within tolerance while every slot is used")
	}
	return false
}

// latencyCut lowers the limit to to, at least one slot. When the limit
// was just raised (the first fresh samples since are the slow ones), the
// raise was the mistake: the limit goes no lower than where it was, which
// served within tolerance. (Going back exactly there was tried: in the
// sweep of docs/ADAPTIVE.md it settled later, in 7 runs of 24 against 14.) (In slow start this is
// TCP's return to the window before the one that lost; later, it keeps a
// failed probe from costing more than its one slot.)
func (c *controller) latencyCut(now time.Time, to int, ratio float64, reason string) bool {
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
	c.hold(now, limit-1, LatencyHold)
	return c.change(now, min(limit-1, to), reason)
}

// undo is what a latency cut made before the jitter was well known (from
// fewer than jitterWindow pairs) changed, kept for LatencyHold: if the
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
func (c *controller) takeBack(now time.Time) (done, raised bool) {
	u := c.undo
	if u == nil {
		return false, false
	}
	if now.Sub(u.at) >= LatencyHold {
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
func (c *controller) capped(now time.Time, want int) int {
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
// last HoldOff: the slot above the gateway's capacity is probed again
// (after LatencyHold), the one above that is not, however lucky a few
// first bytes are (calls sent as others ended). A lower cut (the capacity
// dipped) does not lower the ceiling while it lasts, so capacity that
// comes back is found again. Slow start's overshoot sets no ceiling.
func (c *controller) cutAt(now time.Time, limit int) {
	if c.slowStart {
		return
	}
	if limit-1 >= c.ceiling || !now.Before(c.ceilingUntil) {
		c.ceiling, c.ceilingUntil = max(1, limit-1), now.Add(HoldOff)
	}
}

// full is the load at which the lane uses every slot it can: the limit
// when interactive calls took a slot in the last HoldOff, so that the
// slot their reserve keeps is inside what the gateway was found to serve
// (the limit settles at the capacity, not one above it, and an interactive
// call does not push the gateway past it); else the limit less the
// reserve, because with no interactive call the reserved slot stays free
// and a lane of background work must still be able to grow.
func (c *controller) full(now time.Time, reserve int) int {
	if !c.interactiveAt.IsZero() && now.Sub(c.interactiveAt) < HoldOff {
		return c.current()
	}
	return c.current() - reserve
}

// hold ends slow start and stops increases at limit (at least one slot)
// for d: a limit that was too many is not tried again before d has passed.
// The latest hold replaces any earlier one.
func (c *controller) hold(now time.Time, limit int, d time.Duration) {
	c.slowStart = false
	c.holdAt, c.holdUntil = max(1, limit), now.Add(d)
}

// loss takes a loss signal from an exchange sent at sent.
func (c *controller) loss(now, sent time.Time, o Outcome, retryAfter time.Duration) {
	if sent.Before(c.changed) || c.probing {
		return
	}
	limit := c.current()
	next := int(float64(limit) * LossFactor)
	if c.lossHeld != 0 && limit == c.lossHeld+1 {
		// The probe one slot past a loss hold failed: the slot below it
		// served without loss for HoldOff; go back there.
		next = c.lossHeld
	}
	// The load the lost call was sent into was too many.
	at := min(limit, c.loadAt(sent, limit)) - 1
	c.undo = nil // a loss is no jitter
	c.hold(now, at, max(HoldOff, retryAfter))
	c.lossHeld = at
	next = min(next, at)
	c.lossAt = now
	c.change(now, next, "loss: "+o.String())
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

// effLocked returns the settings lane l decides with: cfg itself, or with
// an adaptive limit, cfg with MaxInflight set to the lane's current limit
// (Reserve then clamps the reserve to it).
func (l *lane) effLocked(cfg *Config) *Config {
	if cfg.Adaptive == nil {
		l.adapt = nil
		return cfg
	}
	now := l.lim.clock.Now()
	if l.adapt == nil || l.adapt.set != *cfg.Adaptive {
		l.adapt = newController(cfg, now)
	}
	c := l.adapt
	c.max = cfg.MaxInflight
	c.eff = *cfg
	c.eff.MaxInflight = min(c.current(), cfg.MaxInflight)
	return &c.eff
}

// AdaptiveState is a lane's adaptive limit in the snapshot.
type AdaptiveState struct {
	Min     int  `json:"min"`
	Max     int  `json:"max"`
	Probing bool `json:"probing"`
	// BaselineTTFB is the no-load first-byte time of the latest sample's
	// size; null before the first.
	BaselineTTFB *Seconds `json:"baseline_ttfb_s"`
	// LastChange says why the limit last changed, LastChangeAgo how long
	// ago.
	LastChange    string  `json:"last_change"`
	LastChangeAgo Seconds `json:"last_change_ago_s"`
	// CutByLoss is true when gateway loss signals cut the limit in the
	// last 5 minutes: classification lists limit_cut, a gateway reason.
	CutByLoss bool `json:"cut_by_loss"`
	// Tolerance is how far above the no-load baseline (as a share of it)
	// first bytes may be before they count as past the gateway's capacity:
	// 0.05, plus four times the jitter the lane has learned.
	Tolerance float64 `json:"tolerance"`
}

func (c *controller) state(now time.Time) *AdaptiveState {
	s := &AdaptiveState{Min: max(1, c.set.MinInflight), Max: c.max, Probing: c.probing,
		LastChange: c.reason, LastChangeAgo: seconds(now.Sub(c.reasonAt).Seconds()),
		CutByLoss: !c.lossAt.IsZero() && now.Sub(c.lossAt) <= windowSpan, Tolerance: math.Round(c.tolerance()*1000) / 1000}
	if c.lastBase > 0 {
		b := seconds(c.lastBase.Seconds())
		s.BaselineTTFB = &b
	}
	return s
}

// grow is slow start's next limit: double, as in TCP. (Half again
// overshoots less but, with long generations, takes minutes more to get
// there: new first bytes come only as calls end.)
func grow(limit int) int { return 2 * limit }

// drainReserveLocked reports whether an interactive call may take a slot
// the limit does not have: after an adaptive limit dropped, while the
// non-interactive calls still hold more than the new limit leaves them,
// interactive calls keep their reserve, up to the limit before the drop.
func (l *lane) drainReserveLocked(cfg *Config) bool {
	c := l.adapt
	if c == nil || c.drainFrom == 0 {
		return false
	}
	if l.others <= cfg.MaxInflight-cfg.Reserve() {
		c.drainFrom = 0 // drained
		return false
	}
	return l.inflight < c.drainFrom && l.inflight-l.others < min(cfg.InteractiveReserve, c.drainFrom-1)
}
