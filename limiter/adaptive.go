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
// there is none). A limit that drops never revokes a held slot.
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
//     gateway is past its capacity: it is slowing every call down.
//   - Loss: a 429, a 5xx, a transport error or a stall; a Retry-After holds
//     increases for as long as it asks.
//
// A sample counts only if its call was sent after the limit last changed:
// calls sent before reflect the old limit. Decisions use the median of
// the fresh samples, from at least Window of them:
//
//   - Latency above tolerance: the limit drops to limit / ratio (at least
//     one slot), toward the point where the gateway stops slowing down;
//     this is the gradient of Netflix's concurrency-limits and Envoy's
//     adaptive concurrency.
//   - Loss: the limit is multiplied by LossFactor (0.75), and increases
//     stop one slot below the limit that saw the loss for HoldOff (5
//     minutes), so a gateway that answers 429 above a threshold is probed
//     only every few minutes, not in a retry storm. A 429 is the gateway
//     saying what its capacity is; Vector's ARC users found that treating
//     it as noise misbehaves.
//   - Latency within tolerance while the lane uses its slots (calls
//     queued, or every slot held): the limit grows, doubling from the start
//     until the first cut (slow start, as in TCP), then one slot per
//     window of good samples (additive increase). A lane that does not use
//     its slots learns nothing about more of them, so it does not grow.
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
	// be before the gateway counts as past its capacity.
	Tolerance = 0.05
	// LossFactor multiplies the limit on a loss signal.
	LossFactor = 0.75
	// HoldOff is how long increases stay one slot below the limit that saw
	// a loss.
	HoldOff = 5 * time.Minute
	// Window is the fewest fresh samples a decision takes.
	Window = 2
	// probeSamples is how many first-byte times the probe collects.
	probeSamples     = 3
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
	v, ok := l.lanes.Load(key)
	if !ok {
		return
	}
	ln := v.(*lane)
	ln.mu.Lock()
	defer ln.mu.Unlock()
	eff := ln.effLocked(cfg)
	busy := ln.q.n > 0 || ln.waiting != [3]int{} || ln.inflight >= eff.MaxInflight
	if ln.adapt.firstByte(l.clock.Now(), fb, busy) {
		ln.dispatchLocked(l.clock.Now())
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
	reason    string
	reasonAt  time.Time
	lossAt    time.Time
	base      map[int]*baseline // by request size bucket
	lastBase  time.Duration     // the baseline of the latest sample's size
	eff       Config            // the config with the limit in force
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
	c.limit, c.changed, c.fresh, c.good = limit, now, c.fresh[:0], 0
	c.reason, c.reasonAt = reason, now
	return raised
}

// firstByte takes one sample; it reports whether the limit went up.
func (c *controller) firstByte(now time.Time, fb FirstByte, busy bool) bool {
	k := bucket(fb.RequestBytes)
	b := c.base[k]
	if b == nil {
		b = &baseline{}
		c.base[k] = b
	}
	b.add(now, fb.After)
	base, _ := b.get(now)
	c.lastBase = base
	if fb.Sent.Before(c.changed) {
		return false // stale: sent under the old limit
	}
	if c.probing {
		c.fresh = append(c.fresh, 1)
		if len(c.fresh) < probeSamples {
			return false
		}
		c.probing = false
		return c.change(now, orDefault(c.set.Initial, c.set.MinInflight), "probe done: the no-load first-byte time is known")
	}
	r := 1.0
	if base > 0 {
		r = float64(fb.After) / float64(base)
	}
	c.fresh = append(c.fresh, r)
	if r <= 1+Tolerance && busy {
		c.good++
	}
	if len(c.fresh) < Window {
		return false
	}
	med := median(c.fresh)
	limit := c.current()
	switch {
	case med > 1+Tolerance:
		c.slowStart = false
		return c.change(now, min(limit-1, int(float64(limit)/med)), "latency: first bytes past the no-load baseline")
	case c.slowStart && c.good >= Window:
		return c.change(now, c.capped(now, 2*limit), "slow start")
	case c.good >= max(Window, limit):
		return c.change(now, c.capped(now, limit+1), "latency within tolerance while every slot is used")
	}
	return false
}

// capped bounds an increase by the hold after a loss.
func (c *controller) capped(now time.Time, want int) int {
	if now.Before(c.holdUntil) {
		return max(c.current(), min(want, c.holdAt))
	}
	return want
}

// loss takes a loss signal from an exchange sent at sent.
func (c *controller) loss(now, sent time.Time, o Outcome, retryAfter time.Duration) {
	if sent.Before(c.changed) || c.probing {
		return
	}
	limit := c.current()
	c.slowStart = false
	c.holdAt, c.holdUntil = max(1, limit-1), now.Add(max(HoldOff, retryAfter))
	c.lossAt = now
	c.change(now, int(float64(limit)*LossFactor), "loss: "+o.String())
}

func orDefault(a, b int) int {
	if a > 0 {
		return a
	}
	return b
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
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
}

func (c *controller) state(now time.Time) *AdaptiveState {
	s := &AdaptiveState{Min: max(1, c.set.MinInflight), Max: c.max, Probing: c.probing,
		LastChange: c.reason, LastChangeAgo: seconds(now.Sub(c.reasonAt).Seconds()),
		CutByLoss: !c.lossAt.IsZero() && now.Sub(c.lossAt) <= windowSpan}
	if c.lastBase > 0 {
		b := seconds(c.lastBase.Seconds())
		s.BaselineTTFB = &b
	}
	return s
}
