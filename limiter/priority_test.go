package limiter_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

func TestParsePriority(t *testing.T) {
	for _, p := range []limiter.Priority{limiter.Interactive, limiter.Default, limiter.Bulk} {
		got, err := limiter.ParsePriority(p.String())
		if err != nil || got != p {
			t.Fatalf("ParsePriority(%q) = %v, %v", p, got, err)
		}
	}
	for _, name := range []string{"Interactive", "BULK", "Default"} { // any case, as HTTP headers are written
		if _, err := limiter.ParsePriority(name); err != nil {
			t.Fatalf("ParsePriority(%q): %v", name, err)
		}
	}
	for _, bad := range []string{"", "urgent", " bulk", "interactive!"} {
		_, err := limiter.ParsePriority(bad)
		if !errors.Is(err, limiter.ErrUnknownPriority) || !strings.Contains(err.Error(), "interactive, default, bulk") {
			t.Fatalf("ParsePriority(%q) err %v", bad, err)
		}
	}
	var zero limiter.Priority
	if zero != limiter.Default {
		t.Fatal("zero value is not Default")
	}
	if s := limiter.Priority(7).String(); s != "Priority(7)" {
		t.Fatalf("String of a bad value = %q", s)
	}
}

func TestPriorityText(t *testing.T) {
	var v struct{ P limiter.Priority }
	if err := json.Unmarshal([]byte(`{"P":"bulk"}`), &v); err != nil || v.P != limiter.Bulk {
		t.Fatalf("unmarshal: %v %v", v.P, err)
	}
	if err := json.Unmarshal([]byte(`{"P":"urgent"}`), &v); !errors.Is(err, limiter.ErrUnknownPriority) {
		t.Fatalf("unmarshal bad: %v", err)
	}
	b, err := json.Marshal(struct{ P limiter.Priority }{limiter.Interactive})
	if err != nil || string(b) != `{"P":"interactive"}` {
		t.Fatalf("marshal: %s %v", b, err)
	}
	if _, err := json.Marshal(struct{ P limiter.Priority }{9}); err == nil {
		t.Fatal("marshal of a bad value succeeded")
	}
}

func TestPriorityContext(t *testing.T) {
	ctx := context.Background()
	if limiter.PriorityFrom(ctx) != limiter.Default {
		t.Fatal("untagged context is not Default")
	}
	ctx = limiter.WithPriority(ctx, limiter.Bulk)
	child, cancel := context.WithTimeout(ctx, time.Hour) // inherited by derived contexts
	defer cancel()
	if limiter.PriorityFrom(child) != limiter.Bulk {
		t.Fatal("derived context lost the class")
	}
	if limiter.PriorityFrom(limiter.WithPriority(ctx, 42)) != limiter.Default {
		t.Fatal("a bad class is not read as Default")
	}
	if _, ok := limiter.ArrivalFrom(ctx); ok {
		t.Fatal("arrival without WithArrival")
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got, ok := limiter.ArrivalFrom(limiter.WithArrival(ctx, at)); !ok || !got.Equal(at) {
		t.Fatalf("ArrivalFrom = %v %v", got, ok)
	}
}

// A class set on a context reaches calls made on goroutines started with it.
func TestPriorityInheritedByGoroutines(t *testing.T) {
	h := newHarness(t, cfgN(1))
	held := h.take(gw, "holder", limiter.Default)
	ctx := limiter.WithPriority(context.Background(), limiter.Interactive)
	h.queue(context.Background(), gw, "bulk", limiter.Bulk)
	got := make(chan error, 1)
	sub := context.WithValue(ctx, callID{}, "subagent")
	go func() { // a subagent's goroutine inherits the interactive class
		s, err := h.lim.Acquire(sub, gw)
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	if id := <-h.enqueued; id != "subagent" {
		t.Fatalf("enqueued %s", id)
	}
	if q := h.lane(gw).QueuedByPriority; q.Interactive != 1 {
		t.Fatalf("queued %+v, want the subagent counted as interactive", q)
	}
	held.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	s := h.expectGrant("bulk")
	s.Release()
}
