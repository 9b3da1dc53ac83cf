package sharedlane

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// chaosRestarts is how many restarts of each kind TestRestartChaos
// drives: LLMLANES_CHAOS_RESTARTS (make chaos runs 100), else 3.
func chaosRestarts(t *testing.T) int {
	v := os.Getenv("LLMLANES_CHAOS_RESTARTS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("LLMLANES_CHAOS_RESTARTS=%q: want a number of restarts", v)
	}
	return n
}

// Redis restarted under load, again and again, in turns: empty, and from a
// file written more than a lease before (as a snapshot restored after a
// crash is). Two lanes-exporter processes share a lane of 4 in front of
// the gateway simulator, 12 callers keep it full, and after every restart
// the gateway has never had more than 4 calls at work, and no call was
// cut (a running call loses its slot only when Redis has forgotten it and
// the lane has no room to take it again). on_redis_down: closed, so that
// while Redis is away calls are refused rather than run on local lanes,
// whose bound is another. The lease is 2 s, not the 1 s of most tests:
// the bound holds when every process renews within one lease of Redis'
// start (its quiet time), and under make stress's load a renewal every
// 1/6 s can come later than a second (once in 104 restarts here, with the
// race-enabled suite running beside: 6 calls at the gateway on a lane of
// 4).
func TestRestartChaos(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	n := chaosRestarts(t)
	r := startRedis(t)
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: 10 * time.Millisecond, Tokens: 20})
	var procs []*exporterProc
	for _, name := range []string{"p1", "p2"} {
		procs = append(procs, startExporter(t, gw.URL, r.URL(), name, 4, ", on_redis_down: closed, lease_ttl: 2s"))
	}
	r.WaitUptime(3 * time.Second)
	up := func() bool {
		for _, p := range procs {
			if p.metric(t, "llmlanes_llm_shared_up") != "1" {
				return false
			}
		}
		return true
	}
	l := startLoad(procs, 12)
	time.Sleep(time.Second)
	gw.Peak()
	for i := range 2 * n {
		kind := "empty"
		if i%2 == 1 {
			kind = "from a file older than a lease"
			if _, err := r.Do("SAVE"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2500 * time.Millisecond) // the lease is 2 s
		}
		if kind == "empty" {
			os.Remove(r.DumpFile()) // the last turn's file is not loaded
		}
		r.Restart()
		eventually(t, "shared_up 1 after the restart", up)
		time.Sleep(2500 * time.Millisecond) // the quiet time, and the lane full again
		if p := gw.Peak(); p > 4 {
			l.end()
			t.Fatalf("restart %d (%s): the gateway worked on %d calls at once, on a lane of 4", i+1, kind, p)
		}
	}
	count, errs := l.end()
	t.Logf("%d restarts of each kind: outcomes %v", n, count)
	if len(errs) > 0 {
		t.Fatalf("%d calls failed across the restarts: %v", len(errs), errs[0])
	}
	if count[completed] == 0 {
		t.Fatalf("outcomes %v", count)
	}
}
