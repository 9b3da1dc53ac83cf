package sharedlane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
)

// commands is how many commands Redis has run, those called from lane.lua
// included (INFO commandstats), less the INFO calls that asked.
func commands(t *testing.T, r *redistest.Server) int {
	t.Helper()
	out, err := r.Do("INFO commandstats")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(out, "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		c, _ := strconv.Atoi(v)
		n += c
	}
	return n
}

// A waiter's leave costs Redis the same few commands, each O(log n), with
// 30 or 3,000 waiters in the lane, whether it asks where it stood (a queue
// timeout) or not (a caller that gave up): it scanned the queue, a command
// per waiter, and 3,000 callers giving up at once sent the processes into
// their fallback and left most places to their leases.
func TestCancelCostDoesNotGrowWithTheQueue(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	// A lease of a minute: the whole test runs in the quiet time after
	// Redis' start, in which nothing is granted, so that every call waits,
	// and no lease lapses.
	p := newProcess(t, r.URL(), "p", limiter.Config{MaxInflight: 1, QueueTimeout: time.Hour},
		func(c *Config) { c.LeaseTTL = time.Minute })
	ctx := context.Background()
	cost := func(n int, report int) int {
		lk := p.b.keysOf(fmt.Sprintf("https://gw/v1|queue-%d-%d", n, report))
		cfg := limiter.Config{MaxInflight: 1, QueueTimeout: time.Hour}
		lk.cfg.Store(&cfg)
		ids := make([]string, n)
		for i := range n {
			// Three classes and three tenants, each call a millisecond
			// older than the next.
			v, err := p.b.run(ctx, lk, "acquire", i%3, n-i, "p", lk.lane, p.b.suffix, fmt.Sprintf("t%d", i%3), 1.0, 0)
			if err != nil {
				t.Fatal(err)
			}
			res := v.([]any)
			if res[0] != "queued" {
				t.Fatalf("call %d: %v, want queued (the quiet time)", i, res)
			}
			ids[i] = fmt.Sprint(res[1])
		}
		before := commands(t, r)
		v, err := p.b.run(ctx, lk, "cancel", ids[n/2], report)
		if err != nil {
			t.Fatal(err)
		}
		used := commands(t, r) - before
		if res, _ := v.([]any); len(res) == 0 || res[0] != "removed" || (report == 1) != (len(res) == 6) {
			t.Fatalf("cancel: %v", v)
		}
		if out, _ := r.Do("ZCARD " + lk.keys[2]); out != strconv.Itoa(n-1) {
			t.Fatalf("%s waiters left of %d", out, n)
		}
		return used
	}
	for _, report := range []int{0, 1} {
		small, large := cost(30, report), cost(3000, report)
		t.Logf("report %d: a cancel runs %d commands with 30 waiters, %d with 3,000", report, small, large)
		if large != small {
			t.Errorf("report %d: a cancel ran %d commands with 3,000 waiters, %d with 30", report, large, small)
		}
	}
}

// 3,000 callers waiting in one process give up at once: the process never
// takes Redis for down (no fallback), and once every call has returned no
// place is left in Redis.
func TestMassCancel(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	var log logbuf.Buffer
	// A lease of 30 s: 3,000 goroutines under the race detector, beside
	// another copy of the suite (make stress), held up the renewal of the
	// one slot held past a 5 s lease, and a lapsed lease hands the slot on.
	// A long lease also makes the last check stronger: a place the cancels
	// left would still be there, not lapsed.
	p := newProcess(t, r.URL(), "p", limiter.Config{MaxInflight: 1, QueueTimeout: time.Hour},
		func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&log, nil)); c.LeaseTTL = 30 * time.Second })
	held, err := p.lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	const n = 3000
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := p.lim.Acquire(ctx, lane)
			if err == nil {
				s.Release()
				err = errors.New("granted")
			}
			errs <- err
		}()
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if s := p.lim.Snapshot(); len(s.Lanes) == 1 && s.Lanes[0].Queued == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d queued: %+v", n, p.lim.Snapshot())
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a canceled call returned %v; the process's log:\n%s", err, log.String())
		}
	}
	if isDown, _ := p.b.down(); isDown || strings.Contains(log.String(), "unreachable") {
		t.Fatalf("the process took Redis for down:\n%s", log.String())
	}
	var qx string
	for _, k := range r.Keys() {
		if strings.HasSuffix(k, ":qx") {
			qx, _ = r.Do("ZCARD " + k)
		}
	}
	if qx != "" && qx != "0" {
		t.Fatalf("%s places left in Redis after every caller gave up", qx)
	}
}
