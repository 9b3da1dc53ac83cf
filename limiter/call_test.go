package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// The four facts of a call travel together in one context value: each
// With function keeps what an outer one set, an inner one replaces its
// own fact only, and a context derived from another (a goroutine's, a
// timeout's) inherits them all.
func TestCallFactsLayer(t *testing.T) {
	at := time.Unix(1000, 0)
	ctx := limiter.WithPriority(context.Background(), limiter.Bulk)
	ctx = limiter.WithTenant(ctx, "board-a")
	ctx = limiter.WithArrival(ctx, at)
	ctx = limiter.WithTokens(ctx, 700)
	inner, cancel := context.WithTimeout(limiter.WithPriority(ctx, limiter.Interactive), time.Hour)
	defer cancel()
	check := func(name string, ctx context.Context, p limiter.Priority, tenant string, tokens int64) {
		t.Helper()
		got, ok := limiter.ArrivalFrom(ctx)
		if limiter.PriorityFrom(ctx) != p || limiter.TenantFrom(ctx) != tenant || limiter.TokensFrom(ctx) != tokens || !ok || !got.Equal(at) {
			t.Fatalf("%s: class %v tenant %q tokens %d arrival %v %v; want %v %q %d %v", name,
				limiter.PriorityFrom(ctx), limiter.TenantFrom(ctx), limiter.TokensFrom(ctx), got, ok, p, tenant, tokens, at)
		}
	}
	check("outer", ctx, limiter.Bulk, "board-a", 700)
	check("inner", inner, limiter.Interactive, "board-a", 700)
	check("open output", limiter.WithOpenOutput(inner, 100, 4000), limiter.Interactive, "board-a", 4100)
	check("tokens after open output", limiter.WithTokens(limiter.WithOpenOutput(inner, 100, 4000), 9), limiter.Interactive, "board-a", 9)
	check("outer unchanged", ctx, limiter.Bulk, "board-a", 700)

	// None set: Default, no tenant, no estimate, no arrival.
	bare := context.Background()
	if _, ok := limiter.ArrivalFrom(bare); ok || limiter.PriorityFrom(bare) != limiter.Default || limiter.TenantFrom(bare) != "" || limiter.TokensFrom(bare) != 0 {
		t.Fatal("a bare context carries facts")
	}
	// A value that is not a class reads as Default, and keeps the rest.
	odd := limiter.WithPriority(ctx, limiter.Priority(42))
	check("not a class", odd, limiter.Default, "board-a", 700)
}
