package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// A call that names no output bound is estimated at its prompt plus its
// fallback until the lane has seen 8 such calls, then at its prompt plus
// the 90th percentile of their last 64 completions: above the fallback
// when they write long answers, below it when short ones, at most the
// budget less the prompt (never a call too large to be granted). A call
// that names its bound is estimated as it says, whatever the lane learned.
// On the fake clock, two hours apart: the calibration of a tenant's
// under-estimates (TestCalibration) has faded to nothing by each call.
func TestOpenOutputLearned(t *testing.T) {
	cfg := budgetCfg(4, 60_000, 0)
	cfg.LaneIdleTTL = 24 * time.Hour
	h := newHarness(t, cfg)
	open := func(id string, completion int64) int64 {
		t.Helper()
		h.clock.Advance(2 * time.Hour)
		granted, r := h.call(limiter.WithOpenOutput(context.Background(), 10, 1024), "L", id, limiter.Default)
		if !granted || r.err != nil {
			t.Fatalf("%s: granted %v, %v", id, granted, r.err)
		}
		n := h.lane("L").Tokens.Inflight
		r.slot.Settle(limiter.Usage{Prompt: 10, Completion: completion})
		r.slot.Release()
		return n
	}
	for i := range 7 {
		if n := open(fmt.Sprint("o", i), 5000); n != 1034 {
			t.Fatalf("open call %d, before the lane learned: estimated at %d, want 10 + 1,024", i, n)
		}
	}
	open("o7", 5000)
	if n := open("o8", 5000); n != 5010 {
		t.Fatalf("after 8 open calls of 5,000: estimated at %d, want 10 + 5,000", n)
	}
	s := h.takeCost("b", limiter.Default, 300)
	if n := h.lane("L").Tokens.Inflight; n != 300 {
		t.Fatalf("a call that names its bound: estimated at %d, want its own 300", n)
	}
	s.Release()
	// Short answers: the last 64 are 200 tokens, the estimate follows.
	for i := range 64 {
		open(fmt.Sprint("s", i), 200)
	}
	if n := open("s64", 200); n != 210 {
		t.Fatalf("after 64 open calls of 200: estimated at %d, want 10 + 200", n)
	}
	// One long answer in sixteen is past the 90th percentile's reach; one
	// in five is not.
	mixed := func(prefix string, every int) {
		for i := range 64 {
			c := int64(200)
			if i%every == 0 {
				c = 9000
			}
			open(fmt.Sprint(prefix, i), c)
		}
	}
	mixed("m", 16)
	if n := open("m64", 200); n != 210 {
		t.Fatalf("one long answer in sixteen: estimated at %d, want 10 + 200", n)
	}
	mixed("l", 5)
	if n := open("l64", 200); n != 9010 {
		t.Fatalf("one long answer in five: estimated at %d, want 10 + 9,000", n)
	}
}

// A learned bound is at most the smallest budget less the prompt.
func TestOpenOutputBounded(t *testing.T) {
	cfg := budgetCfg(4, 8_000, 0)
	cfg.LaneIdleTTL = 24 * time.Hour
	h := newHarness(t, cfg)
	for i := range 9 {
		h.clock.Advance(2 * time.Hour)
		granted, r := h.call(limiter.WithOpenOutput(context.Background(), 10, 1024), "L", fmt.Sprint("o", i), limiter.Default)
		if !granted || r.err != nil {
			t.Fatalf("o%d: granted %v, %v", i, granted, r.err)
		}
		n := h.lane("L").Tokens.Inflight
		if i == 8 && n != 8_000 {
			t.Fatalf("after 8 answers of 50,000 on a budget of 8,000: estimated at %d, want the budget", n)
		}
		r.slot.Settle(limiter.Usage{Prompt: 10, Completion: 50_000})
		r.slot.Release()
	}
}
