package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// waiter is a call of this process queued in a shared lane.
type waiter struct {
	lk   *laneKeys
	id   string
	wake chan struct{} // a grant message named it
	gone chan struct{} // the renewal loop found its place gone (Redis lost it)
	// renewed is when the last renewal of its lease that Redis took was
	// sent (the acquire, at first). A grant keeps the place's lease, so
	// the slot's lease is sure until renewed plus the margin. Guarded by
	// b.mu.
	renewed time.Time
}

// Acquire waits for a slot of lane r.Lane in Redis (see limiter.Backend).
func (b *Backend) Acquire(ctx context.Context, r limiter.Request) (limiter.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	qt := r.Config.QueueTimeout
	if qt == 0 {
		qt = limiter.DefaultQueueTimeout
	}
	switch { // the call's deadline may come first
	case r.MaxWait < 0:
		qt = 0
	case r.MaxWait > 0 && r.MaxWait < qt:
		qt = r.MaxWait
	}
	deadline := time.Now().Add(qt)
	due, stop := b.after(qt)
	defer stop()
	lk := b.keysOf(r.Lane)
	if cfg := lk.cfg.Load(); cfg == nil || *cfg != r.Config {
		c := r.Config
		lk.cfg.Store(&c)
	}
	queued := false
	for {
		if isDown, _ := b.down(); isDown {
			l, err := b.fallback(ctx, r, deadline)
			if err == errBackUp {
				continue
			}
			return l, err
		}
		// Only a duration crosses to Redis: its clock, not this host's,
		// places the arrival.
		age := max(0, b.now().Sub(r.Arrival)).Milliseconds()
		if ra := r.Arrival; ra.IsZero() {
			age = 0
		}
		sent := time.Now()
		v, err := b.run(ctx, lk, "acquire", int(r.Priority.Index()), age, b.cfg.Process, r.Lane, b.suffix, tenantOf(r), weightOf(r), max(0, r.Tokens))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if isScriptError(err) {
				return nil, fmt.Errorf("sharedlane: %w", err)
			}
			b.markDown(err)
			continue
		}
		res, _ := v.([]any)
		if len(res) != 3 {
			return nil, fmt.Errorf("sharedlane: unexpected answer %v", v)
		}
		if e := tooLarge(v); e != nil {
			e.Lane, e.Tokens = r.Lane, r.Tokens
			return nil, e
		}
		id := fmt.Sprint(res[1])
		if res[0] == "granted" {
			return b.hold(lk, id, r, sent), nil
		}
		if !queued && r.Queued != nil {
			queued = true
			pos, _ := strconv.Atoi(fmt.Sprint(res[2]))
			r.Queued(pos)
		}
		l, err, again := b.wait(ctx, r, lk, id, due, sent)
		if !again {
			return l, err
		}
	}
}

// tooLarge reads an answer {"too_large", budget, its size}: the budget a
// call is larger than whole (empty for the provider's last announced
// limit). nil for any other answer.
func tooLarge(v any) *limiter.TokenBudgetError {
	r, ok := v.([]any)
	if !ok || len(r) != 3 || r[0] != "too_large" {
		return nil
	}
	budget, _ := r[1].(string)
	if budget == "" {
		budget = "provider"
	}
	limit, _ := r[2].(int64)
	return &limiter.TokenBudgetError{Budget: budget, Limit: limit}
}

// tenantOf is r's tenant, DefaultTenant when it names none; weightOf its
// weight under r's settings.
func tenantOf(r limiter.Request) string {
	if r.Tenant == "" {
		return limiter.DefaultTenant
	}
	return r.Tenant
}

func weightOf(r limiter.Request) float64 { return r.Config.Fairness.Weight(tenantOf(r)) }

// now reads the backend's clock (Config.Clock, in tests; else the system's).
func (b *Backend) now() time.Time {
	if b.cfg.Clock != nil {
		return b.cfg.Clock.Now()
	}
	return time.Now()
}

// after returns a channel closed once d has passed on the backend's clock
// (Config.Clock, in tests; else the system's), and a func that stops it.
// For d of 0 or less it is closed already.
func (b *Backend) after(d time.Duration) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	if d <= 0 {
		close(ch)
		return ch, func() {}
	}
	if b.cfg.Clock != nil {
		t := b.cfg.Clock.AfterFunc(d, func() { close(ch) })
		return ch, func() { t.Stop() }
	}
	t := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { t.Stop() }
}

// wait waits for the grant of waiter id until due is closed (the queue
// timeout). again asks Acquire to queue the
// call anew (same arrival: same place in the order), because Redis lost
// its place (a restart) or went down.
func (b *Backend) wait(ctx context.Context, r limiter.Request, lk *laneKeys, id string, due <-chan struct{}, sent time.Time) (l limiter.Lease, err error, again bool) {
	w := &waiter{lk: lk, id: id, wake: make(chan struct{}, 1), gone: make(chan struct{}), renewed: sent}
	b.mu.Lock()
	b.waiters[lk.tag+" "+id] = w
	_, downCh := b.isDown, b.downCh
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.waiters, lk.tag+" "+id)
		b.mu.Unlock()
	}()
	poll := time.NewTicker(b.cfg.PollEvery)
	defer poll.Stop()
	// A grant published before w was registered is found by this first
	// look; any later one wakes w.
	take := func() (limiter.Lease, error, bool, bool) { // lease, err, again, done
		v, err := b.run(ctx, lk, "take", id)
		switch {
		case err != nil && ctx.Err() != nil:
			return b.leave(r, w, ctx.Err())
		case err != nil && isScriptError(err):
			return nil, fmt.Errorf("sharedlane: %w", err), false, true
		case err != nil:
			b.markDown(err)
			return nil, nil, true, true
		case v == "granted":
			return b.hold(lk, id, r, b.renewedAt(w)), nil, false, true
		case tooLarge(v) != nil:
			// A reload made the call larger than a whole budget.
			e := tooLarge(v)
			e.Lane, e.Tokens = r.Lane, r.Tokens
			return nil, e, false, true
		case v == "gone":
			return nil, nil, true, true
		}
		return nil, nil, false, false
	}
	if l, err, again, done := take(); done {
		return l, err, again
	}
	for {
		select {
		case <-w.wake:
		case <-poll.C:
		case <-w.gone:
			return nil, nil, true
		case <-downCh:
			return nil, nil, true
		case <-due:
			l, err, again, _ := b.leave(r, w, limiter.ErrQueueTimeout)
			return l, err, again
		case <-ctx.Done():
			l, err, again, _ := b.leave(r, w, ctx.Err())
			return l, err, again
		}
		if l, err, again, done := take(); done {
			return l, err, again
		}
	}
}

// leave takes waiter id out of the queue because of why (a queue timeout
// or the caller's context). A grant that won the race stands for a queue
// timeout, as in an in-process lane; for a canceled caller it is given
// back.
func (b *Backend) leave(r limiter.Request, w *waiter, why error) (limiter.Lease, error, bool, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
	defer cancel()
	// Only a queue timeout reports where the call stood; a caller that gave
	// up does not ask, and its leave costs Redis O(log n).
	report := 0
	if errors.Is(why, limiter.ErrQueueTimeout) {
		report = 1
	}
	v, err := b.run(ctx, w.lk, "cancel", w.id, report)
	if err != nil {
		// The place will lapse with its lease; nothing more to do here.
		if !isScriptError(err) {
			b.markDown(err)
		}
		return nil, why, false, true
	}
	if v == "granted" {
		l := b.hold(w.lk, w.id, r, b.renewedAt(w))
		if errors.Is(why, limiter.ErrQueueTimeout) {
			return l, nil, false, true
		}
		l.Release()
	}
	if errors.Is(why, limiter.ErrQueueTimeout) {
		if st, ok := queueState(v); ok {
			why = st
		}
	}
	return nil, why, false, true
}

// queueState reads where a waiter stood from a cancel's answer.
func queueState(v any) (*limiter.BackendQueueTimeout, bool) {
	r, ok := v.([]any)
	if !ok || len(r) != 6 || r[0] != "removed" {
		return nil, false
	}
	var n [5]int
	for i := range n {
		x, ok := r[i+1].(int64)
		if !ok {
			return nil, false
		}
		n[i] = int(x)
	}
	return &limiter.BackendQueueTimeout{Position: n[0], Queued: n[1], Ahead: [3]int{n[2], n[3], n[4]}}, true
}

// errBackUp sends a call waiting on the fallback lanes back to Redis.
var errBackUp = errors.New("sharedlane: Redis is back")

// fallback serves r on this process's own lanes, or refuses it, while
// Redis is down. A call still waiting there when Redis is used again goes
// back to Redis (errBackUp), keeping its arrival.
func (b *Backend) fallback(ctx context.Context, r limiter.Request, deadline time.Time) (limiter.Lease, error) {
	if b.local == nil {
		return nil, fmt.Errorf("sharedlane: lane %q: %w (on_redis_down: closed)", r.Lane, limiter.ErrLaneUnavailable)
	}
	b.mu.Lock()
	isDown, upCh := b.isDown, b.upCh
	b.mu.Unlock()
	if !isDown {
		return nil, errBackUp
	}
	b.setLocal(r.Config)
	// What is left of the call's queue timeout bounds its wait here.
	lctx, cancel := context.WithDeadline(limiter.WithPriority(ctx, r.Priority), deadline)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-upCh:
			cancel()
		case <-stop:
		}
	}()
	if !r.Arrival.IsZero() {
		lctx = limiter.WithArrival(lctx, r.Arrival)
	}
	s, err := b.local.Acquire(lctx, r.Lane)
	if err != nil {
		select {
		case <-upCh:
			if ctx.Err() == nil && time.Now().Before(deadline) {
				return nil, errBackUp
			}
		default:
		}
		if errors.Is(err, limiter.ErrQueueTimeout) || (ctx.Err() == nil && lctx.Err() != nil) {
			return nil, limiter.ErrQueueTimeout
		}
		return nil, err
	}
	l := &lease{b: b, local: &s, class: r.Priority, tenant: tenantOf(r), weight: weightOf(r), tokens: r.Tokens, lost: make(chan struct{})}
	b.mu.Lock()
	if !b.isDown { // granted here just as Redis came back: ask Redis instead
		b.mu.Unlock()
		s.Release()
		return nil, errBackUp
	}
	b.fallbacks[l] = false
	answering := !b.upAt.IsZero()
	b.mu.Unlock()
	if answering {
		// Redis answers again (the grace before it is used): count this
		// call there now.
		rctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
		b.register(rctx, l)
		cancel()
	}
	return l, nil
}

// setLocal puts the fallback lanes under the lane's settings, with
// LocalMaxInflight for the limit.
func (b *Backend) setLocal(lane limiter.Config) {
	want := limiter.Config{MaxInflight: b.cfg.LocalMaxInflight, InteractiveReserve: lane.InteractiveReserve, QueueTimeout: lane.QueueTimeout,
		MaxLanes: lane.MaxLanes, LaneIdleTTL: lane.LaneIdleTTL} // bounded as the shared lanes are
	if b.local.Config() != want {
		b.local.SetConfig(want)
	}
}

func (b *Backend) renewedAt(w *waiter) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return w.renewed
}
