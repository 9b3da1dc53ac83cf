package limiter

import (
	"context"
	"time"

	"github.com/llmlanes/llmlanes/limiter/adaptive"
)

// Adaptive turns on the adaptive limit (Config.Adaptive): each lane's limit
// moves between MinInflight and Config.MaxInflight (the ceiling) from what
// its calls see at the gateway; package adaptive documents the algorithm.
// Priority semantics hold at every limit: class order, aging, FIFO, and
// the reserve, clamped to the current limit (at limit 1 there is none). A
// limit that drops never revokes a held slot, and does not take the
// reserve away: while non-interactive calls still hold more slots than the
// lowered limit leaves them, an interactive call may take a slot up to the
// limit before the drop (no more interactive holders than the reserve), so
// the gateway never sees more than it did before the drop and the
// operator's chat does not wait for the background work to drain. (With a
// Backend, grants are decided by the backend, by the limit alone.)
type Adaptive = adaptive.Settings

// FirstByte is one attempt's first byte, as the transport saw it.
type FirstByte = adaptive.FirstByte

// RecordFirstByte reports the first byte of an attempt in lane key, for
// the adaptive limit (see Adaptive) and a cold lane (Config.ColdStart);
// without either it does nothing. Like
// RecordExchange it never creates a lane.
func (l *Limiter) RecordFirstByte(_ context.Context, key string, fb FirstByte) {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 || (cfg.Adaptive == nil && !cfg.ColdStart) {
		return
	}
	ln := l.lockedLane(key)
	if ln == nil {
		return
	}
	defer ln.mu.Unlock()
	ln.warmLocked()
	if cfg.Adaptive == nil {
		return
	}
	ln.adaptLocked(cfg)
	eff := ln.effLocked(cfg)
	// Using its slots when the first byte came: every one held, or calls
	// waiting for one (the controller also asks that the call was sent into
	// a full lane).
	busy := ln.slots.inflight >= eff.MaxInflight || ln.q.n > 0 || ln.slots.waiting != [3]int{}
	now := l.clock.Now()
	if ln.limit.firstByte(now, fb, ln.slots.inflight, eff.Reserve(), busy) {
		ln.dispatchLocked(now)
	}
}

// adaptiveLimit is a lane's limit under Config.Adaptive: its controller's
// (package adaptive), and, after the limit dropped, the reserve kept
// while the calls above it drain (see Adaptive).
type adaptiveLimit struct {
	c *adaptive.Controller
	// drainFrom is the limit before it last dropped, while the calls that
	// the drop left above it drain; 0 otherwise.
	drainFrom int
	eff       Config // effective's result, so that deciding allocates nothing
}

// effective decides with the controller's limit; a lane whose controller
// cfg would replace (a reload the lane has not seen yet) decides with a
// new one's limit, the floor.
func (a *adaptiveLimit) effective(cfg *Config) *Config {
	if cfg.Adaptive == nil {
		return cfg
	}
	limit := max(1, cfg.Adaptive.MinInflight)
	if a.c.Settings() == *cfg.Adaptive {
		limit = a.c.Limit()
	}
	a.eff = *cfg
	a.eff.MaxInflight = min(limit, cfg.MaxInflight)
	return &a.eff
}

// reconfigured makes a new controller when the adaptive settings are new
// or changed (as the old code did on a reload), none without them, and
// sets the ceiling of cfg.
func (a *adaptiveLimit) reconfigured(cfg *Config, now time.Time) limitPolicy {
	switch {
	case cfg.Adaptive == nil:
		return fixedLimit{}
	case a.c.Settings() != *cfg.Adaptive:
		return &adaptiveLimit{c: adaptive.New(*cfg.Adaptive, cfg.MaxInflight, now)}
	}
	a.c.SetCeiling(cfg.MaxInflight)
	return a
}

func (a *adaptiveLimit) answered() limitPolicy      { return a }
func (a *adaptiveLimit) warmsAt() (time.Time, bool) { return time.Time{}, false }

func (a *adaptiveLimit) held(clock Clock, inflight int, interactive bool) {
	now := clock.Now()
	a.c.Load(now, inflight)
	if interactive {
		a.c.Interactive(now)
	}
}

func (a *adaptiveLimit) firstByte(now time.Time, fb FirstByte, inflight, reserve int, busy bool) bool {
	before := a.c.Limit()
	raised := a.c.FirstByte(now, fb, inflight, reserve, busy)
	a.dropped(before)
	return raised
}

func (a *adaptiveLimit) loss(now time.Time, x *Exchange) {
	before := a.c.Limit()
	a.c.Loss(now, x.Sent, x.Outcome.String(), x.RetryAfter)
	a.dropped(before)
}

// dropped notes, after the controller was told something, whether its
// limit dropped from before: the lane then keeps the interactive reserve
// up to before while the other calls drain (see Adaptive).
func (a *adaptiveLimit) dropped(before int) {
	if a.c.Limit() < before {
		a.drainFrom = max(a.drainFrom, before)
	}
}

func (a *adaptiveLimit) settleDrain(cfg *Config, others int) {
	if a.drainFrom != 0 && others <= cfg.MaxInflight-cfg.Reserve() {
		a.drainFrom = 0
	}
}

// drainReserve reports whether an interactive call keeps its reserve:
// after the limit dropped, while the non-interactive calls
// still hold more than the new limit leaves them, interactive calls keep
// their reserve, up to the limit before the drop.
func (a *adaptiveLimit) drainReserve(cfg *Config, inflight, others int) bool {
	if a.drainFrom == 0 || others <= cfg.MaxInflight-cfg.Reserve() {
		return false
	}
	return inflight < a.drainFrom && inflight-others < min(cfg.InteractiveReserve, a.drainFrom-1)
}

func (a *adaptiveLimit) state(cfg *Config, now time.Time) (bool, *AdaptiveState) {
	if cfg.Adaptive != nil && a.c.Settings() == *cfg.Adaptive {
		return false, adaptiveState(a.c.State(now))
	}
	return false, nil
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

func adaptiveState(st adaptive.State) *AdaptiveState {
	s := &AdaptiveState{Min: st.Min, Max: st.Max, Probing: st.Probing, LastChange: st.LastChange,
		LastChangeAgo: seconds(st.LastChangeAgo.Seconds()), CutByLoss: st.CutByLoss, Tolerance: st.Tolerance}
	if st.BaselineTTFB > 0 {
		b := seconds(st.BaselineTTFB.Seconds())
		s.BaselineTTFB = &b
	}
	return s
}
