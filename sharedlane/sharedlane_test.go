package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/telemetry"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := leaktest.Check(goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const lane = "https://gw/v1|protolabs/smart"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startRedis starts a redis-server and waits out its quiet time (no grant
// for one lease TTL after Redis starts; the tests' lease is 1 s).
func startRedis(t *testing.T) *redistest.Server {
	r := redistest.Start(t)
	r.WaitUptime(time.Second)
	return r
}

// process is one limiter on a shared backend: what one process has.
type process struct {
	b   *Backend
	lim *limiter.Limiter
}

func newProcess(t *testing.T, url, name string, cfg limiter.Config, tweak ...func(*Config)) *process {
	t.Helper()
	c := Config{URL: url, Process: name, LeaseTTL: time.Second, PollEvery: 50 * time.Millisecond, Log: quiet}
	for _, f := range tweak {
		f(&c)
	}
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	opts := []limiter.Option{limiter.WithBackend(b)}
	if c.Clock != nil {
		opts = append(opts, limiter.WithClock(c.Clock)) // arrivals on the lane's clock
	}
	lim, err := limiter.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &process{b: b, lim: lim}
}

// call is an acquisition running in the background.
type call struct {
	slot   limiter.Slot
	err    error
	done   chan struct{}
	cancel context.CancelFunc
}

func (p *process) start(ctx context.Context, prio limiter.Priority) *call {
	c := &call{done: make(chan struct{})}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		c.slot, c.err = p.lim.Acquire(limiter.WithPriority(ctx, prio), lane)
	}()
	return c
}

func (c *call) wait(t *testing.T) *call {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the acquisition did not end")
	}
	return c
}

func (c *call) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// queuedGlobally waits until the lane has n waiters in Redis.
func queuedGlobally(t *testing.T, p *process, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s := p.lim.Snapshot()
		if len(s.Lanes) == 1 && s.Lanes[0].Queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d queued: %+v", n, s)
		}
	}
}

// Two processes share one lane of 2: the third call waits whichever
// process makes it, and a release in one grants the waiter in the other.
func TestTwoProcessesShareOneLimit(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	cfg := limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute}
	a, b := newProcess(t, r.URL(), "a", cfg), newProcess(t, r.URL(), "b", cfg)
	ctx := context.Background()
	c1 := a.start(ctx, limiter.Default).wait(t)
	c2 := b.start(ctx, limiter.Default).wait(t)
	if c1.err != nil || c2.err != nil {
		t.Fatal(c1.err, c2.err)
	}
	c3 := b.start(ctx, limiter.Default)
	queuedGlobally(t, a, 1)
	if c3.ended() {
		t.Fatal("a third call was granted past the limit")
	}
	s := a.lim.Snapshot().Lanes[0]
	if s.Inflight != 2 || s.Shared == nil || s.Shared.State != limiter.BackendOK || s.Shared.ProcessInflight != 1 ||
		s.Shared.Holders["a"] != 1 || s.Shared.Holders["b"] != 1 {
		t.Fatalf("snapshot %+v %+v", s, s.Shared)
	}
	c1.slot.Release()
	if c3.wait(t).err != nil {
		t.Fatal(c3.err)
	}
	c2.slot.Release()
	c3.slot.Release()
	noResidue(t, r)
}

// noResidue waits until Redis holds no key of the lanes (the meta key
// outlives the lane by 4 leases).
func noResidue(t *testing.T, r *redistest.Server) {
	t.Helper()
	noResidueWithin(t, r, 10*time.Second)
}

// noResidueWithin is noResidue, waiting up to d for the keys to expire
// (four lease TTLs after the lane's last op).
func noResidueWithin(t *testing.T, r *redistest.Server, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		keys := r.Keys()
		if len(keys) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, k := range keys {
				typ, _ := r.Do("TYPE " + k)
				var v string
				switch typ {
				case "zset":
					v, _ = r.Do("ZRANGE " + k + " 0 -1 WITHSCORES")
				case "hash":
					v, _ = r.Do("HGETALL " + k)
				}
				now, _ := r.Do("TIME")
				t.Logf("left: %s (%s) at Redis time %q: %q", k, typ, now, v)
			}
			t.Fatalf("Redis still holds %v", keys)
		}
	}
}

// 2. Global priority: with the lane full, bulk calls queued in process A
// and an interactive call arriving later in B: B's call is granted first.
func TestGlobalPriority(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	cfg := limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute, InteractiveReserve: 0}
	a, b := newProcess(t, r.URL(), "a", cfg), newProcess(t, r.URL(), "b", cfg)
	ctx := context.Background()
	held := a.start(ctx, limiter.Default).wait(t)
	bulk1, bulk2 := a.start(ctx, limiter.Bulk), a.start(ctx, limiter.Bulk)
	queuedGlobally(t, a, 2)
	chat := b.start(ctx, limiter.Interactive)
	queuedGlobally(t, a, 3)
	held.slot.Release()
	if chat.wait(t).err != nil {
		t.Fatal(chat.err)
	}
	if bulk1.ended() || bulk2.ended() {
		t.Fatal("a bulk call went before the interactive one")
	}
	chat.slot.Release()
	first := <-firstOf(bulk1, bulk2)
	first.slot.Release()
	for _, c := range []*call{bulk1, bulk2} {
		c.wait(t).slot.Release()
	}
	noResidue(t, r)
}

// firstOf returns the first of the calls to end.
func firstOf(cs ...*call) <-chan *call {
	out := make(chan *call, len(cs))
	for _, c := range cs {
		go func() { <-c.done; out <- c }()
	}
	return out
}

// 2. Aging on Redis' clock (a step of 500 ms here; 60 s by default): a
// bulk call that has waited more than two steps
// goes before a default call that arrived later; one that has not, does
// not.
func TestAgingOnRedisClock(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	cfg := limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute}
	step := func(c *Config) { c.AgingStep = 500 * time.Millisecond }
	a, b := newProcess(t, r.URL(), "a", cfg, step), newProcess(t, r.URL(), "b", cfg, step)
	ctx := context.Background()
	held := a.start(ctx, limiter.Default).wait(t)
	old := a.start(ctx, limiter.Bulk)
	queuedGlobally(t, a, 1)
	time.Sleep(1200 * time.Millisecond) // two steps and some: the bulk call ranks as interactive
	late := b.start(ctx, limiter.Default)
	queuedGlobally(t, a, 2)
	held.slot.Release()
	if old.wait(t).err != nil {
		t.Fatal(old.err)
	}
	if late.ended() {
		t.Fatal("the later default call went before the aged bulk call")
	}
	old.slot.Release()
	late.wait(t).slot.Release()

	// Without the wait, the default call goes first. These processes age
	// by the default step (60 s), so however slowly this machine runs, the
	// young bulk call cannot age past the default one.
	a, b = newProcess(t, r.URL(), "a2", cfg), newProcess(t, r.URL(), "b2", cfg)
	held = a.start(ctx, limiter.Default).wait(t)
	young := a.start(ctx, limiter.Bulk)
	queuedGlobally(t, a, 1)
	def := b.start(ctx, limiter.Default)
	queuedGlobally(t, a, 2)
	held.slot.Release()
	if def.wait(t).err != nil || young.ended() {
		t.Fatal("a young bulk call went before a default one")
	}
	def.slot.Release()
	young.wait(t).slot.Release()
	noResidue(t, r)
}

// The reserve across processes: limit 3, reserve 1: two bulk calls in
// flight (in different processes) keep a third one waiting, while an
// interactive call is granted at once.
func TestReserveAcrossProcesses(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	cfg := limiter.Config{MaxInflight: 3, QueueTimeout: time.Minute, InteractiveReserve: 1}
	a, b := newProcess(t, r.URL(), "a", cfg), newProcess(t, r.URL(), "b", cfg)
	ctx := context.Background()
	x := a.start(ctx, limiter.Bulk).wait(t)
	y := b.start(ctx, limiter.Bulk).wait(t)
	z := a.start(ctx, limiter.Bulk)
	queuedGlobally(t, a, 1)
	chat := b.start(ctx, limiter.Interactive).wait(t)
	if chat.err != nil || z.ended() {
		t.Fatalf("interactive %v, third bulk ended %v", chat.err, z.ended())
	}
	x.slot.Release()
	z.wait(t).slot.Release()
	y.slot.Release()
	chat.slot.Release()
	noResidue(t, r)
}

// A queue timeout is a *QueueTimeoutError and leaves nothing queued; a
// canceled wait returns the context's error and leaves nothing either.
func TestTimeoutAndCancelLeaveNothing(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	cfg := limiter.Config{MaxInflight: 1, QueueTimeout: 300 * time.Millisecond}
	a, b := newProcess(t, r.URL(), "a", cfg), newProcess(t, r.URL(), "b", cfg)
	held := a.start(context.Background(), limiter.Default).wait(t)
	late := b.start(context.Background(), limiter.Default).wait(t)
	var qe *limiter.QueueTimeoutError
	if !errors.As(late.err, &qe) || qe.Lane != lane || qe.Waited < 300*time.Millisecond {
		t.Fatalf("err %v", late.err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := b.start(ctx, limiter.Default)
	queuedGlobally(t, a, 1)
	cancel()
	if !errors.Is(gone.wait(t).err, context.Canceled) {
		t.Fatalf("err %v", gone.err)
	}
	queuedGlobally(t, a, 0)
	held.slot.Release()
	s := a.lim.Snapshot().Lanes[0]
	if s.Inflight != 0 || s.Queued != 0 || s.QueueTimeouts5m != 0 {
		t.Fatalf("a: %+v", s)
	}
	if s := b.lim.Snapshot().Lanes[0]; s.QueueTimeouts5m != 1 {
		t.Fatalf("b counts %d queue timeouts", s.QueueTimeouts5m)
	}
	noResidue(t, r)
}

// A process cut off from Redis while it holds a slot loses it (the slot's
// Lost channel closes, and lanehttp stops the call) before the slot's lease
// lapses in Redis, that is before Redis can grant it to anyone else; the
// process waiting elsewhere then gets it.
func TestCutOffHolderStopsFirst(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	proxy := redistest.NewProxy(t, r.Addr())
	cfg := limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute}
	// A lease of 5 s: the holder gives its slot up a fifth of a lease
	// before Redis frees it, and a fifth of the tests' usual 1 s was less
	// than a loaded machine can delay a goroutine by.
	lease5 := func(c *Config) { c.LeaseTTL = 5 * time.Second }
	closed := func(c *Config) { c.OnRedisDown = OnDownClosed }
	a := newProcess(t, "redis://"+proxy.Addr(), "a", cfg, closed, lease5)
	b := newProcess(t, r.URL(), "b", cfg, lease5)
	held := a.start(context.Background(), limiter.Default).wait(t)
	if held.err != nil {
		t.Fatal(held.err)
	}
	waiting := b.start(context.Background(), limiter.Default)
	queuedGlobally(t, b, 1)
	proxy.Block()
	var expiry int64 // a's lease in Redis, on Redis' clock (this host's)
	for _, k := range r.Keys() {
		if strings.HasSuffix(k, ":h") {
			out, _ := r.Do("ZRANGE " + k + " 0 -1 WITHSCORES")
			parts := strings.Split(out, "\n")
			expiry, _ = strconv.ParseInt(parts[len(parts)-1], 10, 64)
		}
	}
	select {
	case <-held.slot.Lost():
	case <-time.After(15 * time.Second):
		t.Fatal("the cut-off holder never lost its slot")
	}
	lostAt := time.Now().UnixMilli()
	if lostAt >= expiry {
		t.Fatalf("the slot was lost at %d, after its lease lapsed in Redis at %d", lostAt, expiry)
	}
	if w := waiting.wait(t); w.err != nil {
		t.Fatal(w.err)
	}
	t.Logf("lost %d ms before the lease lapsed; the other process then got the slot", expiry-lostAt)
	waiting.slot.Release()
	held.slot.Release()
}

// lanehttp stops a streaming call whose shared slot is lost, with
// ErrSlotLost, and tells the gateway (its request ends).
func TestTransportStopsLostCall(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	proxy := redistest.NewProxy(t, r.Addr())
	ended := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-req.Context().Done():
				close(ended)
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	defer up.Close()
	p := newProcess(t, "redis://"+proxy.Addr(), "a", limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute},
		func(c *Config) { c.OnRedisDown = OnDownClosed })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: &lanehttp.Transport{Limiter: p.lim, Base: tr}}
	res, err := client.Post(up.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	proxy.Block()
	_, err = io.Copy(io.Discard, res.Body)
	if !errors.Is(err, lanehttp.ErrSlotLost) {
		t.Fatalf("reading the stream: %v, want ErrSlotLost", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request went on")
	}
}

// An adaptive limit is per process: a grant is decided, in Redis, with
// the limit of the process whose call decides it. Process a has learned
// a limit of 2 (ceiling 8), process b has a fixed 8: with 2 held, a's call
// queues (its own acquisition, decided with a's 2); b's next op, its next
// call or a renewal, decided with b's 8, grants it.
func TestAdaptiveLimitIsPerProcess(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	enqueued := make(chan struct{}, 4)
	a := newProcess(t, r.URL(), "a", limiter.Config{MaxInflight: 8, QueueTimeout: time.Minute,
		Adaptive: &limiter.Adaptive{MinInflight: 1, Initial: 2}})
	a.lim, _ = limiter.New(a.lim.Config(), limiter.WithBackend(a.b), limiter.WithObserver(func(_ context.Context, e limiter.Event) {
		if e.Kind == limiter.Enqueued {
			enqueued <- struct{}{}
		}
	}))
	b := newProcess(t, r.URL(), "b", limiter.Config{MaxInflight: 8, QueueTimeout: time.Minute})
	ctx := context.Background()
	// a's probe: one call, one first byte; then a starts at 2.
	probe := a.start(ctx, limiter.Default).wait(t)
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	a.lim.RecordFirstByte(ctx, lane, limiter.FirstByte{Sent: time.Now(), After: time.Second, RequestBytes: 1000})
	probe.slot.Release()
	if s := a.lim.Snapshot().Lanes[0]; s.Limit != 2 || s.Adaptive == nil || s.Adaptive.Probing {
		t.Fatalf("a after its probe: limit %d, %+v", s.Limit, s.Adaptive)
	}
	b1, b2 := b.start(ctx, limiter.Default).wait(t), b.start(ctx, limiter.Default).wait(t)
	if b1.err != nil || b2.err != nil {
		t.Fatal(b1.err, b2.err)
	}
	ac := a.start(ctx, limiter.Default)
	select {
	case <-enqueued: // queued by its own acquisition, under a's limit of 2
	case <-ac.done:
		t.Fatal("a's call was granted past a's limit of 2")
	}
	b3 := b.start(ctx, limiter.Default).wait(t)
	if b3.err != nil || ac.wait(t).err != nil {
		t.Fatal(b3.err, ac.err)
	}
	if s := b.lim.Snapshot().Lanes[0]; s.Inflight != 4 || s.Limit != 8 {
		t.Fatalf("b's view: %d in flight, limit %d; want 4 under b's 8", s.Inflight, s.Limit)
	}
	for _, c := range []*call{b1, b2, b3, ac} {
		c.slot.Release()
	}
	noResidue(t, r)
}

// A renewal that finds a lease gone from Redis takes the slot again
// (Redis restarted); if the call released it meanwhile, the slot taken
// again is given back, not kept and renewed with no call behind it.
func TestReclaimRacingRelease(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, "enable-debug-command yes")
	r.WaitUptime(time.Second)
	p := newProcess(t, r.URL(), "a", limiter.Config{MaxInflight: 4, QueueTimeout: time.Minute})
	leaseOf := func() (*lease, string) {
		c := p.start(context.Background(), limiter.Default).wait(t)
		if c.err != nil {
			t.Fatal(c.err)
		}
		p.b.mu.Lock()
		defer p.b.mu.Unlock()
		for k, l := range p.b.leases {
			// The call ends without its Release (which would also end the
			// lease in Redis): the lease alone is what the test races.
			return l, k
		}
		t.Fatal("no lease")
		return nil, ""
	}
	release := func(k string) {
		p.b.mu.Lock()
		delete(p.b.leases, k)
		p.b.mu.Unlock()
	}
	leases := func() int {
		p.b.mu.Lock()
		defer p.b.mu.Unlock()
		return len(p.b.leases)
	}

	// Released before the reclaim runs. (The lane has room: the reclaim
	// would take a slot.)
	l, k := leaseOf()
	release(k)
	p.b.reclaim(l)
	if n := leases(); n != 0 {
		t.Fatalf("released before: %d leases kept", n)
	}
	// Released while the reclaim's script waits behind a busy Redis.
	l, k = leaseOf()
	go r.Do("DEBUG SLEEP 0.5")
	time.Sleep(100 * time.Millisecond)
	done := make(chan struct{})
	go func() { p.b.reclaim(l); close(done) }()
	time.Sleep(100 * time.Millisecond)
	release(k)
	<-done
	if n := leases(); n != 0 {
		t.Fatalf("released during: %d leases kept", n)
	}
	// In Redis: only the two leases the test took and let lapse; the
	// reclaimed slots were given back.
	for deadline := time.Now().Add(10 * time.Second); p.lim.Snapshot().Lanes[0].Inflight != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lane in Redis still counts %d in flight", p.lim.Snapshot().Lanes[0].Inflight)
		}
	}
	noResidue(t, r)
}

// A holder that dies (its backend closed without releasing: no renewal,
// no release) leaves nothing in Redis once nobody calls its lane: every key
// of the lane expires four lease TTLs after the lane's last op. (Before,
// the holders' keys had no TTL and stayed for ever.)
func TestDeadHolderLeavesNoKeys(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	p := newProcess(t, r.URL(), "doomed", limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute})
	c := p.start(context.Background(), limiter.Default).wait(t)
	if c.err != nil {
		t.Fatal(c.err)
	}
	if len(r.Keys()) == 0 {
		t.Fatal("no keys for the held slot")
	}
	p.b.Close() // dies holding its slot
	for deadline := time.Now().Add(15 * time.Second); len(r.Keys()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a dead holder's lane still has %v in Redis after four lease TTLs", r.Keys())
		}
	}
}

// Reading a lane's figures (a snapshot, as every scrape and lanes-exporter's
// history take) does not keep its keys alive: a lane nobody calls is gone
// from Redis four lease TTLs after its last call, however often it is read.
func TestReadsKeepNoLaneAlive(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	p := newProcess(t, r.URL(), "reader", limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute})
	s, err := p.lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	s.Release()
	if len(r.Keys()) == 0 {
		t.Fatal("no keys for the lane")
	}
	for deadline := time.Now().Add(15 * time.Second); len(r.Keys()) > 0; time.Sleep(100 * time.Millisecond) {
		if l := p.lim.Snapshot().Lanes; len(l) == 1 && l[0].Shared.State != limiter.BackendOK {
			t.Fatalf("a read failed: %+v", l[0].Shared)
		}
		if time.Now().After(deadline) {
			t.Fatalf("read every 100 ms, the lane still has %v in Redis after four lease TTLs", r.Keys())
		}
	}
	// Once its keys are gone, a read makes none again (a read that did
	// made a meta hash of one field, which the next reads kept alive).
	for range 3 {
		if l := p.b.Lanes(context.Background(), []string{lane})[lane]; l.State != limiter.BackendOK || l.Inflight != 0 {
			t.Fatalf("a read of the lane gone: %+v", l)
		}
		if k := r.Keys(); len(k) > 0 {
			t.Fatalf("a read of a lane whose keys were gone made %v", k)
		}
	}
}

// The lanes a process has seen are forgotten from its memory once unused
// for four lease TTLs with nothing held or waiting: they do not pile up.
func TestLanesForgottenWhenUnused(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	p := newProcess(t, r.URL(), "p", limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute})
	for i := range 50 {
		s, err := p.lim.Acquire(context.Background(), fmt.Sprintf("https://gw/v1|model-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		s.Release()
	}
	held, err := p.lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if n := p.b.laneCount(); n != 51 {
		t.Fatalf("%d lanes in memory, want 51", n)
	}
	for deadline := time.Now().Add(15 * time.Second); p.b.laneCount() != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes still in memory, want the one held", p.b.laneCount())
		}
	}
}

// The fallback lanes (Redis unreachable, on_redis_down local) are bounded
// as the shared ones are: max_lanes and lane_idle_ttl apply, so lanes that
// came and went leave nothing behind.
func TestFallbackLanesBounded(t *testing.T) {
	t.Parallel()
	p := newProcess(t, "redis://127.0.0.1:1", "alone", limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute, MaxLanes: 100, LaneIdleTTL: time.Second})
	for i := range 20 {
		s, err := p.lim.Acquire(context.Background(), fmt.Sprintf("https://gw/v1|model-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		s.Release()
	}
	if c := p.b.local.Config(); c.MaxLanes != 100 || c.LaneIdleTTL != time.Second {
		t.Fatalf("the fallback lanes run with max_lanes %d and lane_idle_ttl %s, want the lane's 100 and 1s", c.MaxLanes, c.LaneIdleTTL)
	}
	// A lane's idle time counts from the end of its last active 10 s
	// statistics step, and the sweep runs every lane_idle_ttl: eviction
	// comes up to 12 s after the calls, later on a loaded machine. The
	// deadline only bounds a failure.
	for deadline := time.Now().Add(30 * time.Second); p.b.local.Lanes() != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d fallback lanes still kept after lane_idle_ttl", p.b.local.Lanes())
		}
	}
}

// countingBackend is the real backend, counting the reads of the lanes'
// global figures.
type countingBackend struct {
	*Backend
	reads atomic.Int32
}

func (c *countingBackend) Lanes(ctx context.Context, keys []string) map[string]limiter.SharedLane {
	c.reads.Add(1)
	return c.Backend.Lanes(ctx, keys)
}

// A scrape reads the store once, whatever its producers (lane gauges, lane
// states) take from the snapshot.
func TestOneStoreReadPerScrape(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	b, err := New(Config{URL: r.URL(), Process: "p", LeaseTTL: time.Second, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cb := &countingBackend{Backend: b}
	tel, err := telemetry.New(telemetry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	lim, _ := limiter.New(limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute}, limiter.WithBackend(cb), limiter.WithObserver(tel.Observe))
	tel.Watch(lim)
	s, err := lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	cb.reads.Store(0)
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `llmlanes_llm_lane_state{lane="`+lane) || !strings.Contains(rec.Body.String(), "llmlanes_llm_shared_up") {
		t.Fatalf("scrape: %d\n%.300s", rec.Code, rec.Body)
	}
	if n := cb.reads.Load(); n != 1 {
		t.Fatalf("a scrape read the store %d times, want once", n)
	}
}

// The adaptive limit's drain of the reserve is a process's own (the
// difference of the two engines docs/DESIGN.md states): on a lane of 4, 1
// reserved, adaptive, with 3 default calls held, a 429 cuts the limit to
// 2; in one process an interactive call still takes the reserve, up to
// the limit before the cut, while the default calls drain; on a shared
// lane, whose grants the backend decides by the limit alone, it waits for
// them.
func TestAdaptiveDrainIsPerProcess(t *testing.T) {
	t.Parallel()
	// A lease of 5 s, not the tests' usual 1 s: under make stress a
	// renewal can come later than a second, a held slot lapses, and the
	// interactive call is granted in its place.
	r := redistest.Start(t)
	r.WaitUptime(5 * time.Second)
	cfg := limiter.Config{MaxInflight: 4, InteractiveReserve: 1, QueueTimeout: time.Minute,
		Adaptive: &limiter.Adaptive{MinInflight: 1, Initial: 4}}
	local, err := limiter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	shared := newProcess(t, r.URL(), "a", cfg, func(c *Config) { c.LeaseTTL = 5 * time.Second }).lim
	for name, lim := range map[string]*limiter.Limiter{"local": local, "shared": shared} {
		t.Run(name, func(t *testing.T) {
			p := &process{lim: lim}
			ctx := context.Background()
			probe := p.start(ctx, limiter.Default).wait(t) // the probe: one call, one first byte
			if probe.err != nil {
				t.Fatal(probe.err)
			}
			lim.RecordFirstByte(ctx, lane, limiter.FirstByte{Sent: time.Now(), After: time.Second, RequestBytes: 1000})
			probe.slot.Release()
			var held []*call
			for range 3 {
				c := p.start(ctx, limiter.Default).wait(t)
				if c.err != nil {
					t.Fatal(c.err)
				}
				held = append(held, c)
			}
			lim.RecordExchange(ctx, lane, limiter.Exchange{Outcome: limiter.OutcomeRateLimited, Status: 429, Sent: time.Now(), Duration: time.Millisecond})
			if l := lim.Snapshot().Lanes[0]; l.Limit > 2 {
				t.Fatalf("limit %d after the 429, want it cut below the 3 held", l.Limit)
			}
			chat := p.start(ctx, limiter.Interactive)
			if name == "local" {
				if chat.wait(t).err != nil {
					t.Fatal(chat.err)
				}
				chat.slot.Release()
			} else {
				for deadline := time.Now().Add(10 * time.Second); lim.Snapshot().Lanes[0].Queued != 1; time.Sleep(time.Millisecond) {
					if chat.ended() || time.Now().After(deadline) {
						t.Fatalf("shared: the interactive call did not queue (%v; the lane: %+v)", chat.err, lim.Snapshot().Lanes[0])
					}
				}
				chat.cancel()
				<-chat.done
			}
			for _, c := range held {
				c.slot.Release()
			}
		})
	}
}
