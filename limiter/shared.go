package limiter

// The shared path: an acquisition with a Backend (backend.go is the
// contract), which decides in its store while the lane here counts this
// process's share and keeps the statistics.

import (
	"context"
	"errors"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// acquireShared is Acquire with a backend: the backend decides; the lane
// here counts this process's share and keeps the statistics.
func (l *Limiter) acquireShared(ctx context.Context, key string, cfg *Config, c *call) (Slot, error) {
	p := c.prio
	ln, err := l.openLane(ctx, key, cfg, p)
	if err != nil {
		return Slot{}, err
	}
	start := l.clock.Now()
	arrival := c.arrivedBy(start)
	maxWait, cause := c.maxWait(ctx, cfg, start)
	t := ln.tenantLocked(cfg, c.tenant)
	cost, open := ln.estimateLocked(cfg, c.tokens)
	if err := tooLarge(cfg, key, cost); err != nil {
		ln.mu.Unlock()
		return Slot{}, err
	}
	ln.slots.waiting[p.Index()]++
	t.queued++
	ln.touchLocked(start)
	ln.adaptLocked(l.cfg.Load())
	// An adaptive limit is this process's (see Adaptive). A copy: the
	// call goes on with it once the lane's lock is let go.
	eff := *ln.effLocked(l.cfg.Load())
	cfg = &eff
	ln.mu.Unlock()
	place := 0
	// Shutdown ends the backend's wait too, and so does an answer the
	// estimate gives early (answeredEarly).
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(l.down, func() { cancel(nil) })()
	r := Request{Lane: key, Priority: p, Tenant: t.name, Arrival: arrival, Config: *cfg, Tokens: cost}
	if cause == CauseDeadline {
		r.MaxWait = maxWait
		if maxWait == 0 {
			r.MaxWait = -1 // one look at the lane, then the answer
		}
	}
	r.Queued = func(pos int) {
		place = pos
		l.emit(ctx, Event{Kind: Enqueued, Lane: key, Priority: p, Tenant: t.label, Position: pos})
		if cause == CauseDeadline && cfg.Deadline == AnswerEarly && ln.sharedWaitOver(cfg, p, pos-1, maxWait) {
			cancel(errAnsweredEarly)
		}
	}
	lease, err := l.backend.Acquire(bctx, r)
	if err != nil && ctx.Err() == nil && l.closed.Load() {
		err = ErrShuttingDown
	}
	if err != nil && ctx.Err() == nil && context.Cause(bctx) == errAnsweredEarly {
		err, cause = &BackendQueueTimeout{Position: place, Queued: place, Ahead: [3]int{place - 1, place - 1, place - 1}}, CauseEstimate
	}
	now := l.clock.Now()
	waited := now.Sub(start)
	if place == 0 {
		waited = 0 // granted without queueing: the round trip is not a wait
	}
	e := Event{Lane: key, Priority: p, Tenant: t.label, Wait: waited, Position: place}
	ln.mu.Lock()
	ln.slots.waiting[p.Index()]--
	t.queued--
	ln.touchLocked(now)
	var s Slot
	switch {
	case err == nil:
		h := ln.takeLocked(cfg, p, t, 0)
		h.lease, h.open = lease, open
		s = Slot{h: h, gen: h.gen, lost: lease.Lost()}
		if place == 0 {
			ln.stats.Advance(now)
			ln.stats.Zero()
		} else {
			ln.stats.Wait(now, waited)
			ln.stats.QueuedGrant()
		}
		e.Kind = Acquired
	case errors.Is(err, ErrQueueTimeout):
		switch cause {
		case CauseDeadline:
			ln.stats.Sample(now, waited)
			ln.stats.GiveUp(now, stats.Deadline, p.Index())
		case CauseEstimate:
			ln.stats.GiveUp(now, stats.Deadline, p.Index())
		default:
			ln.stats.Timeout(now, waited)
		}
		qe := &QueueTimeoutError{Lane: key, Priority: p, Cause: cause, Waited: waited, Position: place, Queued: place, Limit: cfg.MaxInflight, QueueTimeout: cfg.queueTimeout()}
		ahead := 0
		var st *BackendQueueTimeout
		if errors.As(err, &st) {
			qe.Position, qe.Queued, ahead = st.Position, st.Queued, st.Ahead[p.Index()]
		}
		qe.RetryAfter = ln.retryAfterLocked(cfg, p, now, ahead)
		err, e.Position = qe, qe.Position
		e.Kind, e.Cause = TimedOut, cause
	case errors.Is(err, ErrShuttingDown), errors.Is(err, ErrLaneUnavailable):
		e.Kind = Refused
	default:
		e.Kind = Canceled
		if place > 0 {
			ln.stats.GiveUp(now, stats.CallerGone, p.Index())
		}
	}
	ln.mu.Unlock()
	l.emit(ctx, e)
	return s, err
}

// errAnsweredEarly ends a shared wait whose estimate is longer than the
// time left before the call's deadline.
var errAnsweredEarly = errors.New("limiter: answered early")

// sharedWaitOver reports whether a shared lane estimates the wait of a
// call of class p with ahead calls before it longer than left: from the
// mean hold time of this process's calls (a fair sample of the lane's);
// false with none to go by.
func (l *lane) sharedWaitOver(cfg *Config, p Priority, ahead int, left time.Duration) bool {
	now := l.lim.clock.Now()
	l.mu.Lock()
	v := l.stats.At(now)
	rate, ok := v.HoldRate(max(1, capFor(cfg, p)))
	l.mu.Unlock()
	return ok && float64(ahead+1)/rate > left.Seconds()
}

// forgetTimeout bounds how long a reload waits for a Backend to forget the
// provider's word.
const forgetTimeout = 2 * time.Second
