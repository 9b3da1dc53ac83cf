package limiter

import (
	"context"
	"sync"
	"time"
)

// lane is the slots and queue of one (endpoint, model). Every grant decision,
// the reserve check included, is made under mu, so a slot can never be given
// twice or lost between the check and the grant.
type lane struct {
	lim *Limiter
	key string

	mu       sync.Mutex
	inflight int
	q        queue
	seq      uint64
	since    time.Time // when the queue last became non-empty
	stats    window
	// fresh is true while stats.cur is known to be the current step, so an
	// immediate grant can count itself there without reading the clock
	// (reading it costs more than the rest of the fast path). A timer on the
	// limiter's clock clears it at the step's end.
	fresh bool
}

func newLane(lim *Limiter, key string) *lane {
	return &lane{lim: lim, key: key, stats: window{origin: lim.origin}}
}

// fits reports whether a call of class p may take a slot now, with no one
// waiting ahead of it.
func (l *lane) fits(cfg *Config, p Priority) bool {
	if cfg.MaxInflight == 0 {
		return true
	}
	free := cfg.MaxInflight - l.inflight
	return free > cfg.Reserve() || (free > 0 && p == Interactive)
}

// next returns the waiter to grant a slot to at now, or nil when none may
// have one: with a reserved slot as the only free one, only a waiter whose
// own class is Interactive qualifies, however long others have aged.
func (l *lane) next(cfg *Config, now time.Time) *waiter {
	if cfg.MaxInflight == 0 {
		return l.q.best(now)
	}
	free := cfg.MaxInflight - l.inflight
	switch {
	case free <= 0:
		return nil
	case free > cfg.Reserve():
		return l.q.best(now)
	default:
		return l.q.classes[Interactive.index()].head()
	}
}

// dispatch grants slots to waiters while any may have one.
func (l *lane) dispatch(now time.Time) {
	cfg := l.lim.cfg.Load()
	for l.q.n > 0 {
		w := l.next(cfg, now)
		if w == nil {
			return
		}
		l.dequeue(w)
		l.inflight++
		w.state = granted
		w.waited = now.Sub(w.enqueued)
		l.stats.recordWait(now, w.waited)
		close(w.ready)
	}
}

func (l *lane) enqueue(w *waiter) {
	if l.q.n == 0 {
		l.since = w.enqueued
	}
	l.q.push(w)
}

func (l *lane) dequeue(w *waiter) {
	l.q.remove(w)
	if l.q.n == 0 {
		l.since = time.Time{}
	}
}

// grantNow takes a slot for a call that fits with no one ahead of it, and
// counts its zero wait. Called with mu held.
func (l *lane) grantNow() {
	l.inflight++
	if !l.fresh {
		now := l.lim.clock.Now()
		l.stats.advance(now)
		l.fresh = true
		l.lim.clock.AfterFunc(l.stats.nextBoundary().Sub(now), l.stepEnded)
	}
	l.stats.recordZero()
}

func (l *lane) stepEnded() {
	l.mu.Lock()
	l.fresh = false
	l.mu.Unlock()
}

// wait queues a call of class p and blocks until it is granted, times out,
// or its context ends. Called with mu held; returns with it released.
func (l *lane) wait(ctx context.Context, cfg *Config, p Priority) (Slot, error) {
	lim := l.lim
	now := lim.clock.Now()
	w := &waiter{prio: p, arrival: now, enqueued: now, seq: l.seq, ready: make(chan struct{})}
	l.seq++
	if a, ok := ArrivalFrom(ctx); ok && a.Before(now) {
		w.arrival = a
	}
	w.at = int64(w.arrival.Sub(lim.origin))
	l.enqueue(w)
	w.place = l.q.placeOf(p)
	// A newcomer can be served at once: an interactive call may take a
	// reserved slot that the queued bulk work may not, and a retry that
	// carries an early arrival may rank first.
	l.dispatch(now)
	if w.state == granted {
		l.mu.Unlock()
		lim.emit(ctx, Event{Kind: Acquired, Lane: l.key, Priority: p})
		return Slot{l: l}, nil
	}
	// Arm the timeout before anyone can learn that w is queued, so that the
	// wait is bounded from the moment it is visible.
	t := lim.clock.AfterFunc(cfg.queueTimeout(), func() { l.expire(w) })
	l.mu.Unlock()
	lim.emit(ctx, Event{Kind: Enqueued, Lane: l.key, Priority: p, Position: w.place})

	select {
	case <-w.ready:
	case <-ctx.Done():
		l.mu.Lock()
		if w.state == waiting {
			l.dequeue(w)
			w.state = canceled
			w.waited = lim.clock.Now().Sub(w.enqueued)
		}
		l.mu.Unlock()
	}
	t.Stop()

	e := Event{Lane: l.key, Priority: p, Wait: w.waited, Position: w.place}
	switch w.state {
	case granted:
		e.Kind = Acquired
		lim.emit(ctx, e)
		s := Slot{l: l}
		if err := ctx.Err(); err != nil {
			// The grant raced the cancellation: hand the slot on.
			s.Release()
			return Slot{}, err
		}
		return s, nil
	case timedOut:
		e.Kind, e.Position = TimedOut, w.err.(*QueueTimeoutError).Position
		lim.emit(ctx, e)
		return Slot{}, w.err
	default:
		e.Kind = Canceled
		lim.emit(ctx, e)
		return Slot{}, ctx.Err()
	}
}

// expire ends w's wait with a queue timeout, unless it already ended.
func (l *lane) expire(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.state != waiting {
		return
	}
	now := l.lim.clock.Now()
	cfg := l.lim.cfg.Load()
	e := &QueueTimeoutError{
		Lane:         l.key,
		Priority:     w.prio,
		Waited:       now.Sub(w.enqueued),
		Position:     l.q.position(w, now),
		Queued:       l.q.n,
		Limit:        cfg.MaxInflight,
		QueueTimeout: cfg.queueTimeout(),
	}
	l.dequeue(w)
	l.stats.recordTimeout(now)
	w.state, w.waited, w.err = timedOut, e.Waited, e
	close(w.ready)
	// Removing a waiter frees no slot, so no one else can be granted now.
}

// release gives back one slot and grants it on.
func (l *lane) release() {
	l.mu.Lock()
	l.inflight--
	if l.q.n > 0 {
		l.dispatch(l.lim.clock.Now())
	}
	l.mu.Unlock()
	l.lim.emit(context.Background(), Event{Kind: Released, Lane: l.key})
}

// snapshot reports the lane at now. Called with mu held.
func (l *lane) snapshot(cfg *Config, now time.Time) LaneSnapshot {
	s := LaneSnapshot{
		Lane:     l.key,
		Limit:    cfg.MaxInflight,
		Reserve:  cfg.Reserve(),
		Inflight: l.inflight,
		Queued:   l.q.n,
		QueuedByPriority: QueuedByPriority{
			Interactive: len(l.q.classes[Interactive.index()]),
			Default:     len(l.q.classes[Default.index()]),
			Bulk:        len(l.q.classes[Bulk.index()]),
		},
	}
	if l.q.oldest != nil {
		s.OldestWait = seconds(now.Sub(l.q.oldest.enqueued).Seconds())
		s.Saturated = now.Sub(l.since) >= saturationAfter
	}
	l.stats.advance(now)
	if p50, p90, ok := l.stats.percentiles(); ok {
		a, b := seconds(p50), seconds(p90)
		s.WaitP50, s.WaitP90 = &a, &b
	}
	s.QueueTimeouts5m = int(l.stats.timeouts)
	s.Upstream = l.stats.upstreamCounts()
	return s
}
