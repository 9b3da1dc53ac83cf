package sharedlane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/lanescenario"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// TestScenarios runs package limiter's scenario files on lane.lua, in a
// real redis-server, on the scenario's clock (Config.Clock): the output
// must be the in-process limiter's, line for line, but where a file marks
// a line as one engine's, with the reason.
func TestScenarios(t *testing.T) {
	t.Parallel()
	e := &shared{r: startRedis(t)}
	t.Cleanup(func() { e.ranAs(t, false) }) // once the files' subtests are over
	lanescenario.RunDir(t, "../limiter/testdata/scenarios", e)
}

// TestScenariosAsScript runs them on a redis-server without functions
// (FUNCTION and FCALL renamed away, as on a Redis before 7.0, or an ACL
// that forbids them): lane.lua runs as a script, with the same answers.
func TestScenariosAsScript(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, "rename-command FCALL no-fcall", "rename-command FUNCTION no-function")
	r.WaitUptime(time.Second)
	e := &shared{r: r}
	t.Cleanup(func() { e.ranAs(t, true) })
	lanescenario.RunDir(t, "../limiter/testdata/scenarios", e)
}

// TestScenariosWithoutHeadIndex runs them on lanes that lose their index
// of the tenants' first arrivals (q<c>@@@) before every command, as a lane
// kept in Redis from before it was: lane.lua reads the tied tenants' heads
// one by one instead, with the same answers.
func TestScenariosWithoutHeadIndex(t *testing.T) {
	t.Parallel()
	lanescenario.RunDir(t, "../limiter/testdata/scenarios", &headless{shared{r: startRedis(t)}})
}

type headless struct{ shared }

func (e *headless) Step(t testing.TB, lim *limiter.Limiter) {
	e.mu.Lock()
	b := e.of[lim]
	e.mu.Unlock()
	lk := b.keysOf(lanescenario.Lane)
	for _, q := range lk.keys[4:7] {
		if err := b.rdb.Del(context.Background(), q+"@@@").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// ranAs fails t unless every backend of e ran lane.lua as a script
// (script) or as a function.
func (e *shared) ranAs(t *testing.T, script bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.of) == 0 {
		t.Fatal("no backend ran")
	}
	for _, b := range e.of {
		if b.eng.eval.Load() != script {
			t.Fatalf("a backend ran lane.lua as a script: %v, want %v", b.eng.eval.Load(), script)
		}
	}
}

type shared struct {
	r  *redistest.Server
	n  atomic.Int64
	mu sync.Mutex
	of map[*limiter.Limiter]*Backend
}

func (*shared) Name() string { return "shared" }

func (e *shared) New(t testing.TB, cfg limiter.Config, clock *limitertest.Clock) (*limiter.Limiter, error) {
	// An hour's lease: the scenario's clock moves by minutes while the
	// leases are never renewed (that runs on the system's clock). No poll
	// either (PollEvery an hour, also on the system's clock): a poll's op
	// carries the settings as they were when it was sent, and one still on
	// its way when the next step reloads would grant under the old ones (a
	// process is a round trip late, as one not yet reloaded is), at a
	// moment the machine's load decides. Every grant here comes from a
	// step's own ops and the snapshots' reads (state), which sweep and
	// dispatch too.
	b, err := New(Config{URL: e.r.URL(), Process: "p", KeyPrefix: fmt.Sprintf("scenario%d", e.n.Add(1)),
		LeaseTTL: time.Hour, PollEvery: time.Hour, Clock: clock, Log: quiet})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { b.Close() })
	// With no poll, a grant reaches its waiter by the grants' channel
	// alone: wait until Redis has the backend's subscription.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		subs, err := b.rdb.PubSubNumSub(context.Background(), b.channel).Result()
		if err != nil {
			return nil, err
		}
		if subs[b.channel] > 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the grants' channel %s has no subscriber after 10s", b.channel)
		}
	}
	// The lane grants nothing for one lease after the server's start, as
	// its clock tells: the scenario's starts long after.
	lk := b.keysOf(lanescenario.Lane)
	if err := b.rdb.HSet(context.Background(), lk.keys[8], "boot", clock.Now().Add(-2*time.Hour).UnixMilli()).Err(); err != nil {
		return nil, err
	}
	lim, err := limiter.New(cfg, limiter.WithBackend(b), limiter.WithClock(clock))
	if err == nil {
		e.mu.Lock()
		if e.of == nil {
			e.of = map[*limiter.Limiter]*Backend{}
		}
		e.of[lim] = b
		e.mu.Unlock()
	}
	return lim, err
}

// Queue reads the lane's waiters (qc) and the tenants' service (t) from
// Redis.
func (e *shared) Queue(t testing.TB, lim *limiter.Limiter, lane string) lanescenario.Queue {
	ctx := context.Background()
	e.mu.Lock()
	b := e.of[lim]
	e.mu.Unlock()
	rdb, lk := b.rdb, b.keysOf(lane)
	qc, err := rdb.HGetAll(ctx, lk.keys[3]).Result()
	if err != nil {
		t.Fatal(err)
	}
	var q lanescenario.Queue
	names := map[string]bool{limiter.DefaultTenant: true}
	for id, v := range qc {
		f := strings.Split(v, "|")
		class, _ := strconv.Atoi(f[0])
		at, _ := strconv.ParseInt(f[1], 10, 64)
		seq, err := strconv.ParseUint(id[:16], 16, 64)
		if err != nil {
			t.Fatalf("waiter %q: %v", id, err)
		}
		tokens, _ := strconv.ParseInt(f[5], 10, 64)
		q.Waiters = append(q.Waiters, lanescenario.Waiter{Class: limiter.Priority(class) + limiter.Interactive, Tenant: f[3],
			Arrival: time.UnixMilli(at), Seq: seq, Tokens: tokens})
		names[f[3]] = true
	}
	ts, err := rdb.HGetAll(ctx, lk.keys[9]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := rdb.HExists(ctx, lk.keys[8], "ms").Result(); !ms {
		return q
	}
	for k := range ts {
		if name, ok := strings.CutPrefix(k, "v:"); ok {
			names[name] = true
		}
	}
	hc, err := rdb.HVals(ctx, lk.keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range hc {
		names[strings.Split(v, "|")[1]] = true
	}
	q.Service = map[string]float64{}
	for name := range names {
		q.Service[name], _ = strconv.ParseFloat(ts["v:"+name], 64)
	}
	return q
}
