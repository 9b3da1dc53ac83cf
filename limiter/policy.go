package limiter

import (
	"time"

	"github.com/llmlanes/llmlanes/limiter/adaptive"
)

// A limitPolicy is where a lane's limit comes from, within the ceiling of
// Config.MaxInflight: the ceiling itself (fixedLimit), one call at a time
// until the gateway has answered (coldStart, Config.ColdStart), or an
// adaptive controller's (adaptiveLimit, Config.Adaptive). The lane asks
// it for the settings to decide with and tells it what it sees, always
// under the lane's lock; each implementation is a file of its own.
type limitPolicy interface {
	// effective returns the settings to decide with under cfg: cfg
	// itself, or a copy with MaxInflight set to the policy's limit,
	// valid while the lane's lock is held (a caller that goes on
	// without it copies it).
	effective(cfg *Config) *Config
	// reconfigured returns the policy for cfg, the settings now in
	// force (after a reload, or at any act of the lane): itself, or
	// the one that replaces it.
	reconfigured(cfg *Config, now time.Time) limitPolicy
	// answered returns the policy once the lane has heard from its
	// gateway (an answer, a first byte, the provider's headers).
	answered() limitPolicy
	// warmsAt returns when the policy ends on its own (a cold start's
	// ColdStartMax), if it does.
	warmsAt() (time.Time, bool)
	// held tells it the slots held, after a grant (interactive: of an
	// Interactive call) or a release.
	held(clock Clock, inflight int, interactive bool)
	// firstByte tells it an attempt's first byte; it reports whether
	// the limit rose.
	firstByte(now time.Time, fb FirstByte, inflight, reserve int, busy bool) (raised bool)
	// loss tells it of an exchange that was a loss signal.
	loss(now time.Time, x *Exchange)
	// drainReserve reports whether an Interactive call may take a slot
	// the limit does not have (see Adaptive), given the slots held and
	// those held by the other classes; settleDrain ends that once they
	// fit the limit.
	drainReserve(cfg *Config, inflight, others int) bool
	settleDrain(cfg *Config, others int)
	// state returns the policy's part of the snapshot under cfg: whether
	// the lane is cold, and its adaptive limit.
	state(cfg *Config, now time.Time) (cold bool, a *AdaptiveState)
}

// fixedLimit is the limit Config.MaxInflight, as it is. Zero-sized: a
// lane keeps it at no cost.
type fixedLimit struct{}

func (fixedLimit) effective(cfg *Config) *Config { return cfg }

func (p fixedLimit) reconfigured(cfg *Config, now time.Time) limitPolicy {
	if cfg.Adaptive != nil {
		return &adaptiveLimit{c: adaptive.New(*cfg.Adaptive, cfg.MaxInflight, now)}
	}
	return p
}

func (p fixedLimit) answered() limitPolicy                             { return p }
func (fixedLimit) warmsAt() (time.Time, bool)                          { return time.Time{}, false }
func (fixedLimit) held(Clock, int, bool)                               {}
func (fixedLimit) firstByte(time.Time, FirstByte, int, int, bool) bool { return false }
func (fixedLimit) loss(time.Time, *Exchange)                           {}
func (fixedLimit) drainReserve(*Config, int, int) bool                 { return false }
func (fixedLimit) settleDrain(*Config, int)                            {}
func (fixedLimit) state(*Config, time.Time) (bool, *AdaptiveState)     { return false, nil }

// newPolicy returns the policy of a lane made under cfg at now.
func newPolicy(cfg *Config, now time.Time) limitPolicy {
	p := fixedLimit{}.reconfigured(cfg, now)
	if cfg.ColdStart {
		p = &coldStart{until: now.Add(ColdStartMax), inner: p}
	}
	return p
}

// The lane's side: each asks or tells its policy (l.limit).

// adaptLocked gives the lane the policy cfg asks for. It is called on the
// paths that act (grants, reports, reloads), never on those that only
// read.
func (l *lane) adaptLocked(cfg *Config) {
	if _, fixed := l.limit.(fixedLimit); fixed && cfg.Adaptive == nil {
		return // the common case, without a call
	}
	l.limit = l.limit.reconfigured(cfg, l.lim.clock.Now())
}

// effLocked returns the settings lane l decides with (limitPolicy's
// effective).
func (l *lane) effLocked(cfg *Config) *Config {
	if _, fixed := l.limit.(fixedLimit); fixed {
		return cfg
	}
	return l.limit.effective(cfg)
}

// heldLocked tells the policy the slots held, after a grant or a release.
func (l *lane) heldLocked(interactive bool) {
	if _, fixed := l.limit.(fixedLimit); !fixed {
		l.limit.held(l.lim.clock, l.slots.inflight, interactive)
	}
}

// settleDrainLocked ends the reserve kept while calls drain (see
// Adaptive) once the non-interactive calls hold no more than the limit
// leaves them. It runs where grants are decided, just before, so that the
// checks themselves change nothing.
func (l *lane) settleDrainLocked(cfg *Config) {
	if _, fixed := l.limit.(fixedLimit); !fixed {
		l.limit.settleDrain(cfg, l.slots.others)
	}
}

// drainReserveLocked reports whether an interactive call may take a slot
// the limit does not have (see Adaptive).
func (l *lane) drainReserveLocked(cfg *Config) bool {
	if _, fixed := l.limit.(fixedLimit); fixed {
		return false
	}
	return l.limit.drainReserve(cfg, l.slots.inflight, l.slots.others)
}

// warmLocked tells the policy the lane has heard from its gateway: a cold
// lane grants up to its limit from now.
func (l *lane) warmLocked() {
	before := l.limit
	if l.limit = l.limit.answered(); l.limit != before && l.q.n > 0 {
		l.dispatchLocked(l.lim.clock.Now())
	}
}
