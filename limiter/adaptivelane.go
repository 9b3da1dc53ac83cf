package limiter

import (
	"context"

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
	busy := ln.inflight >= eff.MaxInflight || ln.q.n > 0 || ln.waiting != [3]int{}
	now := l.clock.Now()
	before := ln.adapt.Limit()
	raised := ln.adapt.FirstByte(now, fb, ln.inflight, eff.Reserve(), busy)
	ln.droppedLocked(before)
	if raised {
		ln.dispatchLocked(now)
	}
}

// adaptLocked gives the lane the controller cfg asks for: a new one when
// the adaptive settings are new or changed (as the old code did on a
// reload), none without them, and the ceiling of cfg. It is called on the
// paths that act (grants, reports, reloads), never on those that only
// read.
func (l *lane) adaptLocked(cfg *Config) {
	switch {
	case cfg.Adaptive == nil:
		l.adapt, l.drainFrom = nil, 0
	case l.adapt == nil || l.adapt.Settings() != *cfg.Adaptive:
		l.adapt, l.drainFrom = adaptive.New(*cfg.Adaptive, cfg.MaxInflight, l.lim.clock.Now()), 0
	default:
		l.adapt.SetCeiling(cfg.MaxInflight)
	}
}

// effLocked returns the settings lane l decides with: cfg itself, or with
// an adaptive limit, cfg with MaxInflight set to the lane's current limit
// (Reserve then clamps the reserve to it), or 1 while the lane is cold
// (Config.ColdStart). It changes nothing but the
// lane's copy of the result (l.eff), which is valid while the lane's lock
// is held: a caller that goes on without the lock copies it. A lane whose
// controller cfg would replace (a reload the lane has not seen yet)
// decides with a new one's limit, the floor.
func (l *lane) effLocked(cfg *Config) *Config {
	if cfg.Adaptive == nil && !l.cold {
		return cfg
	}
	limit := 1 // a cold lane's (Config.ColdStart)
	switch {
	case l.cold:
	case l.adapt != nil && l.adapt.Settings() == *cfg.Adaptive:
		limit = l.adapt.Limit()
	default:
		limit = max(1, cfg.Adaptive.MinInflight)
	}
	l.eff = *cfg
	l.eff.MaxInflight = min(limit, cfg.MaxInflight)
	return &l.eff
}

// droppedLocked notes, after the controller was told something, whether
// its limit dropped from before: the lane then keeps the interactive
// reserve up to before while the other calls drain (see Adaptive).
func (l *lane) droppedLocked(before int) {
	if l.adapt.Limit() < before {
		l.drainFrom = max(l.drainFrom, before)
	}
}

// settleDrainLocked ends the drain once the non-interactive calls hold no
// more than the limit leaves them. It runs where grants are decided, just
// before, so that the checks themselves change nothing.
func (l *lane) settleDrainLocked(cfg *Config) {
	if l.drainFrom != 0 && l.others <= cfg.MaxInflight-cfg.Reserve() {
		l.drainFrom = 0
	}
}

// drainReserveLocked reports whether an interactive call may take a slot
// the limit does not have: after an adaptive limit dropped, while the
// non-interactive calls still hold more than the new limit leaves them,
// interactive calls keep their reserve, up to the limit before the drop.
func (l *lane) drainReserveLocked(cfg *Config) bool {
	if l.drainFrom == 0 || l.others <= cfg.MaxInflight-cfg.Reserve() {
		return false
	}
	return l.inflight < l.drainFrom && l.inflight-l.others < min(cfg.InteractiveReserve, l.drainFrom-1)
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

// warmLocked ends the lane's cold start (Config.ColdStart): it has heard
// from its gateway, and grants up to its limit from now.
func (l *lane) warmLocked() {
	if l.cold {
		l.cold = false
		if l.q.n > 0 {
			l.dispatchLocked(l.lim.clock.Now())
		}
	}
}
