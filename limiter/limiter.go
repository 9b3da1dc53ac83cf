package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter is a registry of lanes sharing one Config. The zero value is not
// usable; call New. A Limiter is safe for concurrent use.
type Limiter struct {
	cfg       atomic.Pointer[Config]
	clock     Clock
	origin    time.Time
	observers []Observer
	log       *slog.Logger
	lanes     sync.Map // lane key → *lane
	// one is a lane found without the lanes table, while it lives: most
	// processes send every call to one lane, and a lookup in a sync.Map,
	// which hashes its key as an interface, was a third of an uncontended
	// Acquire and Release. It is set when it is empty, by the lookup that
	// finds or makes a lane, and emptied when its lane is evicted: never
	// set to "the last lane used", which would be a write shared by every
	// core on every call to a process with several busy lanes.
	one      atomic.Pointer[lane]
	closed   atomic.Bool     // Shutdown has begun
	backend  Backend         // where the slots and queues are, if not here
	shared   sharedCache     // the backend's global figures, last read
	down     context.Context // done once Shutdown has begun
	shutdown context.CancelFunc
	waiters  sync.Pool // of *waiter: see waiter

	// mu guards the lanes' membership: creating and evicting a lane, and
	// the count that Config.MaxLanes bounds. Lookups of existing lanes
	// (every call) go through one or the sync.Map without it.
	//
	// Lock order: Limiter.mu, then a lane's mu, then the Clock's own (a
	// fake clock's; the timers' functions run without it held, and take a
	// lane's mu). No lane's mu is held while calling an Observer, a Backend
	// or a Lease: those may block, or call back into the limiter.
	mu     sync.Mutex
	nlanes int
	sweep  Timer // the next idle-lane sweep, while there are lanes to sweep
}

// Option configures New.
type Option func(*Limiter)

// WithClock makes the limiter read time from c instead of the system clock.
func WithClock(c Clock) Option { return func(l *Limiter) { l.clock = c } }

// WithObserver adds an observer of lane events (see Observer for when and
// how it is called).
func WithObserver(o Observer) Option {
	return func(l *Limiter) { l.observers = append(l.observers, o) }
}

// WithLogger sets where the limiter logs a panicking observer
// (slog.Default() otherwise).
func WithLogger(log *slog.Logger) Option { return func(l *Limiter) { l.log = log } }

// New returns a limiter with configuration cfg, or the error of
// cfg.ValidateFor(the Backend of opts, if any).
func New(cfg Config, opts ...Option) (*Limiter, error) {
	l := &Limiter{clock: systemClock{}, waiters: sync.Pool{New: newWaiter}}
	for _, o := range opts {
		o(l)
	}
	if err := cfg.ValidateFor(l.backend); err != nil {
		return nil, err
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	l.origin = l.clock.Now()
	l.cfg.Store(&cfg)
	l.down, l.shutdown = context.WithCancel(context.Background())
	return l, nil
}

// Enabled reports whether the limiter is on (MaxInflight above 0).
func (l *Limiter) Enabled() bool { return l.cfg.Load().MaxInflight > 0 }

// Clock returns the limiter's clock, so that code timing calls around it
// (a transport's stall guard, say) can share it.
func (l *Limiter) Clock() Clock { return l.clock }

// Config returns the configuration in force.
func (l *Limiter) Config() Config { return *l.cfg.Load() }

// SetConfig replaces the configuration, or returns the error of
// cfg.ValidateFor(the limiter's Backend) and keeps the old one. The new settings apply to later
// acquisitions and grants: slots already held are never revoked (a lowered
// limit takes effect as they are released), waiters keep the queue timeout
// they started with, a raised limit admits waiters at once, and
// MaxInflight 0 admits every waiter.
func (l *Limiter) SetConfig(cfg Config) error {
	if err := cfg.ValidateFor(l.backend); err != nil {
		return err
	}
	l.cfg.Store(&cfg)
	var keys []string
	l.lanes.Range(func(k, v any) bool {
		ln := v.(*lane)
		keys = append(keys, k.(string))
		ln.mu.Lock()
		ln.forgetProviderLocked()
		ln.adaptLocked(&cfg) // a cold start ends if cfg has none
		ln.recapLocked(&cfg)
		ln.rebudgetLocked(&cfg)
		if ln.q.n > 0 {
			ln.dispatchLocked(l.clock.Now())
		}
		ln.mu.Unlock()
		return true
	})
	if rl, ok := l.backend.(Reloader); ok && len(keys) > 0 {
		// After the lanes' locks: no lane lock is held while calling a
		// Backend.
		ctx, cancel := context.WithTimeout(context.Background(), forgetTimeout)
		rl.Reload(ctx, keys, cfg)
		cancel()
	}
	l.mu.Lock()
	if l.sweep == nil && l.nlanes > 0 && cfg.LaneIdleTTL > 0 && !l.closed.Load() {
		l.sweep = l.clock.AfterFunc(cfg.sweepEvery(), l.sweepIdle)
	}
	l.mu.Unlock()
	return nil
}

// Acquire takes a slot in the lane named key for a call whose class is
// PriorityFrom(ctx), waiting in the lane's queue if none is free.
//
// When the limiter is off (MaxInflight 0) it returns a zero Slot at once
// and creates no lane. Otherwise a context that is already done takes no
// slot and returns ctx.Err(). Waiters are served by effective class, then
// by logical arrival (see WithArrival): a waiter's class rises one step for
// every 60 s it has waited, up to Interactive. The reserve caps the calls
// whose own class is not Interactive at MaxInflight minus
// Config.Reserve() slots held at once, whatever their age; Interactive
// calls may take any free slot.
//
// A wait ends with the slot, with a *QueueTimeoutError (errors.Is
// ErrQueueTimeout) after Config.QueueTimeout, or with ctx.Err() when ctx
// ends first. A call that stops waiting leaves nothing in the queue; if its
// context ends just as it is granted, the slot passes to the next waiter.
func (l *Limiter) Acquire(ctx context.Context, key string) (Slot, error) {
	cfg := l.cfg.Load()
	if cfg.MaxInflight == 0 {
		return Slot{}, nil
	}
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	var c call
	c.read(ctx)
	p := c.prio
	if l.backend != nil {
		return l.acquireShared(ctx, key, cfg, &c)
	}
	ln, err := l.openLane(ctx, key, cfg, p)
	if err != nil {
		return Slot{}, err
	}
	cfg = l.cfg.Load() // decide under the lock with the settings in force now
	if _, fixed := ln.limit.(fixedLimit); !fixed || cfg.Adaptive != nil {
		ln.adaptLocked(cfg)
		cfg = ln.effLocked(cfg)
		ln.settleDrainLocked(cfg)
	}
	t := ln.tenantLocked(cfg, c.tenant)
	base, open := ln.estimateLocked(cfg, c.tokens)
	cost := ln.calibrateLocked(cfg, t, base)
	if ln.q.n == 0 && !t.parked && ln.fitsLocked(cfg, p) && ln.tokensNowLocked(cfg, cost) {
		h := ln.grantNowLocked(cfg, p, t, cost)
		h.base, h.open = base, open
		gen := h.gen
		ln.mu.Unlock()
		if len(l.observers) > 0 {
			l.emitAcquired(ctx, key, p, t.label)
		}
		return Slot{h: h, gen: gen}, nil
	}
	return ln.waitLocked(ctx, cfg, &c, t, cost, base, open)
}

// emitAcquired tells the observers of an immediate grant. Not inlined, so
// that the Event is made in its frame, not in Acquire's: Acquire's frame
// stays on the stack of every call that waits (docs/DESIGN.md, "A queued
// call's stack").
//
//go:noinline
func (l *Limiter) emitAcquired(ctx context.Context, key string, p Priority, tenant string) {
	l.emit(ctx, Event{Kind: Acquired, Lane: key, Priority: p, Tenant: tenant})
}

// openLane returns lane key locked, made if need be, or refuses the call:
// with the lane table's error, or ErrShuttingDown. closed is checked under
// the lane's lock, which Shutdown takes after setting it: a call either
// sees closed here, or is in the queue when Shutdown empties it.
func (l *Limiter) openLane(ctx context.Context, key string, cfg *Config, p Priority) (*lane, error) {
	for {
		ln, err := l.lane(key, cfg)
		if err != nil {
			return nil, err
		}
		ln.mu.Lock()
		if ln.activity.evicted {
			ln.mu.Unlock() // evicted between the lookup and the lock: make it again
			l.one.CompareAndSwap(ln, nil)
			continue
		}
		if l.closed.Load() {
			ln.mu.Unlock()
			l.emit(ctx, Event{Kind: Refused, Lane: key, Priority: p})
			return nil, ErrShuttingDown
		}
		return ln, nil
	}
}

// lockedLane returns lane key locked if it exists, nil otherwise: for
// reports about calls (exchanges, first bytes), which never make a lane.
func (l *Limiter) lockedLane(key string) *lane {
	v, ok := l.lanes.Load(key)
	if !ok {
		return nil
	}
	ln := v.(*lane)
	ln.mu.Lock()
	return ln
}

// lane returns lane key, made if need be (the caller locks it, and checks
// that it was not evicted meanwhile).
func (l *Limiter) lane(key string, cfg *Config) (*lane, error) {
	if ln := l.one.Load(); ln != nil && ln.key == key {
		return ln, nil
	}
	if v, ok := l.lanes.Load(key); ok {
		ln := v.(*lane)
		if l.one.Load() == nil {
			l.one.CompareAndSwap(nil, ln) // an evicted one is emptied by openLane
		}
		return ln, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.lanes.Load(key); ok {
		return v.(*lane), nil
	}
	if cfg.MaxLanes > 0 && l.nlanes >= cfg.MaxLanes {
		return nil, &LaneLimitError{Lane: key, MaxLanes: cfg.MaxLanes, IdleTTL: cfg.LaneIdleTTL}
	}
	ln := newLane(l, key, cfg)
	l.lanes.Store(key, ln)
	l.one.CompareAndSwap(nil, ln)
	l.nlanes++
	if l.sweep == nil && cfg.LaneIdleTTL > 0 {
		l.sweep = l.clock.AfterFunc(cfg.sweepEvery(), l.sweepIdle)
	}
	return ln, nil
}

// Lanes returns how many lanes exist.
func (l *Limiter) Lanes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nlanes
}

// sweepIdle forgets the lanes that have been idle for Config.LaneIdleTTL,
// and schedules the next sweep while lanes remain. It runs on the clock's
// timer.
func (l *Limiter) sweepIdle() {
	cfg := l.cfg.Load()
	now := l.clock.Now()
	var gone []string
	l.mu.Lock()
	l.lanes.Range(func(k, v any) bool {
		ln := v.(*lane)
		ln.mu.Lock()
		if cfg.LaneIdleTTL > 0 && ln.idleLocked(now, cfg.LaneIdleTTL) {
			ln.activity.evicted = true
			l.one.CompareAndSwap(ln, nil)
			l.lanes.Delete(k)
			l.nlanes--
			gone = append(gone, ln.key)
		}
		ln.mu.Unlock()
		return true
	})
	l.sweep = nil
	if l.nlanes > 0 && cfg.LaneIdleTTL > 0 && !l.closed.Load() {
		l.sweep = l.clock.AfterFunc(cfg.sweepEvery(), l.sweepIdle)
	}
	l.mu.Unlock()
	for _, key := range gone {
		l.emit(context.Background(), Event{Kind: Evicted, Lane: key})
	}
}

// Shutdown refuses every call from now on: each call waiting in a queue
// returns ErrShuttingDown at once, and so does every later Acquire, so that
// nothing more reaches the gateway. Slots already held stay held until they
// are released (streams in progress run on); a released slot is granted to
// no one. Shutdown is idempotent.
func (l *Limiter) Shutdown() {
	l.closed.Store(true)
	l.shutdown()
	l.mu.Lock()
	if l.sweep != nil {
		l.sweep.Stop()
		l.sweep = nil
	}
	l.mu.Unlock()
	l.lanes.Range(func(_, v any) bool {
		ln := v.(*lane)
		ln.mu.Lock()
		ln.refuseAllLocked(l.clock.Now())
		ln.mu.Unlock()
		return true
	})
}

// emit tells every observer of e. It is kept out of line, so that its
// copies of the Event are not in the frames of Acquire and waitLocked, on
// the stack of every waiting call (docs/DESIGN.md, "A queued call's
// stack").
//
//go:noinline
func (l *Limiter) emit(ctx context.Context, e Event) {
	for _, o := range l.observers {
		l.tell(o, ctx, &e)
	}
}

// tell tells o of e, recovering a panic. It takes e by pointer so that its
// frame holds no copy of the Event beyond the one o is called with.
func (l *Limiter) tell(o Observer, ctx context.Context, e *Event) {
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("limiter: observer panicked", "event", e.Kind.String(), "lane", e.Lane, "panic", fmt.Sprint(r))
		}
	}()
	o(ctx, *e)
}

// Slot is a granted place in a lane. Release it exactly when the call's
// work at the gateway is over (for a stream, when the stream ends).
//
// Release is idempotent: a second Release, through the same Slot or
// through a copy of it, does nothing, so a slot is never given back twice.
// The zero Slot (from a limiter that is off) releases nothing. Release must
// not be called concurrently on the same Slot variable; copies may be
// released concurrently.
type Slot struct {
	h    *hold
	gen  uint64          // h.gen when granted; a released hold has moved on
	lost <-chan struct{} // the Backend lease's Lost, with a backend
}

// Lost returns a channel that is closed if the slot is lost: a Backend
// could not keep it (see Lease), so the call must stop for the lane's
// limit to hold. It is nil (never ready) for an in-process slot.
func (s *Slot) Lost() <-chan struct{} { return s.lost }

// Release gives the slot back; the lane grants it to the next waiter.
func (s *Slot) Release() {
	if h := s.h; h != nil {
		s.h = nil
		h.lane.release(h, s.gen)
	}
}

// Abandon marks the slot as held for a call whose caller has left while
// the upstream still works on it: a gateway that does not stop the work
// when its client goes (LiteLLM does not) still has the call at work, so
// the slot stays held until the upstream's answer ends, and the snapshot
// counts it (LaneSnapshot.Abandoned). It does nothing after Release.
func (s *Slot) Abandon() {
	h := s.h
	if h == nil {
		return
	}
	l := h.lane
	l.mu.Lock()
	if h.gen == s.gen && !h.abandoned {
		h.abandoned = true
		l.slots.abandoned++
	}
	l.mu.Unlock()
}

// Lane returns the key of the slot's lane, or "" for the zero Slot.
func (s *Slot) Lane() string {
	if s.h == nil {
		return ""
	}
	return s.h.lane.key
}
