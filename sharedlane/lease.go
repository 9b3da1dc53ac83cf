package sharedlane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// lease is a slot this process holds: in Redis (lk and id set), on the
// fallback lanes (local set), or both (a fallback slot registered in Redis
// when it came back).
type lease struct {
	b      *Backend
	class  limiter.Priority
	tenant string  // the call's tenant, and its weight: a reclaimed slot
	weight float64 // is charged to it as the first was
	// tokens is its call's estimate, or its use once settled: what a
	// reclaimed slot takes from the budget. Guarded by b.mu.
	tokens int64
	local  *limiter.Slot
	// occupied is a fallback slot taken for this shared slot while Redis
	// is down, so that the fallback lanes count the calls still running.
	occupied *limiter.Slot
	lost     chan struct{}
	once     sync.Once // Release
	lose     sync.Once // closing lost

	// Guarded by b.mu: the renewal loop moves them.
	lk       *laneKeys
	id       string
	deadline time.Time // the last renewal sent, plus LeaseTTL, less a margin: lost after that
	// watch fires at the deadline, to lose the slot on time even if the
	// renewal loop is late; a renewal moves the deadline, and the timer
	// then looks again at the new one.
	watch *time.Timer
}

func (l *lease) Lost() <-chan struct{} { return l.lost }

// Settle replaces what the slot's grant was charged in the lane's token
// budget, in Redis, with u (limiter.SettlingLease). A settlement that
// cannot reach Redis is lost: the estimate stays charged, the safe side.
// Off Redis (on the fallback lanes), the local slot settles.
func (l *lease) Settle(u limiter.Usage) {
	used := max(0, u.Prompt) + max(0, u.Completion)
	l.b.mu.Lock()
	l.tokens = used
	l.b.mu.Unlock()
	if local := l.report("settle", used); local != nil {
		local.Settle(u)
	}
}

// report runs op on the slot in Redis with args after its id, if the slot
// is held there, and returns the fallback lanes' slot, if any, for the
// caller to tell as well. A report that cannot reach Redis is lost.
func (l *lease) report(op string, args ...any) *limiter.Slot {
	b := l.b
	b.mu.Lock()
	lk, id, local := l.lk, l.id, l.local
	b.mu.Unlock()
	if lk != nil {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
		defer cancel()
		if _, err := b.run(ctx, lk, op, append([]any{id}, args...)...); err != nil && !isScriptError(err) {
			b.markDown(err)
		}
	}
	return local
}

// RecordLimits reports what the rate-limit headers of this slot's answer
// said to the lane in Redis (limiter.LimitsLease), where they bind every
// process's grants: the provider's budget is the organisation's, whoever
// sent the call. A report that cannot reach Redis is lost; the next
// answer's headers say it again. Off Redis, the local slot's lane takes it.
func (l *lease) RecordLimits(pl limiter.ProviderLimits) {
	budget := func(p limiter.ProviderBudget) []any {
		if !p.Known {
			return []any{0, 0, 0, 0}
		}
		return []any{1, p.Limit, p.Remaining, p.Reset.Milliseconds()}
	}
	window := limiter.DefaultProviderWindow
	l.b.mu.Lock()
	lk := l.lk
	l.b.mu.Unlock()
	if lk != nil {
		if cfg := lk.cfg.Load(); cfg != nil && cfg.ProviderWindow > 0 {
			window = cfg.ProviderWindow
		}
	}
	flag := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	args := append(append(budget(pl.Tokens), budget(pl.Requests)...), max(0, pl.RetryAfter).Milliseconds(), window.Milliseconds(),
		flag(pl.Concurrency), flag(pl.RefuseAbove))
	if local := l.report("limits", args...); local != nil {
		pl.Slot = *local // the fallback lane's own slot: its count holds this call
		l.b.local.RecordLimits(context.Background(), local.Lane(), pl)
	}
}

// Release gives the slot back: in Redis, then on the fallback lanes.
func (l *lease) Release() {
	l.once.Do(func() {
		b := l.b
		b.mu.Lock()
		lk, id := l.lk, l.id
		if lk != nil {
			delete(b.leases, lk.tag+" "+id)
		}
		delete(b.fallbacks, l)
		if l.watch != nil {
			l.watch.Stop()
		}
		b.mu.Unlock()
		if lk != nil {
			ctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
			// A release that cannot reach Redis is left to the lease, which
			// lapses within LeaseTTL.
			if _, err := b.run(ctx, lk, "release", id); err != nil && !isScriptError(err) {
				b.markDown(err)
			}
			cancel()
		}
		if l.local != nil {
			l.local.Release()
		}
		b.mu.Lock()
		occ := l.occupied
		l.occupied = nil
		b.mu.Unlock()
		if occ != nil {
			occ.Release()
		}
	})
}

// hold registers a slot granted in Redis, whose lease was last renewed by
// a call sent at renewed.
func (b *Backend) hold(lk *laneKeys, id string, r limiter.Request, renewed time.Time) *lease {
	l := &lease{b: b, class: r.Priority, tenant: tenantOf(r), weight: weightOf(r), tokens: r.Tokens, lost: make(chan struct{}), lk: lk, id: id}
	b.mu.Lock()
	l.deadline = renewed.Add(b.margin())
	b.leases[lk.tag+" "+id] = l
	b.watchLocked(l)
	b.mu.Unlock()
	return l
}

// watchLocked arms l's deadline timer. Called with b.mu held.
func (b *Backend) watchLocked(l *lease) {
	if l.watch != nil {
		return // it looks at the deadline in force when it fires
	}
	var check func()
	check = func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, held := b.leases[l.lk.tag+" "+l.id]; !held {
			return
		}
		if d := time.Until(l.deadline); d > 0 {
			l.watch.Reset(d)
			return
		}
		b.loseLocked(l, "no renewal within lease_ttl")
	}
	l.watch = time.AfterFunc(time.Until(l.deadline), check)
}

// margin is how long after a renewal is sent its lease is surely still
// held in Redis: LeaseTTL, less a fifth for the hosts' clock rates and a
// loaded machine's lateness in acting on it.
func (b *Backend) margin() time.Duration { return b.cfg.LeaseTTL - b.cfg.LeaseTTL/5 }

// loseLocked ends l: its lease could not be kept. Called with b.mu held.
func (b *Backend) loseLocked(l *lease, why string) {
	delete(b.leases, l.lk.tag+" "+l.id)
	l.lose.Do(func() {
		close(l.lost)
		b.log.Warn("sharedlane: a slot's lease was lost: its call is stopped so that the lane's limit holds",
			"lane", l.lk.lane, "why", why)
	})
}

// The renewal rule (docs/LANES-EXPORTER.md, "Shared lanes", states it
// with its figures):
//
//   - Every lease this process holds (a slot, or a place in a queue) is
//     renewed every renewEvery (LeaseTTL/6), whether or not Redis is taken
//     to be down: being down decides where new calls go, not whether the
//     slots already held are still held.
//   - A renewal that fails (an error, or no answer within renewEvery) is
//     tried again every step (a second, or LeaseTTL/15 if shorter) until
//     one succeeds.
//   - A slot is given up only when it can no longer be proven held: once
//     its deadline passes, the send time of the latest renewal Redis
//     confirmed plus margin (0.8 LeaseTTL), or when Redis answers that the
//     lease is gone (then it is taken again if the lane has room).
//
// So a stall of Redis shorter than the margin less the time since the last
// confirmed renewal (at most renewEvery and a round trip) cuts no call:
// the renewals sent during the stall are answered as soon as Redis is,
// and move the deadline on.

// renewEvery is how often leases are renewed.
func (b *Backend) renewEvery() time.Duration { return b.cfg.LeaseTTL / 6 }

// step is how often the renewal loop looks: for a failed renewal to try
// again, for the leases past their deadline, and, while Redis is taken to
// be down, to ping it.
func (b *Backend) step() time.Duration { return min(time.Second, b.cfg.LeaseTTL/15) }

// renewLoop renews this process's leases (see the rule above), loses the
// slots whose lease can no longer be proven held, and brings Redis back
// into use when it answers again.
func (b *Backend) renewLoop() {
	defer b.wg.Done()
	t := time.NewTicker(b.step())
	defer t.Stop()
	var renewed time.Time // the last renewal round that succeeded
	failed := false
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		if isDown, _ := b.down(); isDown {
			b.tryRecover()
		}
		if now := time.Now(); failed || now.Sub(renewed) >= b.renewEvery() {
			if failed = !b.renew(); !failed {
				renewed = now
				b.prune(now)
			}
		}
		// A slot whose lease may have lapsed in Redis must stop now,
		// whether or not Redis can be reached.
		now := time.Now()
		b.mu.Lock()
		for _, l := range b.leases {
			if now.After(l.deadline) {
				b.loseLocked(l, "no renewal confirmed within lease_ttl")
			}
		}
		b.mu.Unlock()
	}
}

// renew renews every lease, lane by lane; false if Redis could not be
// reached for one.
func (b *Backend) renew() bool {
	type item struct {
		id string
		l  *lease  // a held slot
		w  *waiter // or a queue place
	}
	byLane := map[*laneKeys][]item{}
	b.mu.Lock()
	for _, l := range b.leases {
		byLane[l.lk] = append(byLane[l.lk], item{id: l.id, l: l})
	}
	for _, w := range b.waiters {
		byLane[w.lk] = append(byLane[w.lk], item{id: w.id, w: w})
	}
	b.mu.Unlock()
	for lk, items := range byLane {
		args := make([]any, len(items))
		for i, it := range items {
			args[i] = it.id
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), b.renewEvery())
		v, err := b.runOn(ctx, b.ctl, lk, "renew", args...)
		cancel()
		if err != nil {
			if !isScriptError(err) {
				b.markDown(err)
			}
			return false
		}
		st, _ := v.([]any)
		b.mu.Lock()
		for i, it := range items {
			switch {
			case i >= len(st):
			case it.l != nil && st[i] == "h":
				it.l.deadline = sent.Add(b.margin())
			case it.l != nil && st[i] == "-":
				b.mu.Unlock()
				b.reclaim(it.l) // Redis lost it (a restart): take it again if the lane has room
				b.mu.Lock()
			case it.w != nil && (st[i] == "q" || st[i] == "h"):
				it.w.renewed = sent
			case it.w != nil && st[i] == "-":
				select {
				case <-it.w.gone:
				default:
					close(it.w.gone)
				}
			}
		}
		b.mu.Unlock()
	}
	return true
}

// reclaim takes a slot in Redis again for l, whose lease Redis no longer
// knows, if the lane has room for it; otherwise l is lost.
func (b *Backend) reclaim(l *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
	defer cancel()
	b.mu.Lock()
	lk, old, tokens := l.lk, l.id, l.tokens
	_, held := b.leases[lk.tag+" "+old]
	b.mu.Unlock()
	if !held {
		return // released since the renewal read it
	}
	sent := time.Now()
	v, err := b.run(ctx, lk, "reclaim", int(l.class.Index()), b.cfg.Process, "0", b.suffix, l.tenant, l.weight, tokens)
	if err != nil && !isScriptError(err) {
		b.markDown(err) // the deadline decides, as for any lease not renewed
		return
	}
	b.mu.Lock()
	if _, held := b.leases[lk.tag+" "+old]; !held {
		// Released (or lost) while the script ran: the renewal that found
		// the lease gone raced its release. Give the new slot back, or the
		// lease would live on, renewed, with no call behind it.
		b.mu.Unlock()
		if err == nil && v != nil {
			b.run(ctx, lk, "release", fmt.Sprint(v))
		}
		return
	}
	defer b.mu.Unlock()
	if err != nil || v == nil {
		b.loseLocked(l, "the store forgot the slot and the lane is full")
		return
	}
	delete(b.leases, lk.tag+" "+old)
	l.id, l.deadline = fmt.Sprint(v), sent.Add(b.margin())
	b.leases[lk.tag+" "+l.id] = l
	b.watchLocked(l)
}

// tryRecover pings Redis. When it answers, the slots held on the fallback
// lanes are registered in Redis (they count against the shared limit until
// they end), and so is every fallback slot granted from then on; new calls
// go to Redis again after a grace of two steps, by when every other
// process (pinging as often) has seen it answer and registered its own.
func (b *Backend) tryRecover() {
	ctx, cancel := context.WithTimeout(context.Background(), b.step())
	defer cancel()
	if err := b.ctl.Ping(ctx).Err(); err != nil {
		b.mu.Lock()
		b.upAt = time.Time{}
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	if b.upAt.IsZero() {
		b.upAt = time.Now().Add(2 * b.step())
	}
	b.mu.Unlock()
	if !b.registerFallbacks(ctx) {
		return
	}
	b.mu.Lock()
	flip := !time.Now().Before(b.upAt)
	if flip {
		b.isDown, b.upAt = false, time.Time{}
		b.downCh = make(chan struct{})
		close(b.upCh) // the fallback's waiters go to Redis
	}
	b.mu.Unlock()
	if flip {
		b.registerFallbacks(ctx) // any granted meanwhile
		b.log.Info("sharedlane: Redis answers again: lanes are shared again")
	}
}

// registerFallbacks registers in Redis every fallback slot not registered
// yet; false if Redis failed meanwhile.
func (b *Backend) registerFallbacks(ctx context.Context) bool {
	b.mu.Lock()
	var pending []*lease
	for l, registered := range b.fallbacks {
		if !registered {
			pending = append(pending, l)
		}
	}
	b.mu.Unlock()
	for _, l := range pending {
		if !b.register(ctx, l) {
			return false
		}
	}
	return true
}

// register takes a slot in Redis, by force, for the fallback slot l: a
// call already running counts against the shared limit until it ends.
func (b *Backend) register(ctx context.Context, l *lease) bool {
	lk := b.keysOf(l.laneName())
	sent := time.Now()
	b.mu.Lock()
	tokens := l.tokens
	b.mu.Unlock()
	v, err := b.run(ctx, lk, "reclaim", int(l.class.Index()), b.cfg.Process, "1", b.suffix, l.tenant, l.weight, tokens)
	if err != nil {
		return false
	}
	b.mu.Lock()
	registered, running := b.fallbacks[l]
	if running && !registered {
		b.fallbacks[l] = true
		l.lk, l.id, l.deadline = lk, fmt.Sprint(v), sent.Add(b.margin())
		b.leases[lk.tag+" "+l.id] = l
		b.watchLocked(l)
	}
	b.mu.Unlock()
	if !running || registered { // it ended meanwhile, or another registered it
		b.run(ctx, lk, "release", fmt.Sprint(v))
	}
	return true
}

// occupy takes, for each shared slot still held when Redis went down, a
// slot of the fallback lanes if one is free, so that the fallback counts
// the calls still running: a process then runs at most as many calls as
// it held, or LocalMaxInflight, whichever is more.
func (b *Backend) occupy() {
	b.mu.Lock()
	var held []*lease
	for _, l := range b.leases {
		if l.local == nil && l.occupied == nil {
			held = append(held, l)
		}
	}
	b.mu.Unlock()
	for _, l := range held {
		if cfg := l.lk.cfg.Load(); cfg != nil {
			b.setLocal(*cfg)
		}
		ctx, cancel := context.WithTimeout(limiter.WithPriority(context.Background(), l.class), time.Millisecond)
		s, err := b.local.Acquire(ctx, l.lk.lane)
		cancel()
		if err != nil {
			continue // the fallback lane is full: this call runs on beside it
		}
		b.mu.Lock()
		if _, still := b.leases[l.lk.tag+" "+l.id]; still && l.occupied == nil {
			l.occupied = &s
			s = limiter.Slot{}
		}
		b.mu.Unlock()
		s.Release() // the call ended meanwhile
	}
}

func (l *lease) laneName() string { return l.local.Lane() }
