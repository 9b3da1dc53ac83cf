package limiter

import (
	"context"
	"time"
)

// A call is what the limiter knows of one model call, read from its
// context once, as Acquire starts, in this file: its class (WithPriority),
// its logical arrival (WithArrival), its tenant (WithTenant), its token
// estimate (WithTokens, WithOpenOutput) and its deadline (WithDeadline). Every later step, in this process
// or on a Backend, takes the call, never the context.
//
// The With functions keep the facts together, in one context value
// of type *call that each of them copies and changes: a lookup walks the
// context's chain of values (a proxied request's holds a dozen), and
// Acquire makes one, not five.
type call struct {
	prio    Priority  // as given: see read
	arrival time.Time // when given (arrived): see arrivedBy
	arrived bool
	tenant  string // "": DefaultTenant
	// tokens is the context's estimate: an int64 (WithTokens), an
	// *openOutput (WithOpenOutput) or nil (see estimateOf).
	tokens   any
	deadline time.Time // zero: none given (see maxWait)
}

type callKey struct{}

// callOf returns the call that ctx carries, or nil.
func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// read sets c to the call that ctx carries; a class that is not one reads
// as Default.
func (c *call) read(ctx context.Context) {
	if f := callOf(ctx); f != nil {
		*c = *f
	} else {
		*c = call{}
	}
	if !c.prio.valid() {
		c.prio = Default
	}
}

// with returns a context that carries ctx's call changed by set.
func with(ctx context.Context, set func(*call)) context.Context {
	c := new(call)
	if f := callOf(ctx); f != nil {
		*c = *f
	}
	set(c)
	return context.WithValue(ctx, callKey{}, c)
}

// arrivedBy returns the call's logical arrival, at most now: a call with
// no arrival given, or one in the future, arrives now.
func (c *call) arrivedBy(now time.Time) time.Time {
	if c.arrived && c.arrival.Before(now) {
		return c.arrival
	}
	return now
}

// WithPriority returns a context whose model calls run in class p.
// Goroutines started with the returned context inherit the class.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return with(ctx, func(c *call) { c.prio = p })
}

// PriorityFrom returns the class carried by ctx: Default when ctx carries
// none, or carries a value that is not a class.
func PriorityFrom(ctx context.Context) Priority {
	if c := callOf(ctx); c != nil && c.prio.valid() {
		return c.prio
	}
	return Default
}

// WithArrival returns a context that carries the logical arrival time t of a
// call. A retry or reconnect that acquires again under this context keeps
// its place for aging and for first-come-first-served ordering, instead of
// starting over at the back of its class. An arrival in the future counts as
// now.
func WithArrival(ctx context.Context, t time.Time) context.Context {
	return with(ctx, func(c *call) { c.arrival, c.arrived = t, true })
}

// ArrivalFrom returns the logical arrival time carried by ctx, if any.
func ArrivalFrom(ctx context.Context) (time.Time, bool) {
	if c := callOf(ctx); c != nil {
		return c.arrival, c.arrived
	}
	return time.Time{}, false
}

// WithTenant returns a context whose model calls are tenant name's: within
// a class, a lane shares its slots fairly between tenants (see Fairness).
// Goroutines started with the returned context inherit the tenant. The
// empty name is DefaultTenant.
func WithTenant(ctx context.Context, name string) context.Context {
	return with(ctx, func(c *call) { c.tenant = name })
}

// TenantFrom returns the tenant carried by ctx, or "" when it carries none.
func TenantFrom(ctx context.Context) string {
	if c := callOf(ctx); c != nil {
		return c.tenant
	}
	return ""
}

// WithTokens returns a context whose model call is estimated to cost n
// tokens: its prompt plus the most it may write (package lanehttp
// estimates it from the request's body). A lane with a token budget grants
// the call only when the budget has room for n (see Config.TokensPerMinute);
// Slot.Settle later replaces the estimate with what the call used. n of 0
// or less carries no estimate.
func WithTokens(ctx context.Context, n int64) context.Context {
	return with(ctx, func(c *call) { c.tokens = n })
}

// TokensFrom returns the estimate carried by ctx (see WithTokens,
// WithOpenOutput), or 0.
func TokensFrom(ctx context.Context) int64 {
	if c := callOf(ctx); c != nil {
		n, _ := estimateOf(c.tokens)
		return n
	}
	return 0
}

// estimateOf reads a call's tokens: an estimate (WithTokens), or an open
// output (WithOpenOutput), whose estimate before learning is its prompt
// plus its fallback.
func estimateOf(v any) (int64, *openOutput) {
	switch v := v.(type) {
	case int64:
		return max(v, 0), nil
	case *openOutput:
		return addSat(v.prompt, v.fallback), v
	}
	return 0, nil
}

type openOutput struct{ prompt, fallback int64 }

// WithOpenOutput returns a context whose model call names no output bound:
// it is estimated at prompt tokens plus what its lane has learned such
// calls write, or fallback (a default output bound) until the lane has
// learned it. It replaces an estimate WithTokens set, and is replaced by
// one it sets; TokensFrom reads prompt plus fallback.
func WithOpenOutput(ctx context.Context, prompt, fallback int64) context.Context {
	o := &openOutput{max(prompt, 0), max(fallback, 0)}
	return with(ctx, func(c *call) { c.tokens = o })
}
