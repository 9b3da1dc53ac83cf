package telemetry_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/telemetry"
)

// TestDefsNameTheExposition checks the metric tables against a real
// scrape: every llm family /metrics has is a declared Def under the name
// PromName gives it (so docs/OBSERVABILITY.md, generated from the Defs,
// names what a scrape finds), and every Def is in the scrape of a lane
// with a named tenant, a token budget, tokens reported and a caller who
// gave up (the shared
// lanes' families aside: they need a Redis, and sharedlane's tests scrape
// them).
func TestDefsNameTheExposition(t *testing.T) {
	s := newStack(t, limiter.Config{MaxInflight: 2, QueueTimeout: 20 * time.Second, TokensPerMinute: 10000}, telemetry.Options{})
	ctx := limiter.WithTokens(limiter.WithTenant(context.Background(), "team-a"), 100)
	slot, err := s.lim.Acquire(ctx, lane)
	if err != nil {
		t.Fatal(err)
	}
	s.lim.RecordExchange(ctx, lane, limiter.Exchange{Outcome: limiter.OutcomeOK, Status: 200,
		Tokens: &limiter.ExchangeTokens{Estimate: 100, Used: limiter.Usage{Prompt: 60, Completion: 20}, FromUsage: true}})
	slot.Release()
	// A full lane, and a call whose deadline has passed: it gives up.
	full := make([]limiter.Slot, 2)
	for i := range full {
		if full[i], err = s.lim.Acquire(ctx, lane); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.lim.Acquire(limiter.WithDeadline(ctx, s.lim.Clock().Now()), lane); !errors.Is(err, limiter.ErrQueueTimeout) {
		t.Fatalf("a call past its deadline on a full lane: %v", err)
	}
	for _, f := range full {
		f.Release()
	}

	families, err := s.tel.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	scraped := map[string]bool{}
	for _, f := range families {
		if n := f.GetName(); strings.HasPrefix(n, telemetry.DefaultPrefix+"_llm_") {
			scraped[n] = true
		}
	}
	declared := map[string]otelbridge.Def{}
	for _, d := range append(otelbridge.Defs(), telemetry.Defs()...) {
		declared[d.PromName(telemetry.DefaultPrefix)] = d
	}
	var undeclared, missing []string
	for n := range scraped {
		if _, ok := declared[n]; !ok {
			undeclared = append(undeclared, n)
		}
	}
	for n, d := range declared {
		if !scraped[n] && !strings.HasPrefix(d.Name, "llm.shared.") {
			missing = append(missing, n)
		}
	}
	sort.Strings(undeclared)
	sort.Strings(missing)
	if len(undeclared) > 0 {
		t.Errorf("scraped but not declared (or declared under another name): %v", undeclared)
	}
	if len(missing) > 0 {
		t.Errorf("declared but not scraped: %v", missing)
	}
	if len(scraped) < 20 {
		t.Errorf("only %d llm families scraped", len(scraped))
	}
}
