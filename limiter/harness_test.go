package limiter_test

import (
	"context"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// t0 is where every fake clock starts; it is aligned to the 10 s stats step.
var t0 = time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)

type callID struct{}

// result is how one Acquire ended.
type result struct {
	id   string
	slot limiter.Slot
	err  error
}

// harness drives a limiter on a fake clock. Calls run on their own
// goroutines; the harness learns that a call joined the queue from the
// observer, and how it ended from results, so tests can go step by step.
// tb is what the harness needs of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

type harness struct {
	t        tb
	clock    *limitertest.Clock
	lim      *limiter.Limiter
	enqueued chan string
	results  chan result
	onEvent  atomic.Pointer[func(ctx context.Context, e limiter.Event)] // extra observer, optional
}

func newHarness(t tb, cfg limiter.Config, opts ...limiter.Option) *harness {
	t.Helper()
	h := &harness{
		t:        t,
		clock:    limitertest.NewClock(t0),
		enqueued: make(chan string, 1024),
		results:  make(chan result, 1024),
	}
	obs := func(ctx context.Context, e limiter.Event) {
		if f := h.onEvent.Load(); f != nil {
			(*f)(ctx, e)
		}
		if e.Kind == limiter.Enqueued {
			if id, ok := ctx.Value(callID{}).(string); ok {
				h.enqueued <- id
			}
		}
	}
	opts = append([]limiter.Option{limiter.WithClock(h.clock), limiter.WithObserver(obs)}, opts...)
	lim, err := limiter.New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.lim = lim
	return h
}

func cfgN(n int) limiter.Config {
	c := limiter.DefaultConfig()
	c.MaxInflight = n
	return c
}

// call starts an Acquire on lane as id with class p and returns once it has
// either been granted at once (granted true) or joined the queue.
func (h *harness) call(ctx context.Context, lane, id string, p limiter.Priority) (granted bool, r result) {
	h.t.Helper()
	ctx = context.WithValue(limiter.WithPriority(ctx, p), callID{}, id)
	done := make(chan result, 1)
	go func() {
		s, err := h.lim.Acquire(ctx, lane)
		done <- result{id: id, slot: s, err: err}
	}()
	select {
	case got := <-h.enqueued:
		if got != id {
			h.t.Fatalf("call %s: saw %s enqueue instead", id, got)
		}
		go func() { h.results <- <-done }()
		return false, result{}
	case r := <-done:
		return true, r
	}
}

// queue starts a call that must wait.
func (h *harness) queue(ctx context.Context, lane, id string, p limiter.Priority) {
	h.t.Helper()
	if granted, r := h.call(ctx, lane, id, p); granted {
		h.t.Fatalf("call %s: granted at once (err %v), want it queued", id, r.err)
	}
}

// take starts a call that must get a slot at once and returns the slot.
func (h *harness) take(lane, id string, p limiter.Priority) *limiter.Slot {
	h.t.Helper()
	granted, r := h.call(context.Background(), lane, id, p)
	if !granted || r.err != nil {
		h.t.Fatalf("call %s: granted %v err %v, want an immediate slot", id, granted, r.err)
	}
	return &r.slot
}

// next waits for the next call to end.
func (h *harness) next() result {
	h.t.Helper()
	select {
	case r := <-h.results:
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatalf("no call ended")
		return result{}
	}
}

// expectGrant waits for the next call to end and checks it was id, granted.
func (h *harness) expectGrant(id string) *limiter.Slot {
	h.t.Helper()
	r := h.next()
	if r.id != id || r.err != nil {
		h.t.Fatalf("next ended: %s (err %v), want %s granted", r.id, r.err, id)
	}
	return &r.slot
}

// expectEnds waits for len(want) calls to end, in any order (calls woken
// together finish in no fixed order), and checks each against want: "ok"
// for a grant, otherwise a substring of the error. It returns the slots.
func (h *harness) expectEnds(want map[string]string) map[string]*limiter.Slot {
	h.t.Helper()
	slots := map[string]*limiter.Slot{}
	var got []string
	for range want {
		r := h.next()
		got = append(got, r.id)
		w, ok := want[r.id]
		switch {
		case !ok:
			h.t.Fatalf("call %s ended (err %v), want one of %v", r.id, r.err, want)
		case w == "ok" && r.err != nil:
			h.t.Fatalf("call %s: err %v, want a slot", r.id, r.err)
		case w != "ok" && (r.err == nil || !strings.Contains(r.err.Error(), w)):
			h.t.Fatalf("call %s: err %v, want %q", r.id, r.err, w)
		}
		if r.err == nil {
			slots[r.id] = &r.slot
		}
	}
	sort.Strings(got)
	if len(slots)+countErrs(want) != len(want) {
		h.t.Fatalf("ended %v, want %v", got, want)
	}
	return slots
}

func countErrs(want map[string]string) int {
	n := 0
	for _, w := range want {
		if w != "ok" {
			n++
		}
	}
	return n
}

// lane returns the snapshot of one lane.
func (h *harness) lane(key string) limiter.LaneSnapshot {
	h.t.Helper()
	for _, l := range h.lim.Snapshot().Lanes {
		if l.Lane == key {
			return l
		}
	}
	h.t.Fatalf("no lane %q in snapshot", key)
	return limiter.LaneSnapshot{}
}

// expectCounts checks a lane's inflight and queue.
func (h *harness) expectCounts(key string, inflight, queued int) {
	h.t.Helper()
	if l := h.lane(key); l.Inflight != inflight || l.Queued != queued {
		h.t.Fatalf("lane %s: inflight %d queued %d, want %d and %d", key, l.Inflight, l.Queued, inflight, queued)
	}
}

// noneEnded checks that no call has ended. Use it after the lane's state
// says nothing was granted, to catch a call that ended anyway.
func (h *harness) noneEnded() {
	h.t.Helper()
	select {
	case r := <-h.results:
		h.t.Fatalf("call %s ended (err %v), want none", r.id, r.err)
	default:
	}
}
