package sharedlane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmlanes/llmlanes/limiter"
)

// Backend is a limiter.Backend on Redis. Create it with New, pass it to
// limiter.New with limiter.WithBackend, and Close it after the limiter's
// last call.
type Backend struct {
	cfg Config
	url *url.URL // for redacting its password from errors
	rdb redis.UniversalClient
	// ctl is the renewal loop's own connection (one per node), for the
	// renewals and the pings that bring Redis back into use. They decide
	// whether a slot is still held and whether Redis is down, so they must
	// not queue behind this process's own calls: 3,000 callers giving up at
	// once kept rdb's pool busy for longer than a renewal may take, and a
	// renewal that timed out in the queue took Redis for down.
	ctl       redis.UniversalClient
	eng       *engine
	channel   string
	suffix    string // this process's random part of every id it asks for
	log       *slog.Logger
	local     *limiter.Limiter // the fallback lanes, with OnRedisDown "local"
	sub       *redis.PubSub
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	tags      sync.Map // lane key → *laneKeys

	// mu guards the maps of what this process holds and waits for (the
	// renewal loop walks them; Acquire and Release add and remove) and
	// the up/down state, which every Acquire reads.
	mu        sync.Mutex
	waiters   map[string]*waiter // by tag and id
	leases    map[string]*lease  // shared slots held, by tag and id
	fallbacks map[*lease]bool    // slots held on the fallback lanes, registered in Redis or not
	isDown    bool
	downCh    chan struct{} // closed when Redis goes down; a new one once it is back
	upCh      chan struct{} // closed when Redis is used again; a new one when it goes down
	upAt      time.Time     // when a Redis that answers again is used again
}

// laneKeys are the Redis keys of one lane.
type laneKeys struct {
	lane string
	tag  string   // the hash tag: every key of the lane is in one slot
	keys []string // as lane.lua numbers them
	// call is the start of every FCALL of the lane, boxed once: the
	// number of keys, the keys, then the arguments that never change
	// (channel, tag, lease TTL, aging step; see argv). Boxing them per call
	// was a third of a shared acquire and release's allocations.
	call []any
	// cfg is the lane's settings as this process last acquired with them;
	// every op that may grant (a release, a lapsed lease swept) grants
	// under them. nil until then: such ops grant nothing.
	cfg atomic.Pointer[limiter.Config]
	// used is when the lane was last looked up (unix ns): a lane unused
	// for forgetAfter, with nothing held or waiting, is forgotten (prune).
	used atomic.Int64
}

// forgetAfter is how long a lane's keys are kept in memory unused: as long
// as Redis keeps them (lane.lua expires them after four lease TTLs).
func (b *Backend) forgetAfter() time.Duration { return 4 * b.cfg.LeaseTTL }

// New connects to Redis (it does not wait for it: a Redis that is down at
// start means the fallback until it answers) and starts the renewal loop
// and the grant subscription.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sharedlane: %w", err)
	}
	cfg = cfg.withDefaults()
	rdb, err := newClient(cfg.URL, cfg.TLSCAFile, 0)
	if err != nil {
		return nil, fmt.Errorf("sharedlane: %w", err)
	}
	ctl, _ := newClient(cfg.URL, cfg.TLSCAFile, 1) // the same URL: no new error
	var suffix [4]byte
	rand.Read(suffix[:])
	u, _ := url.Parse(cfg.URL)
	b := &Backend{cfg: cfg, url: u, rdb: rdb, ctl: ctl, eng: newEngine(cfg.Log), channel: cfg.KeyPrefix + ":grants",
		suffix: hex.EncodeToString(suffix[:]), log: cfg.Log, stop: make(chan struct{}),
		waiters: map[string]*waiter{}, leases: map[string]*lease{}, fallbacks: map[*lease]bool{}, downCh: make(chan struct{}), upCh: make(chan struct{})}
	if cfg.OnRedisDown == OnDownLocal {
		// Its settings come with each call (see fallback); these are placeholders.
		b.local, _ = limiter.New(limiter.Config{MaxInflight: cfg.LocalMaxInflight})
	}
	b.sub = rdb.Subscribe(context.Background(), b.channel)
	b.wg.Add(2)
	go b.listen()
	go b.renewLoop()
	return b, nil
}

// Close stops the loops and closes the connections. Slots still held are
// left to their leases. A second Close does nothing.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() { err = b.close() })
	return err
}

func (b *Backend) close() error {
	close(b.stop)
	b.sub.Close()
	b.wg.Wait()
	b.mu.Lock()
	for _, l := range b.leases {
		if l.watch != nil {
			l.watch.Stop()
		}
	}
	b.mu.Unlock()
	if b.local != nil {
		b.local.Shutdown()
	}
	return errors.Join(b.rdb.Close(), b.ctl.Close())
}

// Process returns the name this process goes by in the lanes' holders.
func (b *Backend) Process() string { return b.cfg.Process }

func (b *Backend) keysOf(lane string) *laneKeys {
	if v, ok := b.tags.Load(lane); ok {
		lk := v.(*laneKeys)
		lk.used.Store(time.Now().UnixNano())
		return lk
	}
	h := fnv.New64a()
	h.Write([]byte(lane))
	tag := fmt.Sprintf("%016x", h.Sum64())
	lk := &laneKeys{lane: lane, tag: tag}
	for _, k := range []string{"h", "hc", "qx", "qc", "q0", "q1", "q2", "g", "m", "t", "pv"} {
		lk.keys = append(lk.keys, b.cfg.KeyPrefix+":{"+tag+"}:"+k)
	}
	lk.call = append(lk.call, len(lk.keys))
	for _, k := range lk.keys {
		lk.call = append(lk.call, k)
	}
	lk.call = append(lk.call, b.channel, tag, b.cfg.LeaseTTL.Milliseconds(), b.cfg.AgingStep.Milliseconds())
	lk.used.Store(time.Now().UnixNano())
	v, _ := b.tags.LoadOrStore(lane, lk)
	return v.(*laneKeys)
}

// prune forgets the lanes unused for forgetAfter that this process holds
// nothing in and waits for nothing in, so that the lanes a process has
// ever seen do not pile up (a later call simply looks the lane up again).
func (b *Backend) prune(now time.Time) {
	inUse := map[*laneKeys]bool{}
	b.mu.Lock()
	for _, l := range b.leases {
		inUse[l.lk] = true
	}
	for _, w := range b.waiters {
		inUse[w.lk] = true
	}
	b.mu.Unlock()
	b.tags.Range(func(k, v any) bool {
		lk := v.(*laneKeys)
		if !inUse[lk] && now.Sub(time.Unix(0, lk.used.Load())) > b.forgetAfter() {
			b.tags.CompareAndDelete(k, v)
		}
		return true
	})
}

// laneCount returns how many lanes the backend has in memory.
func (b *Backend) laneCount() int {
	n := 0
	b.tags.Range(func(_, _ any) bool { n++; return true })
	return n
}

// argv is lane.lua's arguments for op on lane lk, under the lane's
// settings.
func (b *Backend) argv(lk *laneKeys, op string, args ...any) []any {
	return b.appendArgv(make([]any, 0, 11+len(args)), lk, op, args...)
}

// fcall returns the whole FCALL of op for lane lk, function fn: the keys
// and the arguments that never change boxed once (lk.call), argv's after.
func (b *Backend) fcall(fn any, lk *laneKeys, op string, args ...any) []any {
	cmd := make([]any, 0, 3+len(lk.keys)+11+len(args))
	cmd = append(append(cmd, "fcall", fn), lk.call[:1+len(lk.keys)]...)
	return b.appendArgv(cmd, lk, op, args...)
}

// appendArgv appends to dst the arguments of op for lane lk (see argv).
func (b *Backend) appendArgv(dst []any, lk *laneKeys, op string, args ...any) []any {
	limit, reserve, perTenant := 0, 0, 0 // grant nothing
	var tpm, maxTokens int64
	if cfg := lk.cfg.Load(); cfg != nil {
		limit, reserve = cfg.MaxInflight, cfg.Reserve()
		if f := cfg.Fairness; f != nil {
			perTenant = f.MaxInflightPerTenant
		}
		tpm, maxTokens = cfg.TokensPerMinute, cfg.MaxInflightTokens
	}
	now := ""
	if b.cfg.Clock != nil {
		now = strconv.FormatInt(b.cfg.Clock.Now().UnixMilli(), 10)
	}
	fixed := lk.call[1+len(lk.keys):] // channel, tag, lease TTL, aging step
	dst = append(dst, op, fixed[0], fixed[1], fixed[2], limit, reserve, fixed[3], perTenant, now, tpm, maxTokens)
	return append(dst, args...)
}

// run runs one op of lane.lua for lane lk, under the lane's settings.
func (b *Backend) run(ctx context.Context, lk *laneKeys, op string, args ...any) (any, error) {
	return b.runOn(ctx, b.rdb, lk, op, args...)
}

// runOn runs op on client c. A pool with no connection free in time
// (redis.ErrPoolTimeout) is this process's own congestion, not Redis
// down: the op waits on for a connection for as long as ctx lasts.
func (b *Backend) runOn(ctx context.Context, c redis.UniversalClient, lk *laneKeys, op string, args ...any) (any, error) {
	for {
		v, err := b.eng.run(ctx, c, lk.keys, func(fn any) []any { return b.fcall(fn, lk, op, args...) }).Result()
		switch {
		case errors.Is(err, redis.ErrPoolTimeout) && ctx.Err() == nil:
			continue
		case errors.Is(err, redis.Nil):
			return nil, nil
		}
		return v, err
	}
}

// states runs lane.lua's state op for every lane of lks in one pipeline:
// one round trip for a snapshot, however many lanes (a Cluster splits it
// by node).
func (b *Backend) states(ctx context.Context, lks []*laneKeys) ([]*redis.Cmd, error) {
	keys := make([][]string, len(lks))
	for i, lk := range lks {
		keys[i] = lk.keys
	}
	return b.eng.pipelined(ctx, b.rdb, keys, func(i int) []any { return b.argv(lks[i], "state") })
}

// listen wakes the waiters named in grant messages.
func (b *Backend) listen() {
	defer b.wg.Done()
	ch := b.sub.Channel()
	for {
		select {
		case <-b.stop:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			tag, ids, _ := strings.Cut(m.Payload, " ")
			b.mu.Lock()
			for _, id := range strings.Split(ids, ",") {
				if w := b.waiters[tag+" "+id]; w != nil {
					select {
					case w.wake <- struct{}{}:
					default:
					}
				}
			}
			b.mu.Unlock()
		}
	}
}

// down reports whether Redis is taken to be down, and the channel that
// closes when it goes down.
func (b *Backend) down() (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isDown, b.downCh
}

// markDown takes Redis to be down after err.
func (b *Backend) markDown(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isDown {
		return
	}
	b.isDown = true
	close(b.downCh)
	b.upCh = make(chan struct{})
	if b.local != nil {
		go b.occupy()
	}
	b.log.Warn("sharedlane: Redis is unreachable: lanes fall back", "mode", b.cfg.OnRedisDown,
		"local_max_inflight", b.cfg.LocalMaxInflight, "err", redactErr(err, b.url))
}

// KeepsTokenBudgets reports true: lane.lua decides the token budgets with
// the slot (limiter.TokenBackend). A nil *Backend answers it too, so that a
// configuration can be checked for shared lanes before the backend exists:
// cfg.ValidateFor((*sharedlane.Backend)(nil)).
func (b *Backend) KeepsTokenBudgets() bool { return true }

// Reload puts the lanes keys under cfg (limiter.Reloader): their waiters,
// in every process, get at once what it allows, and what the provider's
// headers said of them is forgotten in Redis, so that a reload starts
// them from a clean slate. A lane Redis cannot be reached for within ctx
// takes cfg at its next acquisition here, and the provider's word binds
// for at most two provider windows. An op of the lane already sent under
// the old settings (a waiter's poll, a snapshot's read) still decides
// under them in Redis, once: for that round trip this process is as
// late as one not yet reloaded.
func (b *Backend) Reload(ctx context.Context, keys []string, cfg limiter.Config) {
	for _, k := range keys {
		lk := b.keysOf(k)
		c := cfg
		lk.cfg.Store(&c)
		if _, err := b.run(ctx, lk, "reload"); err != nil {
			if !isScriptError(err) {
				b.markDown(err)
			}
			return
		}
	}
}

// Lanes reports the lanes' global state (see limiter.Backend).
func (b *Backend) Lanes(ctx context.Context, keys []string) map[string]limiter.SharedLane {
	out := map[string]limiter.SharedLane{}
	if isDown, _ := b.down(); isDown {
		state := limiter.BackendLocalFallback
		if b.cfg.OnRedisDown == OnDownClosed {
			state = limiter.BackendUnavailable
		}
		for _, k := range keys {
			out[k] = limiter.SharedLane{State: state}
		}
		return out
	}
	lks := make([]*laneKeys, len(keys))
	for i, k := range keys {
		lks[i] = b.keysOf(k)
	}
	cmds, err := b.states(ctx, lks)
	if err != nil && ctx.Err() == nil && !isScriptError(err) {
		b.markDown(err)
	}
	for i, k := range keys {
		v, err := cmds[i].Result()
		if err != nil {
			continue // not known in time: the limiter shows what it read last
		}
		r, _ := v.([]any)
		if len(r) < 22 {
			continue
		}
		num := func(i int) int64 { n, _ := strconv.ParseInt(fmt.Sprint(r[i]), 10, 64); return n }
		now := num(0)
		s := limiter.SharedLane{State: limiter.BackendOK, Holders: map[string]int{},
			QueuedByPriority: limiter.QueuedByPriority{Interactive: int(num(1)), Default: int(num(2)), Bulk: int(num(3))}}
		if since := fmt.Sprint(r[4]); since != "" {
			s.QueuedFor = time.Duration(now-num(4)) * time.Millisecond
		}
		if oldest := fmt.Sprint(r[5]); oldest != "" {
			s.OldestWait = time.Duration(now-num(5)) * time.Millisecond
		}
		if lvl := fmt.Sprint(r[6]); lvl != "" {
			n := num(6)
			s.TokensRemaining = &n
		}
		if f, err := strconv.ParseFloat(fmt.Sprint(r[7]), 64); err == nil {
			s.TokensInflight = int64(f)
		}
		s.Provider = providerOf(r[8:22])
		for _, h := range r[22:] {
			// "class|tenant|granted|charge|weight|estimate|cost|call|grant|process|base"
			// (lane.lua, hc; an older version's lacks base)
			f := strings.Split(fmt.Sprint(h), "|")
			s.Holders[f[min(9, len(f)-1)]]++
			s.Inflight++
		}
		out[k] = s
	}
	return out
}

// providerOf reads the provider's word from the state op's fields (see
// lane.lua): tokens and requests (remaining, limit, reset in ms), the
// hold left (ms) and the age (ms, empty if never said); a concurrency
// 429's hold left (ms) and the calls in flight at it; the provider's own
// token limit and how long it binds (ms; empty for none); how long the
// tokens' and the requests' budgets bind (ms).
func providerOf(r []any) *limiter.ProviderSnapshot {
	str := func(i int) string { return fmt.Sprint(r[i]) }
	num := func(i int) int64 { n, _ := strconv.ParseInt(str(i), 10, 64); return n }
	if str(7) == "" && str(10) == "" {
		return nil
	}
	budget := func(i int) *limiter.ProviderBudgetSnapshot {
		if str(i) == "" {
			return nil
		}
		return &limiter.ProviderBudgetSnapshot{Remaining: num(i), Limit: num(i + 1), Reset: limiter.Seconds(float64(num(i+2)) / 1e3),
			Binds: limiter.Seconds(float64(num(12+i/3)) / 1e3)}
	}
	p := &limiter.ProviderSnapshot{Age: limiter.Seconds(float64(num(7)) / 1e3), Tokens: budget(0), Requests: budget(3),
		RetryAfter: limiter.Seconds(float64(num(6)) / 1e3)}
	if hold := num(8); hold > 0 {
		p.Concurrency = &limiter.ConcurrencySnapshot{InflightAt429: int(num(9)), Hold: limiter.Seconds(float64(hold) / 1e3)}
	}
	if str(10) != "" {
		p.TokenLimit = &limiter.AnnouncedLimitSnapshot{Limit: num(10), Binds: limiter.Seconds(float64(num(11)) / 1e3)}
	}
	return p
}

// isScriptError reports an error Redis answered (a bug), as opposed to one
// of reaching it.
func isScriptError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
