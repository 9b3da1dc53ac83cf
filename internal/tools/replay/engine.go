package replay

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// engine is a discrete-event simulation in virtual time around real
// limiters. Everything the replay models (clients, the gateway, polls) is an
// event in one heap, run one at a time on the engine's goroutine; the
// limiters run on the engine's fake clock, so aging, queue timeouts, the
// 60 s saturation dwell and the 5-minute windows happen exactly as they
// would in real time. Nothing depends on how fast the machine is: the
// same inputs give the same run.
//
// A limiter's Acquire blocks, so each acquisition runs on its own
// goroutine; the engine waits until that goroutine has either returned or
// joined the queue before it goes on. A queued acquisition ends only when
// the engine releases a slot or advances the clock past a queue timeout;
// after each such step the engine collects every acquisition that ended
// (as many as left the queues) and hands them their results in the order
// they began, so the order of goroutine wake-ups never shows.
type engine struct {
	clock *limitertest.Clock
	t0    time.Time
	q     events
	seq   uint64
	lims  []*limiter.Limiter

	notes   chan note
	stash   []note               // results that arrived while the engine awaited another
	waiting map[uint64]func(res) // queued acquisitions, by id
	nextID  uint64
	dirty   bool // a slot was released or a timer ran since the last settle
}

type res struct {
	slot limiter.Slot
	err  error
}

type note struct {
	id       uint64
	enqueued bool
	res
}

type idKey struct{}

// epoch is the simulation's time zero; any fixed instant would do.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newEngine() *engine {
	return &engine{clock: limitertest.NewClock(epoch), t0: epoch, notes: make(chan note, 64), waiting: map[uint64]func(res){}}
}

// now is the simulated time since the start.
func (e *engine) now() time.Duration { return e.clock.Now().Sub(e.t0) }

// at schedules f at simulated time t (not before now); events at the same
// time run in the order they were scheduled.
func (e *engine) at(t time.Duration, f func()) {
	heap.Push(&e.q, &event{at: max(t, e.now()), seq: e.seq, f: f})
	e.seq++
}

func (e *engine) after(d time.Duration, f func()) { e.at(e.now()+d, f) }

// newLimiter makes a limiter on the engine's clock.
func (e *engine) newLimiter(cfg limiter.Config, opts ...limiter.Option) (*limiter.Limiter, error) {
	opts = append(opts, limiter.WithClock(e.clock), limiter.WithObserver(func(ctx context.Context, ev limiter.Event) {
		if ev.Kind != limiter.Enqueued {
			return
		}
		if id, ok := ctx.Value(idKey{}).(uint64); ok {
			e.notes <- note{id: id, enqueued: true}
		}
	}))
	l, err := limiter.New(cfg, opts...)
	if err == nil {
		e.lims = append(e.lims, l)
	}
	return l, err
}

// acquire asks lim for a slot in lane key for a call of class p that
// arrived at arrival, and calls done with the result: at once (as the next
// event) for an immediate answer, later for a queued call.
// A call estimated at cost tokens (0: none) carries the estimate.
func (e *engine) acquire(lim *limiter.Limiter, key string, p limiter.Priority, tenant string, cost int64, arrival time.Duration, done func(res)) {
	id := e.nextID
	e.nextID++
	ctx := limiter.WithArrival(limiter.WithPriority(context.Background(), p), e.t0.Add(arrival))
	if tenant != "" {
		ctx = limiter.WithTenant(ctx, tenant)
	}
	if cost > 0 {
		ctx = limiter.WithTokens(ctx, cost)
	}
	ctx = context.WithValue(ctx, idKey{}, id)
	go func() {
		s, err := lim.Acquire(ctx, key)
		e.notes <- note{id: id, res: res{s, err}}
	}()
	for {
		n := <-e.notes
		if n.id != id {
			e.stash = append(e.stash, n)
			continue
		}
		if n.enqueued {
			e.waiting[id] = done
		} else {
			e.after(0, func() { done(n.res) })
		}
		return
	}
}

// release gives a slot back; the waiters it wakes are collected by settle.
func (e *engine) release(s limiter.Slot) {
	s.Release()
	e.dirty = true
}

func (e *engine) queued() int {
	n := 0
	for _, l := range e.lims {
		for _, ln := range l.Snapshot().Lanes {
			n += ln.Queued
		}
	}
	return n
}

// settle collects the acquisitions that left the queues, and runs their
// callbacks in the order the acquisitions began. A callback that releases a
// slot may end more waits: settle goes on until none has.
func (e *engine) settle() {
	for e.dirty && len(e.waiting) > 0 {
		e.dirty = false
		ended := len(e.waiting) - e.queued()
		var batch []note
		for len(batch) < ended {
			var n note
			if len(e.stash) > 0 {
				n, e.stash = e.stash[0], e.stash[1:]
			} else {
				n = <-e.notes
			}
			batch = append(batch, n)
		}
		slices.SortFunc(batch, func(a, b note) int { return int(a.id) - int(b.id) })
		for _, n := range batch {
			done := e.waiting[n.id]
			delete(e.waiting, n.id)
			done(n.res)
		}
	}
	e.dirty = false
}

// run runs events until none is left and no call waits in a queue. The
// limiters' own timers (queue timeouts, window steps) run in time order
// between the events.
func (e *engine) run() {
	for len(e.q) > 0 || len(e.waiting) > 0 {
		due, ok := e.clock.NextDue()
		if ok && (len(e.q) == 0 || due.Sub(e.t0) <= e.q[0].at) {
			e.clock.Advance(max(0, due.Sub(e.clock.Now())))
			e.dirty = true
			e.settle()
			continue
		}
		if len(e.q) == 0 {
			panic("replay: calls wait in a queue with no timer to end them")
		}
		ev := heap.Pop(&e.q).(*event)
		e.clock.Advance(ev.at - e.now())
		ev.f()
		e.settle()
	}
}

type event struct {
	at  time.Duration
	seq uint64
	f   func()
}

// events is a min-heap by time, then by scheduling order.
type events []*event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *events) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
