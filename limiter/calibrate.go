package limiter

import (
	"math"
	"time"
)

// Calibration: a call's estimate is what its caller's body says (its
// prompt, plus its max_tokens), and a caller can say anything: a tenant
// whose calls ask for max_tokens 1 and use 50,000 tokens would take the
// lane's whole budget in a few calls, every one granted at a few tokens.
// So a lane remembers, per tenant, how far its calls' use has lately run
// past their estimates, and raises the tenant's next estimates by as much
// (docs/DESIGN.md, "Estimates that learn"):
//
//   - After each settlement the tenant's ratio is the largest of its calls'
//     use over their estimate (as the caller's body gave it, before any
//     raise), fading back to 1 with a half-life of overHalfLife.
//   - A call's estimate is multiplied by its tenant's ratio. A newcomer (a
//     tenant not yet granted a call) has no record of its own, so it is
//     estimated by the newcomers' record, kept the same way from the calls
//     that were their tenant's first: a caller that changes its name per
//     call is caught as one that keeps it, and honest newcomers pay only
//     while some newcomer has lately lied.
//   - A raised estimate is at most the lane's smallest budget: a raise never
//     makes a call too large to be granted; it makes it wait for a whole
//     budget at most. A lane with no budget and no provider limit raises
//     nothing (there is nothing to keep).
//   - A call the lane raised does not hold the line while the budgets have
//     no room for it (dispatchLocked): the others' calls go on, so that a
//     liar cannot make everyone wait for the room its own lies need.
//
// Honest calls use less than their estimates (max_tokens bounds the
// output), so their ratio stays 1 and their estimates are as they were.

// overHalfLife is how fast a record of under-estimates fades: a tenant
// whose one call ran long is estimated as before within minutes.
const overHalfLife = time.Minute

// over is a ratio of use to estimate, at least 1, as of at (ns).
type over struct {
	r  float64
	at int64
}

// at returns the ratio faded to now (ns).
func (o over) now(now int64) float64 {
	if o.r <= 1 {
		return 1
	}
	return 1 + (o.r-1)*math.Exp2(-float64(now-o.at)/float64(overHalfLife))
}

// note takes a call's ratio r at now.
func (o *over) note(r float64, now int64) {
	o.r, o.at = max(r, o.now(now)), now
}

// calibrateLocked returns cost, the estimate of tenant t's call as its
// caller gave it, raised by how far the tenant's calls (or the lane's, for
// a tenant with none settled) have lately used more than their estimates,
// at most the lane's smallest budget.
//
//go:noinline
func (l *lane) calibrateLocked(cfg *Config, t *tenant, cost int64) int64 {
	tk := l.tok
	fresh := &l.tenants.fresh
	if cost <= 0 || tk == nil || t.over.r <= 1 && (t.joined || fresh.r <= 1) {
		return cost // none of the tenant's calls has run past its estimate
	}
	ceiling := l.smallestBudgetLocked(cfg)
	if ceiling == 0 || cost >= ceiling {
		return cost
	}
	now := l.nowNS()
	f := t.over.now(now)
	if !t.joined {
		f = max(f, fresh.now(now))
	}
	if f <= 1 {
		return cost
	}
	return min(ceiling, int64(math.Ceil(float64(cost)*f)))
}

// smallestBudgetLocked returns the smallest of the lane's budgets and the
// provider's last announced limit, or 0 with none: the most a raise may
// make a call.
func (l *lane) smallestBudgetLocked(cfg *Config) int64 {
	var provLimit int64
	if l.tok != nil && l.tok.provLimit > 0 {
		provLimit = l.tok.announcedLimitLocked(l.nowNS())
	}
	ceiling := int64(0)
	for _, b := range []int64{cfg.TokensPerMinute, cfg.MaxInflightTokens, provLimit} {
		if b > 0 && (ceiling == 0 || b < ceiling) {
			ceiling = b
		}
	}
	return ceiling
}

// learnLocked notes that h's call, estimated at base tokens (before any
// raise), used used: in its tenant's record, and if it was the tenant's
// first grant, in the newcomers'.
func (l *lane) learnLocked(h *hold, used int64) {
	if h.base <= 0 || l.tok == nil {
		return
	}
	r, now := float64(used)/float64(h.base), l.nowNS()
	h.t.over.note(r, now)
	if h.fresh {
		l.tenants.fresh.note(r, now)
	}
}
