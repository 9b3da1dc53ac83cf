package limiter

import (
	"context"
	"time"
)

// A call is what the limiter knows of one model call, read from its
// context once, as Acquire starts, in this file: its class (WithPriority),
// its logical arrival (WithArrival), its tenant (WithTenant) and its token
// estimate (WithTokens, WithOpenOutput). Every later step, in this process
// or on a Backend, takes the call, never the context.
type call struct {
	prio    Priority
	arrival time.Time // when given (arrived): see arrivedBy
	arrived bool
	tenant  string // "": DefaultTenant
	// tokens is the context's estimate: an int64 (WithTokens), an
	// *openOutput (WithOpenOutput) or nil (see estimateOf).
	tokens any
}

// read sets c to the call that ctx carries.
func (c *call) read(ctx context.Context) {
	c.prio, c.tenant, c.tokens = PriorityFrom(ctx), TenantFrom(ctx), ctx.Value(tokensKey{})
	c.arrival, c.arrived = ArrivalFrom(ctx)
}

// arrivedBy returns the call's logical arrival, at most now: a call with
// no arrival given, or one in the future, arrives now.
func (c *call) arrivedBy(now time.Time) time.Time {
	if c.arrived && c.arrival.Before(now) {
		return c.arrival
	}
	return now
}

type priorityKey struct{}
type arrivalKey struct{}

// WithPriority returns a context whose model calls run in class p.
// Goroutines started with the returned context inherit the class.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the class carried by ctx: Default when ctx carries
// none, or carries a value that is not a class.
func PriorityFrom(ctx context.Context) Priority {
	p, ok := ctx.Value(priorityKey{}).(Priority)
	if !ok || !p.valid() {
		return Default
	}
	return p
}

// WithArrival returns a context that carries the logical arrival time t of a
// call. A retry or reconnect that acquires again under this context keeps
// its place for aging and for first-come-first-served ordering, instead of
// starting over at the back of its class. An arrival in the future counts as
// now.
func WithArrival(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, arrivalKey{}, t)
}

// ArrivalFrom returns the logical arrival time carried by ctx, if any.
func ArrivalFrom(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(arrivalKey{}).(time.Time)
	return t, ok
}

type tenantKey struct{}

// WithTenant returns a context whose model calls are tenant name's: within
// a class, a lane shares its slots fairly between tenants (see Fairness).
// Goroutines started with the returned context inherit the tenant. The
// empty name is DefaultTenant.
func WithTenant(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, tenantKey{}, name)
}

// TenantFrom returns the tenant carried by ctx, or "" when it carries none.
func TenantFrom(ctx context.Context) string {
	s, _ := ctx.Value(tenantKey{}).(string)
	return s
}

type tokensKey struct{}

// WithTokens returns a context whose model call is estimated to cost n
// tokens: its prompt plus the most it may write (package lanehttp
// estimates it from the request's body). A lane with a token budget grants
// the call only when the budget has room for n (see Config.TokensPerMinute);
// Slot.Settle later replaces the estimate with what the call used. n of 0
// or less carries no estimate.
func WithTokens(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, tokensKey{}, n)
}

// TokensFrom returns the estimate carried by ctx (see WithTokens,
// WithOpenOutput), or 0.
func TokensFrom(ctx context.Context) int64 {
	n, _ := estimateOf(ctx.Value(tokensKey{}))
	return n
}

// estimateOf reads a value of tokensKey: an estimate (WithTokens), or an
// open output (WithOpenOutput), whose estimate before learning is its
// prompt plus its fallback. One key for both, so that an acquisition
// looks up one context value for its estimate, as before there were two.
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
	return context.WithValue(ctx, tokensKey{}, &openOutput{max(prompt, 0), max(fallback, 0)})
}
