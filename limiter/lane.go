package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// lane is the slots and queue of one (endpoint, model). Its parts each do
// one job: the slots held (slots, this file), the waiters in serving order
// (q, queue.go), the tenants' shares (tenants, tenant.go), the token
// budgets (tok, tokens.go), the waits' deadlines (deadlines, timer.go), the
// limit (limit, policy.go) and the statistics and activity (stats,
// activity).
type lane struct {
	lim *Limiter
	key string
	// usageWarned is set once a usage beyond what a call can cost was
	// logged (see warnUsage); atomic, for a shared lane's settlement,
	// which does not take the lock.
	usageWarned atomic.Bool

	// mu guards everything below it. Every grant decision, the reserve check
	// included, is made with mu held, so a slot can never be given twice or
	// lost between the check and the grant. Methods named ...Locked expect
	// it held. Lock order: Limiter.mu, then mu, then the clock's own; mu
	// is never held while an Observer, a Backend or a Lease is called.
	mu    sync.Mutex
	slots slots
	q     queue
	// tenants are the lane's tenants: the queue orders their calls by
	// their service (see queue and tenant).
	tenants tenants
	// tok is the lane's token accounting (see laneTokens); nil until a
	// call carries an estimate, a budget is set or the provider reports.
	tok       *laneTokens
	deadlines deadlines
	// limit is where the lane's limit comes from (see limitPolicy).
	limit    limitPolicy
	stats    stats.Window
	activity activity
}

// slots are a lane's slots held, and its calls waiting elsewhere.
type slots struct {
	inflight int
	// others counts the holders whose own class is not Interactive: the
	// reserve caps them (see fitsLocked), not the total.
	others int
	free   []*hold // released holds, reused so that a grant allocates nothing
	// held are the holds granted and not yet released, in no order (each
	// knows its index), and seq counts the lane's grants and answers: a
	// provider's count is judged by them (see missedLocked). The list is
	// kept only while the lane has token accounting (tok), so that a lane
	// that never hears from its provider pays nothing for it; a hold
	// granted before then is listed when its own answer reports.
	held []*hold
	seq  uint64
	// abandoned counts the holds whose callers left while their calls were
	// at the upstream (see Slot.Abandon).
	abandoned int
	// waiting counts, by class, this process's calls waiting in a Backend's
	// queue (the local queue q stays empty then).
	waiting [3]int
}

// deadlines end the waits that reach their deadline: one timer per lane,
// at the earliest deadline, rather than one per waiter (a runtime timer
// per waiter cost more than the rest of a contended hand-over). While
// every waiter was queued under the same timeout (uniform), deadlines are
// in enqueue order and the oldest waiter's is the earliest; after a reload
// changed the timeout, the queue is scanned until it empties.
type deadlines struct {
	timer   laneTimer
	timeout time.Duration // the queue timeout of the waiters, while uniform
	mixed   bool          // waiters queued under different timeouts
}

// activity is when a lane was busy and last active, for saturation, the
// statistics and idle eviction.
type activity struct {
	since  time.Time // when the queue last became non-empty: saturation
	busyAt time.Time // while the queue is non-empty: busy time counted up to here
	// touched is the stats step of the lane's last activity (a grant, a
	// release, a wait ending, an exchange), for idle eviction; reading the
	// snapshot is not activity.
	touched int64
	// evicted is set when the lane is forgotten; a call that found it just
	// before looks it up again.
	evicted bool
	// fresh is true while the statistics' current step is known to be the
	// current step, so an immediate grant can count itself there without
	// reading the clock. A timer on the limiter's clock clears it at the
	// step's end. It pays for itself: reading the clock costs more than the
	// rest of the fast path (docs/BENCHMARKS.md has the figures).
	fresh bool
}

// hold is one granted slot. A Slot is a handle on a hold plus the hold's
// generation at the grant; releasing bumps the generation, so a second
// release through a copy of the Slot no longer matches and does nothing.
// Holds are reused through the lane's free list. Guarded by the lane's mu.
type hold struct {
	lane  *lane
	gen   uint64
	prio  Priority // the holder's own class
	lease Lease    // the Backend's slot, with a backend
	t     *tenant  // whose call it is
	// timed is set when the grant was charged to the tenant's service, at
	// at (ns since the limiter's origin), with charge (see tenant).
	timed  bool
	at     int64
	charge float64
	// inTokens is set when charge is in tokens (see tenants.tokens).
	inTokens bool
	// est is what the call was estimated at (tokens); cost what it is
	// charged now: est until Settle, then what it used (settled).
	est, cost int64
	settled   bool
	// base is the call's estimate as its caller gave it, before
	// calibrateLocked raised it.
	base int64
	// fresh is set when the grant was its tenant's first: its use teaches
	// the newcomers' record (see calibrateLocked).
	fresh bool
	// open is set when the call named no output bound: its completion
	// teaches the lane's (see WithOpenOutput).
	open bool
	// idx is the hold's place in the lane's held (-1: not listed); grant
	// is the lane's seq when it was listed, answered its seq when the
	// call's answer reported the provider's headers (0: not yet).
	idx             int
	grant, answered uint64
	// abandoned is set when the caller left while the call was at the
	// upstream (Slot.Abandon).
	abandoned bool
}

func newLane(lim *Limiter, key string, cfg *Config) *lane {
	l := &lane{lim: lim, key: key, stats: stats.New(lim.origin), q: newQueue()}
	l.tenants.deflt = newTenant(DefaultTenant)
	l.tenants.est = initialSlotTime
	l.touchLocked(lim.clock.Now())
	l.limit = newPolicy(cfg, lim.clock.Now())
	return l
}

// touchLocked notes activity at now.
func (l *lane) touchLocked(now time.Time) {
	l.activity.touched = max(l.activity.touched, l.stats.StepOf(now))
}

// idleLocked reports whether the lane has had nothing in flight, nothing
// queued and no activity for ttl at now. Activity is known to the step
// (10 s), so the idle time counts from the end of the last active step.
func (l *lane) idleLocked(now time.Time, ttl time.Duration) bool {
	if l.slots.inflight > 0 || l.q.n > 0 || l.slots.waiting != [3]int{} {
		return false
	}
	return now.Sub(l.stats.StepEnd(l.activity.touched)) >= ttl
}

// refuseAllLocked ends every wait with ErrShuttingDown.
func (l *lane) refuseAllLocked(now time.Time) {
	for l.q.n > 0 {
		w := l.q.oldest
		l.dequeueLocked(w, now)
		w.waited, w.err = now.Sub(w.enqueued), ErrShuttingDown
		w.end(refused)
	}
}

// capFor returns how many slots calls of own class p may hold at once:
// every slot for Interactive, MaxInflight minus the reserve for the others.
// The reserve is counted against non-interactive holders, not against free
// slots, so non-interactive work always keeps at least one slot of its own
// and interactive calls may take any free slot (docs/DESIGN.md, "Semantics of a lane").
func capFor(cfg *Config, p Priority) int {
	if p == Interactive {
		return cfg.MaxInflight
	}
	return cfg.MaxInflight - cfg.Reserve()
}

// fitsLocked reports whether a call of own class p may take a slot now,
// queue aside.
func (l *lane) fitsLocked(cfg *Config, p Priority) bool {
	if cfg.MaxInflight == 0 {
		return true
	}
	if p == Interactive && l.drainReserveLocked(cfg) {
		return true
	}
	if l.slots.inflight >= cfg.MaxInflight {
		return false
	}
	return p == Interactive || l.slots.others < capFor(cfg, p)
}

// nextLocked returns the waiter to grant a slot to at now, or nil when none
// may have one. The best waiter in serving order wins if it fits; if it
// does not, only the non-interactive cap can be in its way, and then the
// first interactive waiter is the only one that fits. Aging changes the
// order, never the cap.
func (l *lane) nextLocked(cfg *Config, now int64) *waiter {
	if cfg.MaxInflight == 0 {
		return l.q.best(now)
	}
	if l.drainReserveLocked(cfg) {
		if w := l.q.interactive(); w != nil {
			return w
		}
	}
	if l.slots.inflight >= cfg.MaxInflight {
		return nil
	}
	if l.slots.others < capFor(cfg, Bulk) {
		return l.q.best(now)
	}
	return l.q.interactive()
}

// dispatchLocked grants slots to waiters while any may have one.
func (l *lane) dispatchLocked(now time.Time) {
	c := l.lim.cfg.Load()
	l.adaptLocked(c)
	cfg := l.effLocked(c)
	if l.q.n > 0 {
		l.touchLocked(now)
	}
	// skipped are the tenants set aside for this dispatch (see below);
	// newcomersOut is set once a newcomer's raised call was.
	var skipped []*tenant
	newcomersOut := false
	defer func() {
		for _, t := range skipped {
			l.q.unpark(t)
		}
	}()
	if at, ok := l.deadlines.timer.pendingLocked(); ok && !at.After(now) {
		l.expireDueLocked(now) // due, and not fired yet: see expireDueLocked
	}
	for l.q.n > 0 && !l.lim.closed.Load() {
		l.settleDrainLocked(cfg)
		w := l.nextLocked(cfg, l.ns(now))
		if w == nil {
			return
		}
		// Off (MaxInflight 0), a lane admits every waiter: no budget either.
		if l.tok != nil && cfg.MaxInflight > 0 && l.tok.binds(cfg) {
			if newcomersOut && !w.t.joined && !w.t.parked {
				// The newcomers' calls are one line for the budgets:
				// behind a raised one that does not fit, a later one
				// raised less (the record fades) waits too, as a
				// tenant's later calls wait behind its first.
				l.q.park(w.t)
				skipped = append(skipped, w.t)
				continue
			}
			// A waiter the budgets have no room for yet holds the line:
			// the order stays the lane's, and a large call is not passed
			// by small ones for ever.
			if ok, _, wake := l.tokensFitLocked(cfg, w.cost, l.ns(now)); !ok {
				if wake > 0 {
					l.wakeTokensLocked(wake)
				}
				if w.cost > w.base && !w.t.parked {
					// But not one the lane raised for its tenant's
					// under-estimates (calibrateLocked): the tenant's
					// calls are set aside for this dispatch, and the
					// others' go on, so that a liar cannot make everyone
					// wait for the room its own lies need.
					l.q.park(w.t)
					skipped = append(skipped, w.t)
					newcomersOut = newcomersOut || !w.t.joined
					continue
				}
				return
			}
		}
		l.dequeueLocked(w, now)
		w.hold = l.takeLocked(cfg, w.prio, w.t, w.cost)
		w.hold.base, w.hold.open = w.base, w.open
		w.gen = w.hold.gen
		w.waited = now.Sub(w.enqueued)
		l.stats.Wait(now, w.waited)
		l.stats.QueuedGrant()
		w.end(granted)
	}
}

// ns returns now in ns since the limiter's origin, as the queue keeps time.
func (l *lane) ns(now time.Time) int64 { return int64(now.Sub(l.lim.origin)) }

// takeLocked counts a new holder of class p, tenant t's call estimated at
// cost tokens, under cfg, and returns its hold.
func (l *lane) takeLocked(cfg *Config, p Priority, t *tenant, cost int64) *hold {
	l.slots.inflight++
	l.heldLocked(p == Interactive)
	if p != Interactive {
		l.slots.others++
	}
	var h *hold
	if n := len(l.slots.free); n > 0 {
		h, l.slots.free = l.slots.free[n-1], l.slots.free[:n-1]
	} else {
		h = &hold{lane: l}
	}
	h.prio = p
	h.idx, h.answered = -1, 0
	l.chargeLocked(cfg, t, h, cost)
	if l.tok != nil {
		l.listLocked(h)
		l.takeTokensLocked(h, cost)
	}
	return h
}

// listLocked adds h to the lane's held, granted now.
func (l *lane) listLocked(h *hold) {
	l.slots.seq++
	h.idx, h.grant = len(l.slots.held), l.slots.seq
	l.slots.held = append(l.slots.held, h)
}

// unlistLocked takes h, which is listed, out of the lane's held.
func (l *lane) unlistLocked(h *hold) {
	n := len(l.slots.held) - 1
	last := l.slots.held[n]
	l.slots.held[h.idx], last.idx = last, h.idx
	l.slots.held[n] = nil
	l.slots.held = l.slots.held[:n]
	h.idx = -1
}

// enqueueLocked queues w, whose wait ends at the latest timeout after
// w.enqueued, and makes sure the lane's timer will end it then.
func (l *lane) enqueueLocked(w *waiter, timeout time.Duration) {
	w.deadline = w.enqueued.Add(timeout)
	if l.q.n == 0 {
		l.activity.since, l.activity.busyAt = w.enqueued, w.enqueued
		l.deadlines.timeout, l.deadlines.mixed = timeout, false
	} else if timeout != l.deadlines.timeout {
		l.deadlines.mixed = true
	}
	if len(w.t.q[w.prio.Index()].classQueue) == 0 {
		l.liftLocked(l.lim.cfg.Load(), w.t, w.prio.Index(), w.cost)
	}
	l.q.push(w)
	at := w.deadline
	if warm, ok := l.limit.warmsAt(); ok && warm.Before(at) {
		at = warm // a cold lane's waiters are granted on when it warms
	}
	if pending, ok := l.deadlines.timer.pendingLocked(); !ok || at.Before(pending) {
		l.armLocked(at)
	}
}

func (l *lane) dequeueLocked(w *waiter, now time.Time) {
	l.q.remove(w)
	if l.q.n == 0 {
		l.stats.Busy(now, now.Sub(l.activity.busyAt))
		l.activity.since, l.activity.busyAt = time.Time{}, time.Time{}
		l.deadlines.timer.stopLocked()
	}
	// A waiter that leaves before its deadline leaves the timer as it is:
	// when it fires, it ends what is due and waits for the next deadline.
	// Re-arming at every grant would cost what the lane timer saves.
}

// armLocked sets the lane's timer to end the waits due at at.
func (l *lane) armLocked(at time.Time) { l.deadlines.timer.armLocked(l, at, l.expireDueTimedLocked) }

// expireDueTimedLocked is the lane timer's function: it ends the waits
// that are due (expireDueLocked). A waiter that leaves frees no slot, but
// the one first in line may have held the line for tokens: with budgets
// binding, the queue is looked at again.
func (l *lane) expireDueTimedLocked(now time.Time) {
	l.expireDueLocked(now)
	l.leftLocked(now)
}

// expireDueLocked ends every wait whose deadline has come by now, warms a
// cold lane whose ColdStartMax has passed, and arms the timer for what
// comes next. The timer's function runs it, and so does dispatchLocked
// when the timer is due but has not fired yet: at any instant the waits
// that have reached their deadline end before anyone is granted, whichever
// of the lane's timers fires first at that instant.
func (l *lane) expireDueLocked(now time.Time) {
	l.deadlines.timer.stopLocked()
	var next time.Time
	for w := l.q.oldest; w != nil; {
		after := w.next
		switch {
		case !w.deadline.After(now):
			l.expireLocked(w, now)
		case next.IsZero() || w.deadline.Before(next):
			next = w.deadline
			if !l.deadlines.mixed {
				after = nil // in enqueue order: the rest come later
			}
		}
		w = after
	}
	if warm, ok := l.limit.warmsAt(); ok {
		if !now.Before(warm) {
			l.warmLocked() // heard nothing in ColdStartMax: a hung first call
		} else if l.q.n > 0 && (next.IsZero() || warm.Before(next)) {
			next = warm
		}
	}
	if !next.IsZero() && l.q.n > 0 {
		l.armLocked(next)
	}
}

// leftLocked follows waiters' leaving the queue at now (a cancellation, a
// queue timeout). Leaving frees no slot, but the call first in line may
// have held the line because the token budgets had no room for it: the
// calls behind it may fit now (docs/DESIGN.md, "Token budgets"). It is out
// of line, for the waiting frame's sake (docs/DESIGN.md, "A queued call's
// stack").
//
//go:noinline
func (l *lane) leftLocked(now time.Time) {
	if l.q.n > 0 && l.tok != nil && l.tok.binds(l.lim.cfg.Load()) {
		l.dispatchLocked(now)
	}
}

// creditBusyLocked counts the time the queue has been non-empty up to now
// in the statistics, so that the service rate includes a busy spell still
// going on.
func (l *lane) creditBusyLocked(now time.Time) {
	if l.q.n > 0 && now.After(l.activity.busyAt) {
		l.stats.Busy(now, now.Sub(l.activity.busyAt))
		l.activity.busyAt = now
	}
}

// busyNowLocked is the time the queue has been non-empty up to now that the
// statistics do not hold yet: what a reading adds, changing nothing.
func (l *lane) busyNowLocked(now time.Time) time.Duration {
	if l.q.n > 0 && now.After(l.activity.busyAt) {
		return now.Sub(l.activity.busyAt)
	}
	return 0
}

// grantNowLocked takes a slot for a call that fits with no one ahead of it,
// and counts its zero wait.
func (l *lane) grantNowLocked(cfg *Config, p Priority, t *tenant, cost int64) *hold {
	h := l.takeLocked(cfg, p, t, cost)
	l.freshenLocked()
	l.stats.Zero()
	l.activity.touched = l.stats.Current()
	return h
}

// freshenLocked makes sure the statistics' current step is the current
// step, reading the clock only when the step may have ended since it last
// did.
func (l *lane) freshenLocked() {
	if !l.activity.fresh {
		now := l.lim.clock.Now()
		l.stats.Advance(now)
		l.activity.fresh = true
		l.lim.clock.AfterFunc(l.stats.StepEnd(l.stats.Current()).Sub(now), l.stepEnded)
	}
}

func (l *lane) stepEnded() {
	l.mu.Lock()
	l.activity.fresh = false
	l.mu.Unlock()
}

// waitLocked queues a call of class p and blocks until it is granted, times
// out, or its context ends. It is called with mu held and returns with it
// released: the lock must cover the enqueue and the first dispatch, and
// must not be held while the call blocks.
func (l *lane) waitLocked(ctx context.Context, cfg *Config, c *call, t *tenant, cost, base int64, open bool) (Slot, error) {
	p := c.prio
	if cost > 0 || l.tok != nil || cfg.budgeted() {
		if err := l.admitTokensLocked(cfg, cost); err != nil {
			l.mu.Unlock()
			return Slot{}, err
		}
	}
	lim := l.lim
	now := lim.clock.Now()
	w := lim.waiters.Get().(*waiter)
	defer lim.putWaiter(w)
	w.prio, w.t, w.cost, w.base, w.open, w.arrival, w.enqueued, w.seq = p, t, cost, base, open, c.arrivedBy(now), now, l.q.seq
	l.q.seq++
	w.at = int64(w.arrival.Sub(lim.origin))
	l.touchLocked(now)
	timeout, cause := c.maxWait(ctx, cfg, now)
	w.cause = cause
	l.enqueueLocked(w, max(timeout, time.Nanosecond)) // not due before dispatch has looked
	w.place = l.q.placeOf(p)
	// A newcomer can be served at once: an interactive call may take a
	// slot that the queued non-interactive work may not, and a retry that
	// carries an early arrival may rank first. Otherwise one whose
	// deadline has come, or is foreseen, is answered at once.
	l.dispatchLocked(now)
	if w.state == waiting && cause == CauseDeadline {
		l.answerEarlyLocked(cfg, w, timeout, now)
	}
	switch w.state {
	case granted:
		<-w.ready
		l.mu.Unlock()
		l.emitWait(ctx, Acquired, p, t.label, 0, 0)
		return Slot{h: w.hold, gen: w.gen}, nil
	case timedOut:
		<-w.ready
		l.mu.Unlock()
		l.emitTimedOut(ctx, w, t.label)
		return Slot{}, w.err
	}
	// The lane's timer bounds the wait from the moment w was queued, before
	// anyone could learn of it (enqueueLocked).
	l.mu.Unlock()
	l.emitWait(ctx, Enqueued, p, t.label, 0, w.place) // w is the lane's until its wait ends

	select {
	case <-w.ready:
	case <-ctx.Done():
		l.mu.Lock()
		if w.state == waiting {
			now := lim.clock.Now()
			l.touchLocked(now)
			l.dequeueLocked(w, now)
			w.state = canceled
			w.waited = now.Sub(w.enqueued)
			l.stats.GiveUp(now, stats.CallerGone, p.Index())
			l.leftLocked(now)
		} else {
			<-w.ready // it ended meanwhile: take the value it was sent
		}
		l.mu.Unlock()
	}

	switch w.state {
	case granted:
		l.emitWait(ctx, Acquired, p, t.label, w.waited, w.place)
		s := Slot{h: w.hold, gen: w.gen}
		if err := ctx.Err(); err != nil {
			// The grant raced the cancellation: hand the slot on.
			s.Release()
			return Slot{}, err
		}
		return s, nil
	case timedOut:
		l.emitTimedOut(ctx, w, t.label)
		return Slot{}, w.err
	case refused:
		l.emitWait(ctx, Refused, p, t.label, w.waited, w.place)
		return Slot{}, w.err
	default:
		l.emitWait(ctx, Canceled, p, t.label, w.waited, w.place)
		return Slot{}, ctx.Err()
	}
}

// answerEarlyLocked ends w's wait as it queues if its deadline is within
// the margin already (timeout 0), or, under AnswerEarly, if the lane
// estimates its wait above the time it has before its deadline. With no
// estimate (no recent grants to go by) w waits.
func (l *lane) answerEarlyLocked(cfg *Config, w *waiter, timeout time.Duration, now time.Time) {
	if timeout > 0 {
		if cfg.Deadline != AnswerEarly {
			return
		}
		v := l.stats.At(now)
		d, ok := waitFor(&v, l.busyNowLocked(now), cfg, w.prio, w.place-1)
		if !ok || d <= timeout {
			return
		}
		w.cause = CauseEstimate
	}
	l.expireLocked(w, now)
	l.leftLocked(now)
}

// emitTimedOut tells the observers of w's queue timeout. Out of line, as
// emitWait is.
//
//go:noinline
func (l *lane) emitTimedOut(ctx context.Context, w *waiter, tenant string) {
	e := w.err.(*QueueTimeoutError)
	ev := Event{Kind: TimedOut, Cause: e.Cause, Lane: l.key, Priority: w.prio, Tenant: tenant, Wait: w.waited, Position: e.Position}
	for _, o := range l.lim.observers {
		l.lim.tell(o, ctx, &ev)
	}
}

// emitWait tells the observers of an event of a wait. It is out of line,
// as emit is (docs/DESIGN.md, "A queued call's stack").
//
//go:noinline
func (l *lane) emitWait(ctx context.Context, kind EventKind, p Priority, tenant string, wait time.Duration, position int) {
	e := Event{Kind: kind, Lane: l.key, Priority: p, Tenant: tenant, Wait: wait, Position: position}
	for _, o := range l.lim.observers {
		l.lim.tell(o, ctx, &e)
	}
}

// expireLocked ends w's wait with a queue timeout. The whole wait is
// recorded as a wait sample: a lane that times its callers out must never
// look fast.
func (l *lane) expireLocked(w *waiter, now time.Time) {
	cfg := l.effLocked(l.lim.cfg.Load())
	e := &QueueTimeoutError{
		Lane:         l.key,
		Priority:     w.prio,
		Cause:        w.cause,
		Waited:       now.Sub(w.enqueued),
		Position:     l.q.position(w, l.ns(now)),
		Queued:       l.q.n,
		Limit:        cfg.MaxInflight,
		QueueTimeout: cfg.queueTimeout(),
	}
	l.creditBusyLocked(now)
	l.touchLocked(now)
	l.dequeueLocked(w, now)
	switch w.cause {
	case CauseQueueTimeout:
		l.stats.Timeout(now, e.Waited)
	case CauseDeadline: // a wait of at least this long
		l.stats.Sample(now, e.Waited)
		l.stats.GiveUp(now, stats.Deadline, w.prio.Index())
	default: // answered as it queued: no wait to count
		l.stats.GiveUp(now, stats.Deadline, w.prio.Index())
	}
	e.RetryAfter = l.retryAfterLocked(cfg, w.prio, now, l.q.aheadOf(l.ns(now))[w.prio.Index()])
	w.waited, w.err = e.Waited, e
	w.end(timedOut)
	// Removing a waiter frees no slot; expireDue looks at the queue again
	// if the waiter may have held the line for tokens (leftLocked).
}

// release gives back the slot of h at generation gen, unless that was
// done already, and grants it on.
func (l *lane) release(h *hold, gen uint64) {
	l.mu.Lock()
	if h.gen != gen {
		l.mu.Unlock()
		return // a second release through a copy of the Slot
	}
	p, lease := l.releaseLocked(h)
	l.mu.Unlock()
	if lease != nil {
		lease.Release()
	}
	l.lim.emit(context.Background(), Event{Kind: Released, Lane: l.key, Priority: p})
}

// releaseLocked gives back the slot of h, grants it on, and returns the
// holder's class and the Backend's lease, which the caller releases after
// unlocking.
func (l *lane) releaseLocked(h *hold) (Priority, Lease) {
	h.gen++
	p, lease := h.prio, h.lease
	h.lease = nil
	l.settleLocked(l.lim.cfg.Load(), h)
	h.open = false
	if l.tok != nil {
		l.releaseTokensLocked(h, h.gen-1)
	}
	l.slots.inflight--
	if h.abandoned {
		h.abandoned = false
		l.slots.abandoned--
	}
	l.heldLocked(false)
	if p != Interactive {
		l.slots.others--
	}
	if h.idx >= 0 {
		l.unlistLocked(h)
	}
	l.slots.free = append(l.slots.free, h)
	if l.q.n > 0 {
		l.dispatchLocked(l.lim.clock.Now())
	} else {
		l.freshenLocked()
		l.activity.touched = l.stats.Current()
	}
	return p, lease
}
