package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

func coldCfg(n int) limiter.Config {
	c := cfgN(n)
	c.ColdStart = true
	return c
}

// A cold lane grants one call, whatever its class, until the first
// answer's headers: then the provider's word bounds the calls that waited
// blind, and the rest of the slots open.
func TestColdStartHeaders(t *testing.T) {
	h := newHarness(t, coldCfg(5))
	first := h.take("L", "first", limiter.Bulk)
	h.queue(costing(400), "L", "b", limiter.Default)
	h.queue(costing(400), "L", "c", limiter.Default)
	h.queue(costing(400), "L", "i", limiter.Interactive)
	if l := h.lane("L"); !l.ColdStart || l.Limit != 1 || l.Inflight != 1 || l.Queued != 3 {
		t.Fatalf("cold lane: cold_start %v limit %d inflight %d queued %d, want true, 1, 1, 3", l.ColdStart, l.Limit, l.Inflight, l.Queued)
	}
	h.noneEnded()
	// The first answer says 900 tokens remain: two of the three fit, the
	// interactive call and the earlier default one.
	h.lim.RecordLimits(context.Background(), "L", limiter.ProviderLimits{
		Tokens: limiter.ProviderBudget{Known: true, Limit: 10_000, Remaining: 900, Reset: time.Minute}})
	slots := h.expectEnds(map[string]string{"i": "ok", "b": "ok"})
	i, b := slots["i"], slots["b"]
	h.noneEnded()
	if l := h.lane("L"); l.ColdStart || l.Limit != 5 || l.Inflight != 3 {
		t.Fatalf("after the headers: cold_start %v limit %d inflight %d, want false, 5, 3", l.ColdStart, l.Limit, l.Inflight)
	}
	for _, s := range []*limiter.Slot{first, i, b} {
		s.Release()
	}
	h.noneEnded() // c waits for the provider's tokens, not for a slot
	if w := h.lane("L").Tokens.WaitingFor["default"]; w != limiter.WaitProvider {
		t.Fatalf("c waits for %q, want %q", w, limiter.WaitProvider)
	}
	h.lim.Shutdown()
	h.expectEnds(map[string]string{"c": "shutting down"})
}

// Without rate-limit headers, the first byte of an answer warms the lane;
// so does the end of an exchange that got an answer (an error with no
// body), but not a call that ended without one (its caller gave up).
func TestColdStartFirstByteOrEnd(t *testing.T) {
	h := newHarness(t, coldCfg(3))
	a := h.take("A", "a", limiter.Default)
	h.queue(context.Background(), "A", "a2", limiter.Default)
	h.queue(context.Background(), "A", "a3", limiter.Interactive)
	h.noneEnded()
	h.lim.RecordFirstByte(context.Background(), "A", limiter.FirstByte{Sent: h.clock.Now(), After: time.Second})
	slots := h.expectEnds(map[string]string{"a2": "ok", "a3": "ok"})

	n := h.take("N", "n", limiter.Default)
	h.queue(context.Background(), "N", "n2", limiter.Default)
	h.noneEnded()
	n.Release() // given up: no answer
	n2 := h.expectGrant("n2")
	h.queue(context.Background(), "N", "n3", limiter.Interactive) // still cold: one at a time
	h.noneEnded()
	h.lim.RecordExchange(context.Background(), "N", limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 500})
	n3 := h.expectGrant("n3") // an answer, if an error: warm
	n4 := h.take("N", "n4", limiter.Interactive)

	for _, s := range []*limiter.Slot{a, slots["a2"], slots["a3"], n2, n3, n4} {
		s.Release()
	}
	// A lane made later starts cold again.
	h.take("Z", "z", limiter.Default)
	h.queue(context.Background(), "Z", "z2", limiter.Default)
	h.lim.Shutdown()
	h.expectEnds(map[string]string{"z2": "shutting down"})
}

// A reload that turns the cold start off warms the cold lanes at once;
// one that turns it on leaves the lanes that exist warm.
func TestColdStartReload(t *testing.T) {
	h := newHarness(t, coldCfg(2))
	a := h.take("L", "a", limiter.Default)
	h.queue(context.Background(), "L", "b", limiter.Interactive)
	if err := h.lim.SetConfig(cfgN(2)); err != nil {
		t.Fatal(err)
	}
	b := h.expectGrant("b")
	if err := h.lim.SetConfig(coldCfg(2)); err != nil {
		t.Fatal(err)
	}
	a.Release()
	b.Release()
	x, y := h.take("L", "x", limiter.Default), h.take("L", "y", limiter.Interactive)
	x.Release()
	y.Release()
}

// A cold start is refused with a Backend, at New and at a reload.
func TestColdStartNotWithBackend(t *testing.T) {
	var se *limiter.SettingError
	if _, err := limiter.New(coldCfg(2), limiter.WithBackend(nopBackend{})); !errors.As(err, &se) || se.Setting != "cold_start" {
		t.Fatalf("New with a backend and a cold start: %v, want a SettingError for cold_start", err)
	}
	lim, err := limiter.New(cfgN(2), limiter.WithBackend(nopBackend{}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Shutdown()
	if err := lim.SetConfig(coldCfg(2)); !errors.As(err, &se) || se.Setting != "cold_start" {
		t.Fatalf("SetConfig with a cold start: %v, want a SettingError for cold_start", err)
	}
}

// A cold lane that hears nothing (its first call hangs) warms ColdStartMax
// after it was made, and grants what waited; not a moment before. On the
// fake clock.
func TestColdStartHungFirstCall(t *testing.T) {
	h := newHarness(t, coldCfg(3))
	a := h.take("A", "a", limiter.Default)
	h.clock.Advance(10 * time.Second)
	h.queue(context.Background(), "A", "a2", limiter.Default)
	h.clock.Advance(limiter.ColdStartMax - 10*time.Second - time.Millisecond)
	h.noneEnded()
	if !h.lane("A").ColdStart {
		t.Fatal("warm before ColdStartMax")
	}
	h.clock.Advance(time.Millisecond)
	a2 := h.expectGrant("a2")
	a3 := h.take("A", "a3", limiter.Interactive) // warm: its limit of 3
	if l := h.lane("A"); l.ColdStart || l.Limit != 3 {
		t.Fatalf("after ColdStartMax: cold_start %v, limit %d; want warm at 3", l.ColdStart, l.Limit)
	}
	for _, s := range []*limiter.Slot{a, a2, a3} {
		s.Release()
	}
}
