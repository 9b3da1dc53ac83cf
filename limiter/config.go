package limiter

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// DefaultQueueTimeout is the longest one acquisition waits when
// Config.QueueTimeout is zero.
const DefaultQueueTimeout = 300 * time.Second

// ColdStartMax is the longest a lane stays cold (Config.ColdStart) when it
// hears nothing from its gateway: long enough for a slow first answer's
// first byte, short beside the 300 s a hung call may take to time out.
const ColdStartMax = 30 * time.Second

// agingStep is how long a waiter waits before its class rises one step.
// It is a constant, not a setting (docs/DESIGN.md, "Semantics of a lane").
const agingStep = 60 * time.Second

// saturationAfter is how long queued > 0 must hold for a lane to count as
// saturated in the snapshot.
const saturationAfter = 60 * time.Second

// Config is the limiter's configuration. Every lane gets the same settings.
// The zero value turns the limiter off; DefaultConfig returns the documented
// defaults (off, 300 s queue timeout, one reserved interactive slot).
type Config struct {
	// MaxInflight is the most calls one lane lets through at once.
	// 0 turns the limiter off: Acquire returns at once and creates no lane.
	MaxInflight int

	// QueueTimeout bounds how long one acquisition waits for a slot; 0 means
	// DefaultQueueTimeout. A call's deadline can shorten a wait, never
	// lengthen it (see WithDeadline).
	QueueTimeout time.Duration

	// Deadline says what a lane does with a call whose deadline it can
	// foresee missing (see WithDeadline): AnswerEarly, the default, answers
	// it at once; WaitForDeadline queues it until its deadline all the same.
	Deadline DeadlinePolicy

	// DeadlineMargin is how long before a call's deadline its wait ends, so
	// that the answer reaches the caller before the caller gives up; 0
	// means DefaultDeadlineMargin.
	DeadlineMargin time.Duration

	// InteractiveReserve is counted against non-interactive holders: calls
	// whose own class is not Interactive may hold at most MaxInflight minus
	// this many slots at once; Interactive calls may take any free slot. It
	// is clamped to MaxInflight-1 (and never below 0), so other work always
	// has at least one slot.
	InteractiveReserve int

	// MaxLanes bounds how many lanes the limiter keeps at once: an
	// acquisition that would create one more fails with a *LaneLimitError
	// (errors.Is ErrLaneLimit). Lane keys often carry a client's choice (a
	// model name), and every lane costs memory and metric series. 0 means
	// no bound.
	MaxLanes int

	// LaneIdleTTL is how long a lane with no call in flight, none queued
	// and no activity is kept before it is forgotten, with its statistics
	// (observers see an Evicted event, so metrics can drop its series). A
	// lane is evicted between LaneIdleTTL and LaneIdleTTL plus a minute
	// (plus LaneIdleTTL, when that is under a minute) after its last
	// activity; a later call simply creates it again. 0 keeps lanes as
	// long as the limiter.
	LaneIdleTTL time.Duration

	// Fairness sets how each lane is shared between the tenants of its
	// calls (see WithTenant and Fairness); nil means no weights, no cap
	// per tenant and no bound on tenants. A pointer, as Adaptive is, so
	// that a Config stays comparable.
	Fairness *Fairness

	// TokensPerMinute, if above 0, is each lane's budget of tokens per
	// minute: a token bucket of this many tokens that refills
	// continuously, at this many per minute. A call is granted only when
	// the bucket holds its estimate (see WithTokens); the estimate is taken
	// at the grant and the difference to what the call used is settled
	// when it ends (Slot.Settle). A call that does not fit waits in the
	// queue, in the lane's order; one estimated above the whole budget is
	// refused at once (*TokenBudgetError).
	TokensPerMinute int64

	// MaxInflightTokens, if above 0, bounds the estimates of each lane's
	// calls in flight (a self-hosted server slows with the tokens it
	// holds), beside MaxInflight. A call always fits an empty lane.
	MaxInflightTokens int64

	// ColdStart makes every new lane grant one call at a time until it
	// has heard from its gateway: the first answer's rate-limit headers
	// (RecordLimits), its first byte (RecordFirstByte) or the end of an
	// exchange that got an answer (RecordExchange with a Status),
	// whichever comes first, and at the latest ColdStartMax after the lane
	// was made: a call that ends without an answer (its caller gave up,
	// the connection failed) tells the lane nothing, and a first call
	// that hangs keeps it at one call for no longer. A lane that follows the
	// provider's headers with no budget otherwise sends its first
	// MaxInflight calls blind, and those past the provider's minute are
	// answered 429. It costs each new lane one answer's first byte. With
	// a Backend it is refused (the lane is new to every process at a
	// different time).
	ColdStart bool

	// ProviderWindow is the window over which the provider refills the
	// budgets its rate-limit headers announce (RecordLimits): a reset it
	// announces is taken as at most this long, and a budget it announced
	// refills by at least its whole limit per window, so that no header,
	// however far its reset, holds a lane's grants longer. 0 means
	// DefaultProviderWindow (60 s, OpenAI's and Anthropic's minute); at most
	// MaxProviderWindow.
	ProviderWindow time.Duration

	// Adaptive, when set, makes each lane's limit move between
	// Adaptive.MinInflight and MaxInflight (see Adaptive). nil: MaxInflight
	// is the limit.
	Adaptive *Adaptive
}

// Fairness is how a lane shares its slots between tenants. Within one
// effective class (aging and the reserve apply first, unchanged), the next
// slot goes to the tenant that has received the least service: the
// slot-time its calls held, divided by its weight; within a tenant, first
// come first served. A tenant that starts waiting is raised to the least
// service of those waiting, so idleness banks no credit. With one tenant
// (calls that name none are all DefaultTenant's) the order is exactly
// class, then arrival.
type Fairness struct {
	// Weights gives tenants other than 1 their weight: a tenant of
	// weight 2 gets twice the slot-time of one of weight 1 while both
	// wait. Each weight must be above 0.
	Weights map[string]float64
	// MaxInflightPerTenant, if above 0, is the most slots one tenant holds
	// in a lane at once, even with no one else waiting.
	MaxInflightPerTenant int
	// MaxTenants bounds the tenants a lane tracks by name (besides
	// DefaultTenant); the calls of any more share OtherTenant. Tenant
	// names come from callers and each costs memory and metric series.
	// 0 means no bound. A name tracked keeps its place for the lane's life.
	MaxTenants int
}

// Defaults of DefaultConfig.
const (
	DefaultMaxLanes    = 1000
	DefaultLaneIdleTTL = time.Hour
	DefaultMaxTenants  = 100
)

// DefaultConfig returns the documented defaults: MaxInflight 0 (off),
// QueueTimeout 300 s, InteractiveReserve 1, MaxLanes 1000, LaneIdleTTL 1 h,
// Fairness.MaxTenants 100.
func DefaultConfig() Config {
	return Config{QueueTimeout: DefaultQueueTimeout, InteractiveReserve: 1, MaxLanes: DefaultMaxLanes, LaneIdleTTL: DefaultLaneIdleTTL,
		Fairness: &Fairness{MaxTenants: DefaultMaxTenants}}
}

// Validate reports every setting that is out of range, each a
// *SettingError.
func (c Config) Validate() error {
	var errs []error
	bad := func(setting, format string, args ...any) {
		errs = append(errs, &SettingError{Setting: setting, Problem: fmt.Sprintf(format, args...)})
	}
	if c.MaxInflight < 0 {
		bad("max_inflight", "is %d: want 0 (off) or more", c.MaxInflight)
	}
	if c.QueueTimeout < 0 {
		bad("queue_timeout", "is %s: want 0 (the default, %s) or more", c.QueueTimeout, DefaultQueueTimeout)
	}
	if c.Deadline != AnswerEarly && c.Deadline != WaitForDeadline {
		bad("deadline", "is %d: want AnswerEarly or WaitForDeadline", c.Deadline)
	}
	if c.DeadlineMargin < 0 || c.DeadlineMargin > maxDeadlineMargin {
		bad("deadline_margin", "is %s: want 0 (the default, %s) to %s", c.DeadlineMargin, DefaultDeadlineMargin, maxDeadlineMargin)
	}
	if c.InteractiveReserve < 0 {
		bad("interactive_reserve", "is %d: want 0 or more", c.InteractiveReserve)
	}
	if c.MaxLanes < 0 {
		bad("max_lanes", "is %d: want 0 (no bound) or more", c.MaxLanes)
	}
	if c.LaneIdleTTL < 0 {
		bad("lane_idle_ttl", "is %s: want 0 (keep lanes) or more", c.LaneIdleTTL)
	}
	if c.TokensPerMinute < 0 {
		bad("tokens_per_minute", "is %d: want 0 (no budget) or more", c.TokensPerMinute)
	}
	if c.MaxInflightTokens < 0 {
		bad("max_inflight_tokens", "is %d: want 0 (no bound) or more", c.MaxInflightTokens)
	}
	if c.ProviderWindow < 0 || c.ProviderWindow > MaxProviderWindow {
		bad("provider_window", "is %s: want 0 (the default, %s) to %s", c.ProviderWindow, DefaultProviderWindow, MaxProviderWindow)
	}
	f := c.fairness()
	if f.MaxInflightPerTenant < 0 {
		bad("fairness.max_inflight_per_tenant", "is %d: want 0 (no cap) or more", f.MaxInflightPerTenant)
	}
	if f.MaxTenants < 0 {
		bad("fairness.max_tenants", "is %d: want 0 (no bound) or more", f.MaxTenants)
	}
	for _, name := range slices.Sorted(maps.Keys(f.Weights)) {
		if err := ValidTenant(name); err != nil {
			bad("fairness.weights", "names %q: %v", name, strings.TrimPrefix(err.Error(), "limiter: "))
		} else if w := f.Weights[name]; !validWeight(w) {
			bad("fairness.weights."+name, "is %v: want a number above 0", w)
		}
	}
	// An adaptive limit with MaxInflight 0 is allowed: the limiter is off,
	// and the settings apply once a reload turns it back on.
	if a := c.Adaptive; a != nil {
		if a.MinInflight < 1 || (c.MaxInflight > 0 && a.MinInflight > c.MaxInflight) {
			bad("adaptive.min_inflight", "is %d: want 1 to max_inflight (%d), the ceiling", a.MinInflight, c.MaxInflight)
		}
		if a.Initial != 0 && (a.Initial < a.MinInflight || (c.MaxInflight > 0 && a.Initial > c.MaxInflight)) {
			bad("adaptive.initial", "is %d: want 0 (min_inflight) or min_inflight to max_inflight", a.Initial)
		}
	}
	return errors.Join(errs...)
}

// ValidateFor reports what Validate does, and the settings a lane kept by
// the Backend b cannot have: a token budget with a Backend that keeps none
// (its budgets must be decided in its store, with the slot), and a cold
// start with any Backend (a shared lane is new to each process at a
// different time). b nil is no Backend, and ValidateFor is Validate. b is
// only asked what it keeps (TokenBackend), never used, so a nil pointer of
// a Backend's type will do before one exists. New, SetConfig and
// lanes-exporter's configuration run this one rule.
func (c Config) ValidateFor(b Backend) error {
	errs := []error{c.Validate()}
	if b != nil {
		if tb, ok := b.(TokenBackend); c.budgeted() && !(ok && tb.KeepsTokenBudgets()) {
			errs = append(errs, &SettingError{Setting: "tokens_per_minute", Problem: "is set with a Backend that keeps no token budgets (not a TokenBackend); unset tokens_per_minute and max_inflight_tokens"})
		}
		if c.ColdStart {
			errs = append(errs, &SettingError{Setting: "cold_start", Problem: "is set with a Backend (shared lanes): a shared lane is new to each process at a different time; unset cold_start"})
		}
	}
	return errors.Join(errs...)
}

// fairness returns the fairness settings, the zero ones for nil.
func (c *Config) fairness() *Fairness {
	if c.Fairness == nil {
		return &Fairness{}
	}
	return c.Fairness
}

// Reserve returns the reserve in force: InteractiveReserve clamped to
// [0, MaxInflight-1].
func (c Config) Reserve() int {
	return max(0, min(c.InteractiveReserve, c.MaxInflight-1))
}

// sweepEvery is how often lanes are checked for idleness.
func (c Config) sweepEvery() time.Duration { return min(c.LaneIdleTTL, time.Minute) }

func (c Config) queueTimeout() time.Duration {
	if c.QueueTimeout == 0 {
		return DefaultQueueTimeout
	}
	return c.QueueTimeout
}
