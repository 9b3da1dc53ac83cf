package sharedlane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
)

// The binary of lanes-exporter, built once for the tests that run it as
// separate processes.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func exporterBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "lanes-exporter-"); binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "lanes-exporter"), "../cmd/lanes-exporter").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "lanes-exporter")
}

// gateway is the simulator, counting the requests it is working on, with
// a peak that a test can read and reset between phases. A request counts
// until it ends or its client closes the connection: the count looks at
// the sockets themselves (a peek for the client's FIN) whenever a request
// arrives, so it does not depend on how soon the server's goroutines
// notice a disconnect on a loaded machine.
type gateway struct {
	*httptest.Server
	sim    *gatewaysim.Gateway
	mu     sync.Mutex
	live   map[*http.Request]net.Conn
	peak   int
	served int
}

type connKey struct{}

func newGateway(t *testing.T, cfg gatewaysim.Config) *gateway {
	g := &gateway{sim: gatewaysim.New(cfg), live: map[*http.Request]net.Conn{}}
	g.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.live[r] = r.Context().Value(connKey{}).(net.Conn)
		g.served++
		n := 0
		for _, c := range g.live {
			if !peerClosed(c) {
				n++
			}
		}
		g.peak = max(g.peak, n)
		g.mu.Unlock()
		defer func() { g.mu.Lock(); delete(g.live, r); g.mu.Unlock() }()
		g.sim.ServeHTTP(w, r)
	}))
	g.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }
	g.Start()
	t.Cleanup(func() { g.sim.Close(); g.Close() })
	return g
}

// peerClosed reports whether the other end of c has closed it: a peek
// that reads end-of-file without waiting.
func peerClosed(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil
	})
	return closed
}

// Peak returns the most requests in progress at once since the last call.
func (g *gateway) Peak() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peak
	g.peak = 0
	for _, c := range g.live {
		if !peerClosed(c) {
			g.peak++
		}
	}
	return p
}

func (g *gateway) Served() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.served
}

// exporterProc is a lanes-exporter process.
type exporterProc struct {
	cmd  *exec.Cmd
	addr string
	out  *bytes.Buffer
	mu   *sync.Mutex
}

// startExporter runs lanes-exporter with a lane of limit in front of gw,
// shared in Redis at redisURL as process name.
func startExporter(t *testing.T, gw, redisURL, name string, limit int, shared string) *exporterProc {
	t.Helper()
	if !strings.Contains(shared, "lease_ttl") {
		shared += ", lease_ttl: 1s"
	}
	// freeAddr's port is free when it returns, not when the exporter binds
	// it: under make stress another test's process may take it first.
	for try := 0; ; try++ {
		addr := freeAddr(t)
		p, bound := tryExporter(t, name, addr, fmt.Sprintf(`listen: %s
limiter: {max_inflight: %d, queue_timeout: 5s, interactive_reserve: 1}
upstreams: [{name: gw, base_url: "%s/v1"}]
shared: {redis_url: "%s", process: %s%s}
`, addr, limit, gw, redisURL, name, shared))
		if bound || try == 4 {
			return p
		}
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runExporter runs lanes-exporter as name with configuration cfg, which
// listens on addr, and waits until it is ready.
func runExporter(t *testing.T, name, addr, cfg string) *exporterProc {
	t.Helper()
	p, _ := tryExporter(t, name, addr, cfg)
	return p
}

// tryExporter is runExporter, but for an addr another process took
// meanwhile: false then, and no process (the test goes on).
func tryExporter(t *testing.T, name, addr, cfg string) (*exporterProc, bool) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte(cfg), 0o644)
	p := &exporterProc{addr: addr, out: &bytes.Buffer{}, mu: &sync.Mutex{}}
	p.cmd = exec.Command(exporterBinary(t), "--config", file, "--log.level", "debug")
	w := &lockedWriter{mu: p.mu, w: p.out}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s's log:\n%s", name, p.out.String())
			p.mu.Unlock()
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res, err := http.Get("http://" + addr + "/-/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p, true
			}
		}
		if p.logged("address already in use") {
			return nil, false
		}
		if time.Now().After(deadline) {
			p.mu.Lock()
			defer p.mu.Unlock()
			t.Fatalf("%s never ready:\n%s", name, p.out.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// outcome of one proxied call.
type outcome string

const (
	completed   outcome = "completed"
	timedOut    outcome = "queue timeout"
	canceled    outcome = "canceled"
	unavailable outcome = "unavailable"
)

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// proxied makes one streamed call through p with class prio; it is
// canceled after cancelAfter if that is above 0.
func (p *exporterProc) call(prio string, cancelAfter time.Duration) (outcome, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cancelAfter > 0 {
		time.AfterFunc(cancelAfter, cancel)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr+"/proxy/gw/chat/completions",
		strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
	req.Header.Set("X-LLM-Priority", prio)
	res, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return canceled, nil
		}
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	switch {
	case ctx.Err() != nil:
		return canceled, nil
	case err != nil:
		return "", err
	case res.StatusCode == 200 && bytes.Contains(b, []byte("[DONE]")):
		return completed, nil
	case res.StatusCode == 503 && bytes.Contains(b, []byte("lane_queue_timeout")):
		return timedOut, nil
	case res.StatusCode == 503 && bytes.Contains(b, []byte("lane_unavailable")):
		return unavailable, nil
	}
	return "", fmt.Errorf("status %d: %s", res.StatusCode, b)
}

// snapshot reads p's snapshot.
// logged reports whether p's log so far has s in it.
func (p *exporterProc) logged(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Contains(p.out.String(), s)
}

func (p *exporterProc) snapshot(t *testing.T) map[string]any {
	res, err := http.Get("http://" + p.addr + "/api/telemetry/llm-lanes")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s struct{ Lanes []map[string]any }
	json.NewDecoder(res.Body).Decode(&s)
	if len(s.Lanes) == 0 {
		return nil
	}
	return s.Lanes[0]
}

// 1. Three lanes-exporter processes share one lane of 4 in front of the
// simulator: under 1,000 randomized calls (mixed classes, 20 % canceled at
// a random moment) the gateway never works on more than 4 at once, every
// call ends completed, timed out in the queue or canceled, and Redis keeps
// nothing once they are over.
func TestThreeProcessesOneLane(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	r := startRedis(t)
	threeProcesses(t, r.URL(), func() { r.WaitUptime(threeLeaseTTL + time.Second) }, func() { noResidueWithin(t, r, 4*threeLeaseTTL+5*time.Second) })
}

// 5. The same on a Redis Cluster of three masters, made by the test.
func TestThreeProcessesOnACluster(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	c := redistest.StartCluster(t, 3)
	quiet := func() {
		for _, n := range c.Nodes {
			n.WaitUptime(threeLeaseTTL + time.Second)
		}
	}
	threeProcesses(t, c.URL(), quiet, func() {
		for _, n := range c.Nodes {
			noResidueWithin(t, n, 4*threeLeaseTTL+5*time.Second)
		}
	})
}

// threeLeaseTTL is the three processes' lease_ttl: 3 s, not the 1 s of the
// other process tests, which wait out leases. A renewal may take up to
// lease_ttl/6 before a process takes Redis for down and runs its fallback
// lane beside the shared one (by design; then more than the lane's 4 reach
// the gateway), and under make stress, at 1 s, the three-node Cluster's
// test saw peaks of 5 and 6.
const threeLeaseTTL = 3 * time.Second

// threeProcesses runs the three processes' load on Redis at url; settled
// waits until Redis has been up for a lease TTL, clean checks what is left.
func threeProcesses(t *testing.T, url string, settled, clean func()) {
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: 2 * time.Millisecond, Tokens: 10,
		FirstTokenDelay: time.Millisecond, PropagateDisconnect: true, Seed: 1})
	var procs []*exporterProc
	for _, name := range []string{"p1", "p2", "p3"} {
		procs = append(procs, startExporter(t, gw.URL, url, name, 4, fmt.Sprintf(", lease_ttl: %s", threeLeaseTTL)))
	}
	settled()
	rng := rand.New(rand.NewPCG(7, 7))
	type job struct {
		p      *exporterProc
		prio   string
		cancel time.Duration
	}
	jobs := make(chan job, 1000)
	for range 1000 {
		j := job{p: procs[rng.IntN(3)], prio: []string{"interactive", "default", "bulk"}[rng.IntN(3)]}
		if rng.Float64() < 0.2 {
			j.cancel = time.Duration(1+rng.IntN(60)) * time.Millisecond
		}
		jobs <- j
	}
	close(jobs)
	var mu sync.Mutex
	count := map[outcome]int{}
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				o, err := j.p.call(j.prio, j.cancel)
				if err != nil {
					t.Errorf("a call failed: %v", err)
				}
				mu.Lock()
				count[o]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	peak := gw.Peak()
	t.Logf("outcomes %v; the gateway served %d; peak %d", count, gw.Served(), peak)
	if n := count[completed] + count[timedOut] + count[canceled]; n != 1000 || count[completed] < 500 {
		t.Fatalf("outcomes %v", count)
	}
	if peak > 4 {
		for _, p := range procs {
			if p.logged("unreachable") {
				t.Errorf("a process took Redis for down (its log, below, says why) and ran its fallback lane beside the shared one")
			}
		}
		t.Fatalf("the gateway worked on %d calls at once; the shared lane's limit is 4", peak)
	}
	for _, p := range procs {
		if s := freshSnapshot(t, p); s["inflight"] != float64(0) || s["queued"] != float64(0) {
			t.Fatalf("left in the lane: %v", s)
		}
	}
	clean()
}

// freshSnapshot is p's snapshot of its lane once its shared figures are
// read from Redis for it (figures_age_s 0): a store slow to answer, as
// under make stress, leaves the snapshot with the figures of its last
// read, which may be seconds old and count calls long over.
func freshSnapshot(t *testing.T, p *exporterProc) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s := p.snapshot(t)
		if sh, _ := s["shared"].(map[string]any); sh != nil && sh["figures_age_s"] == float64(0) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shared figures were never fresh in 15 s: %v", s)
		}
	}
}

// 3. A process killed with SIGKILL while it holds 2 slots and 3 queue
// places: within the lease TTL its slots are free and the other process's
// waiting calls go on.
func TestKilledProcessFreesItsSlots(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	r := startRedis(t)
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: 30 * time.Millisecond, Tokens: 100, PropagateDisconnect: true})
	a := startExporter(t, gw.URL, r.URL(), "a", 4, "")
	b := startExporter(t, gw.URL, r.URL(), "b", 4, "")
	r.WaitUptime(2 * time.Second)
	var wg sync.WaitGroup
	results := make(chan outcome, 16)
	call := func(p *exporterProc, prio string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, _ := p.call(prio, 0)
			results <- o
		}()
	}
	waitFor := func(what string, ok func(map[string]any) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if s := b.snapshot(t); s != nil && ok(s) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %v", what, b.snapshot(t))
			}
		}
	}
	holders := func(s map[string]any) map[string]any {
		sh, _ := s["shared"].(map[string]any)
		h, _ := sh["holders"].(map[string]any)
		return h
	}
	// The lane is 4 with 1 reserved: b's first two are interactive, so
	// that the defaults may hold the other slots.
	call(a, "default")
	call(a, "default")
	call(b, "interactive")
	call(b, "interactive")
	waitFor("4 in flight", func(s map[string]any) bool { return s["inflight"] == float64(4) })
	for range 3 {
		call(a, "default")
	}
	waitFor("a's 3 queued", func(s map[string]any) bool { return s["queued"] == float64(3) })
	call(b, "default")
	call(b, "default")
	waitFor("b's 2 queued too", func(s map[string]any) bool { return s["queued"] == float64(5) })
	if h := holders(b.snapshot(t)); h["a"] != float64(2) || h["b"] != float64(2) {
		t.Fatalf("holders %v", h)
	}
	// The metrics give b's share (a sum across processes is the lane) and
	// who holds the slots.
	if v := b.metric(t, "llmlanes_llm_inflight"); v != "2" {
		t.Fatalf("b's llmlanes_llm_inflight %s, want its share, 2", v)
	}
	if v := b.metric(t, "llmlanes_llm_shared_holders"); v != "2" {
		t.Fatalf("llmlanes_llm_shared_holders %s", v)
	}
	killed := time.Now()
	a.cmd.Process.Kill()
	waitFor("a's slots and places freed, b's waiters granted", func(s map[string]any) bool {
		h := holders(s)
		return h["a"] == nil && h["b"] == float64(4) && s["queued"] == float64(0)
	})
	freed := time.Since(killed)
	t.Logf("a's 2 slots and 3 places were free %s after SIGKILL (lease_ttl 1s)", freed.Round(time.Millisecond))
	// Within the lease (1 s), plus the waiters' poll (a third of it) that
	// frees them, plus this test's polling.
	if freed > 1800*time.Millisecond {
		t.Fatalf("freed after %s", freed)
	}
	wg.Wait()
	if p := gw.Peak(); p > 4 {
		t.Fatalf("the gateway worked on %d at once", p)
	}
}

// load runs calls through the processes from n clients until stop is
// closed, and counts the outcomes.
type load struct {
	mu    sync.Mutex
	count map[outcome]int
	errs  []error
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startLoad(procs []*exporterProc, n int) *load {
	l := &load{count: map[outcome]int{}, stop: make(chan struct{})}
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := 0; ; k++ {
				select {
				case <-l.stop:
					return
				default:
				}
				o, err := procs[(i+k)%len(procs)].call([]string{"interactive", "default", "bulk"}[(i+k)%3], 0)
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, err)
				} else {
					l.count[o]++
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *load) end() (map[outcome]int, []error) {
	close(l.stop)
	l.wg.Wait()
	return l.count, l.errs
}

// metric returns the value of the first sample of name on p's /metrics.
func (p *exporterProc) metric(t *testing.T, name string) string {
	res, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return ""
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
	}
}

// 4. Redis unreachable (the connection cut and refused by a TCP proxy),
// then restarted empty, under load from three processes. With "closed" the
// gateway never works on more than the lane's 4 and calls are refused with
// 503 lane_unavailable while Redis is away; with "local" each process runs
// its own lane of local_max_inflight meanwhile. Either way the state shows
// in metrics, and once Redis is back nothing is granted twice: the gateway
// again never works on more than 4.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	together(t, []string{"closed", "local"}, redisDown)
}

func redisDown(t *testing.T, mode string) {
	r := startRedis(t)
	proxy := redistest.NewProxy(t, r.Addr())
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: 2 * time.Millisecond, Tokens: 10, PropagateDisconnect: true})
	var procs []*exporterProc
	for _, name := range []string{"p1", "p2", "p3"} {
		procs = append(procs, startExporter(t, gw.URL, "redis://"+proxy.Addr(), name, 4,
			fmt.Sprintf(", on_redis_down: %s, local_max_inflight: 1", mode)))
	}
	r.WaitUptime(2 * time.Second)
	up := func(want string) func() bool {
		return func() bool {
			for _, p := range procs {
				if p.metric(t, "llmlanes_llm_shared_up") != want {
					return false
				}
			}
			return true
		}
	}
	l := startLoad(procs, 12)
	time.Sleep(1500 * time.Millisecond)
	if p := gw.Peak(); p > 4 || p == 0 {
		t.Fatalf("before the cut: peak %d", p)
	}

	proxy.Block()
	eventually(t, "shared_up 0 on every process", up("0"))
	time.Sleep(time.Second)
	// While Redis is away: closed refuses, so the bound holds; local runs
	// one call per process, beside the shared calls still running when
	// Redis went (their leases keep them at most lease_ttl).
	outage := gw.Peak()
	t.Logf("%s: peak while Redis was away: %d", mode, outage)
	if mode == "closed" && outage > 4 {
		t.Fatalf("closed: the gateway worked on %d at once while Redis was away", outage)
	}
	if mode == "local" && outage > 4+3 {
		t.Fatalf("local: %d at once while Redis was away; the bound is the limit plus each process's fallback", outage)
	}
	if c := classifyReasons(t, procs[0]); !strings.Contains(c, "shared_store_down") {
		t.Fatalf("classification while Redis is away: %s", c)
	}

	proxy.Unblock()
	eventually(t, "shared_up 1 on every process", up("1"))
	gw.Peak()
	time.Sleep(1500 * time.Millisecond)
	if p := gw.Peak(); p > 4 {
		t.Fatalf("after Redis came back: the gateway worked on %d at once", p)
	}

	// Redis restarts, empty: running calls re-register during its quiet
	// time, so no slot is granted twice.
	gw.Peak()
	r.Restart()
	time.Sleep(3 * time.Second)
	eventually(t, "shared_up 1 after the restart", up("1"))
	after := gw.Peak()
	if mode == "closed" && after > 4 {
		t.Fatalf("closed: the gateway worked on %d at once across the restart", after)
	}
	gw.Peak()
	time.Sleep(1500 * time.Millisecond)
	if p := gw.Peak(); p > 4 {
		t.Fatalf("after the restart: the gateway worked on %d at once", p)
	}
	count, errs := l.end()
	t.Logf("%s: outcomes %v; peak across the restart %d", mode, count, after)
	if len(errs) > 0 {
		t.Fatalf("%d calls failed otherwise: %v", len(errs), errs[0])
	}
	if count[completed] == 0 || (mode == "closed" && count[unavailable] == 0) || (mode == "local" && count[unavailable] != 0) {
		t.Fatalf("outcomes %v", count)
	}
	noResidue(t, r)
}

func classifyReasons(t *testing.T, p *exporterProc) string {
	res, err := http.Get("http://" + p.addr + "/api/telemetry/llm-lanes/classification")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// 6. A queue timeout through the proxy on a shared lane reports the lane's
// global figures, as an in-process one does: its place among the waiters
// of every process, and a Retry-After from the lane's service rate (at
// least 1 s), in the header, retry_after_s and the message.
func TestSharedQueueTimeoutTellsTheGlobalQueue(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	r := startRedis(t)
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: 5 * time.Millisecond, Tokens: 4, PropagateDisconnect: true})
	// A lease of 5 s, not the tests' usual 1 s: on a loaded machine a queue
	// place of 1 s can lapse between renewals, and the waiter then queues
	// again, out of the count this test reads.
	a := startExporter(t, gw.URL, r.URL(), "a", 1, ", lease_ttl: 5s")
	b := startExporter(t, gw.URL, r.URL(), "b", 1, ", lease_ttl: 5s")
	r.WaitUptime(6 * time.Second)
	// A few quick calls: a's lane learns the hold time of a call.
	for range 3 {
		if o, err := a.call("default", 0); o != completed {
			t.Fatalf("a quick call: %s %v", o, err)
		}
	}
	// Then one long answer holds the lane's only slot.
	gw.sim.SetConfig(gatewaysim.Config{Capacity: 100, TokenTime: 100 * time.Millisecond, Tokens: 300, PropagateDisconnect: true})
	holdCtx, stopHolding := context.WithCancel(context.Background())
	holder := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(holdCtx, http.MethodPost, "http://"+a.addr+"/proxy/gw/chat/completions",
			strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
		res, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		holder <- err
	}()
	eventually(t, "the long call holds the slot", func() bool { return a.snapshot(t)["inflight"] == float64(1) })
	type answer struct {
		res  *http.Response
		body []byte
	}
	post := func(p *exporterProc) chan answer {
		out := make(chan answer, 1)
		go func() {
			res, err := client.Post("http://"+p.addr+"/proxy/gw/chat/completions", "application/json",
				strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
			if err != nil {
				t.Error(err)
				out <- answer{}
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			out <- answer{res, b}
		}()
		return out
	}
	first := post(a)
	eventually(t, "a's call queued", func() bool { return a.snapshot(t)["queued"] == float64(1) })
	// b's call queues 2 s later, so that its own queue timeout comes 2 s
	// after a's: under make stress, a's leave (and the count it reads)
	// reached Redis after b's call, queued a few ms after a's, had left.
	time.Sleep(2 * time.Second)
	second := post(b)
	eventually(t, "b's call queued behind it", func() bool { return a.snapshot(t)["queued"] == float64(2) })

	// a's call times out first (queue_timeout 5s), with b's still queued.
	ans := <-first
	if ans.res == nil || ans.res.StatusCode != 503 {
		t.Fatalf("a's queued call: %+v %s", ans.res, ans.body)
	}
	var eb struct {
		Error struct {
			Message     string  `json:"message"`
			Code        string  `json:"code"`
			Position    int     `json:"position"`
			Queued      int     `json:"queued"`
			RetryAfterS float64 `json:"retry_after_s"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ans.body, &eb); err != nil || eb.Error.Code != "lane_queue_timeout" {
		t.Fatalf("body %s", ans.body)
	}
	e := eb.Error
	if e.Position != 1 || e.Queued != 2 || !strings.Contains(e.Message, "position 1 of 2 queued") {
		t.Fatalf("position %d of %d queued, want 1 of 2 (b's call in the other process counts): %s", e.Position, e.Queued, e.Message)
	}
	// An estimate from the service rate (a's calls held their slot a few
	// ms), not the fallback of one queue timeout, and never under 1 s.
	if e.RetryAfterS < 1 || e.RetryAfterS >= 5 {
		t.Fatalf("retry_after_s %v, want an estimate of at least 1 s and under the 5 s queue timeout", e.RetryAfterS)
	}
	if h := ans.res.Header.Get("Retry-After"); h != fmt.Sprint(int(e.RetryAfterS)) {
		t.Fatalf("Retry-After %q, retry_after_s %v", h, e.RetryAfterS)
	}
	if !strings.Contains(e.Message, fmt.Sprintf("a new call would wait about %ds", int(e.RetryAfterS))) {
		t.Fatalf("message %q does not give the estimate", e.Message)
	}
	if ans := <-second; ans.res == nil || ans.res.StatusCode != 503 || !bytes.Contains(ans.body, []byte(`"position":1,"queued":1,`)) {
		t.Fatalf("b's queued call: %s", ans.body)
	}
	stopHolding()
	if err := <-holder; !errors.Is(err, context.Canceled) {
		t.Fatalf("the long call ended with %v before the test let it go", err)
	}
}

// 7. A Redis stall shorter than the lease cuts no call: Redis frozen
// (SIGSTOP) for 8 s under four running streams, at lease_ttl 15s, in both
// fallback modes. The renewals sent during the stall are answered when it
// ends and move the slots' deadlines on, so every stream ends whole; the
// gateway never works on more than the lane's 4 (two more calls sent
// during the stall queue, or are refused, rather than run); and new calls
// use Redis again soon after it answers.
func TestRedisStallCutsNoCall(t *testing.T) {
	t.Parallel()
	processesAlone(t)
	// Together: each waits out a lease_ttl of quiet time after its Redis starts.
	together(t, []string{"local", "closed"}, func(t *testing.T, mode string) {
		r := startRedis(t)
		gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: time.Second, Tokens: 12, PropagateDisconnect: true})
		opts := fmt.Sprintf(", lease_ttl: 15s, on_redis_down: %s, local_max_inflight: 1", mode)
		a, b := startExporter(t, gw.URL, r.URL(), "a", 4, opts), startExporter(t, gw.URL, r.URL(), "b", 4, opts)
		r.WaitUptime(16 * time.Second) // the quiet time after a start is one lease_ttl
		type end struct {
			o   outcome
			err error
		}
		streams := make(chan end, 4)
		for _, p := range []*exporterProc{a, a, b, b} {
			go func() { o, err := p.call("interactive", 0); streams <- end{o, err} }()
		}
		// All four at the gateway, not only granted in Redis: a call
		// whose grant was on its way when Redis froze is not one that
		// runs through the stall.
		eventually(t, "4 streams at the gateway", func() bool { return gw.Peak() == 4 })
		r.Freeze()
		frozen := time.Now()
		late := make(chan end, 2)
		time.Sleep(2 * time.Second) // into the stall
		for _, p := range []*exporterProc{a, b} {
			go func() { o, err := p.call("interactive", 0); late <- end{o, err} }()
		}
		time.Sleep(time.Until(frozen.Add(8 * time.Second)))
		if a.metric(t, "llmlanes_llm_shared_up") != "0" {
			t.Fatal("the stall was not noticed") // else this would test nothing of the way back
		}
		r.Thaw()
		thawed := time.Now()
		// New calls use Redis again soon after it answers: two steps of
		// grace, and a step to notice (docs/LANES-EXPORTER.md).
		eventually(t, "shared again", func() bool {
			return a.metric(t, "llmlanes_llm_shared_up") == "1" && b.metric(t, "llmlanes_llm_shared_up") == "1"
		})
		back := time.Since(thawed)
		t.Logf("%s: lanes shared again %s after Redis answered", mode, back.Round(100*time.Millisecond))
		if back > 6*time.Second {
			t.Errorf("lanes shared again %s after Redis answered, want within about 3 s", back)
		}
		for range 4 {
			if e := <-streams; e.o != completed {
				t.Fatalf("a stream running through the stall ended %q (%v)", e.o, e.err)
			}
		}
		for range 2 {
			e := <-late
			if e.err != nil || (e.o != completed && e.o != timedOut && e.o != unavailable) {
				t.Fatalf("a call sent during the stall: %q (%v)", e.o, e.err)
			}
		}
		if p := gw.Peak(); p > 4 {
			t.Fatalf("the gateway worked on %d calls at once; the shared lane's limit is 4", p)
		}
	})
}

// A scrape never waits long on Redis: with Redis frozen, /metrics answers
// within SharedStateTimeout (1 s) and its rendering, with the last global
// figures read and their age (llmlanes_llm_shared_figures_age_seconds, and
// the snapshot's shared.figures_age_s); once Redis answers, fresh again.
// Nothing is read at the gateway, so it runs beside the tests that hold
// the process turn.
func TestScrapeWithRedisFrozen(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	gw := newGateway(t, gatewaysim.Config{Capacity: 100, TokenTime: time.Millisecond, Tokens: 2, PropagateDisconnect: true})
	p := startExporter(t, gw.URL, r.URL(), "p", 4, ", lease_ttl: 5s")
	r.WaitUptime(6 * time.Second)
	if o, err := p.call("default", 0); o != completed {
		t.Fatalf("a call: %s %v", o, err)
	}
	scrape := func() (string, time.Duration) {
		start := time.Now()
		res, err := http.Get("http://" + p.addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return string(b), time.Since(start)
	}
	age := func(metrics string) float64 {
		for _, line := range strings.Split(metrics, "\n") {
			if strings.HasPrefix(line, "llmlanes_llm_shared_figures_age_seconds{") {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				return v
			}
		}
		t.Fatalf("no llmlanes_llm_shared_figures_age_seconds in:\n%s", metrics)
		return 0
	}
	if m, _ := scrape(); age(m) != 0 {
		t.Fatalf("fresh figures are %v s old", age(m))
	}
	r.Freeze()
	defer r.Thaw()
	time.Sleep(1500 * time.Millisecond) // the last figures read grow old
	for range 3 {
		m, took := scrape()
		t.Logf("a scrape with Redis frozen took %s; figures %v s old", took.Round(time.Millisecond), age(m))
		// The bound is SharedStateTimeout, 1 s, plus rendering the scrape.
		if took > 2*time.Second {
			t.Fatalf("a scrape with Redis frozen took %s", took)
		}
		if age(m) < 1 {
			t.Fatalf("the figures shown are %v s old: not said to be stale", age(m))
		}
	}
	if s := p.snapshot(t)["shared"].(map[string]any); s["figures_age_s"].(float64) < 1 {
		t.Fatalf("the snapshot's shared block: %v", s)
	}
	r.Thaw()
	eventually(t, "fresh figures again", func() bool { m, _ := scrape(); return age(m) == 0 })
}

// processTests lets one test at a time run lanes-exporter processes whose
// figures (the gateway's peak, a provider's 429, a lease's lapse) are taken
// at a real gateway, whose view of a call's end lags the lane's when the
// machine is loaded; the package's other tests run beside it, and so do
// the process tests that read only an order or a route's answer.
var processTests = make(chan struct{}, 1)

// processesAlone waits until no other test runs processes, and holds the
// turn until t's end (after its processes have stopped: cleanups run last
// registered first).
//
// A test that holds the turn must not run parallel subtests (t.Parallel):
// they would wait for a slot of -parallel, and every slot may be held by
// tests waiting here for the turn, a deadlock that depends on the order the
// tests start in. It runs them with together instead.
func processesAlone(t *testing.T) {
	processTests <- struct{}{}
	t.Cleanup(func() { <-processTests })
}

// together runs f(t, name) as a subtest of t for each of names, all at
// once, and returns when all have ended. The subtests are not parallel
// tests (see processesAlone): they run at once, needing no slot of
// -parallel.
func together(t *testing.T, names []string, f func(t *testing.T, name string)) {
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, func(t *testing.T) { f(t, name) })
		}()
	}
	wg.Wait()
}
