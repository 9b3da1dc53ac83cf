package sharedlane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// A Redis that loses the function library (FUNCTION FLUSH here; a restart
// with no persistence, or a new cluster node, in production) is given it
// again by the next op, which then runs: a held slot is released, a new
// one granted, and a snapshot (a pipeline of state ops) reads the lane. No
// op falls back to the script.
func TestFunctionLoadedAgain(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	p := newProcess(t, r.URL(), "p", limiter.Config{MaxInflight: 1, QueueTimeout: time.Minute})
	ctx := context.Background()
	held, err := p.lim.Acquire(ctx, lane)
	if err != nil {
		t.Fatal(err)
	}
	libs := func() string {
		out, err := r.Do("FUNCTION LIST")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if !strings.Contains(libs(), p.b.eng.fn) {
		t.Fatalf("FUNCTION LIST has no %s after a grant: %q", p.b.eng.fn, libs())
	}
	flush := func() {
		if _, err := r.Do("FUNCTION FLUSH"); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	held.Release()
	flush()
	again, err := p.lim.Acquire(ctx, lane)
	if err != nil {
		t.Fatalf("acquire after FUNCTION FLUSH: %v", err)
	}
	flush()
	if l := p.b.Lanes(ctx, []string{lane})[lane]; l.State != limiter.BackendOK || l.Inflight != 1 {
		t.Fatalf("snapshot after FUNCTION FLUSH: %+v, want the lane read, one held", l)
	}
	again.Release()
	if l := p.b.Lanes(ctx, []string{lane})[lane]; l.Inflight != 0 {
		t.Fatalf("after the release: %d held, want 0 (the first release was lost?)", l.Inflight)
	}
	if p.b.eng.eval.Load() {
		t.Fatal("the backend fell back to the script; Redis has functions")
	}
}
