package sharedlane

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/limiter"
)

// occupy holds the only connection of p's call pool (the URL's pool_size=1)
// for d with a blocking command, and returns once Redis has it blocked.
func occupy(t *testing.T, r *redistest.Server, p *process, d time.Duration) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		// The context's end, not BLPOP's own timeout, frees the connection:
		// go-redis closes a connection whose command it stopped waiting for.
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		done <- p.b.rdb.Do(ctx, "BLPOP", "llmlanes-test:nothing", 0).Err()
	}()
	eventually(t, "the pool's connection blocked", func() bool {
		info, _ := r.Do("INFO clients")
		return strings.Contains(info, "blocked_clients:1")
	})
	return done
}

// A pool with no connection free in time is this process's own congestion,
// not Redis down: a call waits on for a connection, and is served by
// Redis, not by the fallback lanes. (Before, the pool's timeout took Redis
// for down: the 3,000 cancels of TestMassCancel, under load, did.)
func TestFullPoolIsNotRedisDown(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	var log logbuf.Buffer
	p := newProcess(t, r.URL()+"?pool_size=1&pool_timeout=20ms", "p", limiter.Config{MaxInflight: 2, QueueTimeout: time.Minute},
		func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&log, nil)) })
	blocked := occupy(t, r, p, 500*time.Millisecond) // 25 pool timeouts
	s, err := p.lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	<-blocked
	if isDown, _ := p.b.down(); isDown || strings.Contains(log.String(), "unreachable") {
		t.Fatalf("a full pool took Redis for down:\n%s", log.String())
	}
	if ln := p.lim.Snapshot().Lanes[0]; ln.Shared == nil || ln.Shared.State != limiter.BackendOK || ln.Inflight != 1 {
		t.Fatalf("the slot is not held in Redis: %+v", ln)
	}
	s.Release()
}

// The renewals have a connection of their own: a process whose calls keep
// its pool busy for longer than a renewal may take (here its only
// connection, for 2.5 lease TTLs) neither takes Redis for down nor loses
// the slot it holds.
func TestRenewalsDoNotQueueBehindCalls(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	var log logbuf.Buffer
	p := newProcess(t, r.URL()+"?pool_size=1", "p", limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute},
		func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&log, nil)); c.LeaseTTL = 2 * time.Second })
	r.WaitUptime(2 * time.Second) // the quiet time after a start is one lease TTL
	s, err := p.lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	<-occupy(t, r, p, 5*time.Second)
	if isDown, _ := p.b.down(); isDown || strings.Contains(log.String(), "unreachable") || strings.Contains(log.String(), "lost") {
		t.Fatalf("a busy pool stopped the renewals:\n%s", log.String())
	}
	select {
	case <-s.Lost():
		t.Fatal("the slot was lost")
	default:
	}
	if ln := p.lim.Snapshot().Lanes[0]; ln.Shared == nil || ln.Shared.State != limiter.BackendOK || ln.Inflight != 1 {
		t.Fatalf("the slot is not held in Redis: %+v", ln)
	}
}
