package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// options are the orchestrator's flags.
type options struct {
	lanes  string
	rounds int
	calls  int
	quick  bool
	// variant, if set, is an environment (GOMAXPROCS=1 ...) in which a
	// second lanes-exporter is measured for latency and CPU.
	variant string
	only    string
}

// runs reports whether the measurement named what is to run (-only).
func (o options) runs(what string) bool {
	return o.only == "" || strings.Contains(","+o.only+",", ","+what+",")
}

// samples are the figures, one per round, by proxy and measure
// ("lanes/p50_added_us").
type samples map[string][]float64

func (s samples) add(proxy, what string, v float64) { s[proxy+"/"+what] = append(s[proxy+"/"+what], v) }

// loadCommand is the load generator with args.
func loadCommand(self string, args []string) *exec.Cmd {
	cmd := exec.Command(self, append([]string{"-role", "load"}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// load runs the load generator and decodes its JSON line.
func load(self string, args ...string) (loadResult, error) {
	out, err := loadCommand(self, args).Output()
	if err != nil {
		return loadResult{}, fmt.Errorf("load %v: %w", args, err)
	}
	var r loadResult
	return r, json.Unmarshal(out, &r)
}

// interactiveLoad is a load generator that keeps its calls open: it prints
// a line once they are sent, and goes on when its standard input says so
// (a line, or the end of it).
type interactiveLoad struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startLoad(self string, args ...string) (*interactiveLoad, error) {
	cmd := loadCommand(self, args)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &interactiveLoad{cmd, in, bufio.NewReader(out)}
	if _, err := l.out.ReadString('\n'); err != nil {
		l.cmd.Process.Kill()
		l.cmd.Wait()
		return nil, fmt.Errorf("load %v: %w", args, err)
	}
	return l, nil
}

// waitQueued waits until p reports n calls queued or more (3 minutes at
// most).
func waitQueued(p *proc, n int) error {
	return poll(p, 3*time.Minute, func(q int) bool { return q >= n }, fmt.Sprintf("%d calls queued", n))
}

// waitDrained waits until p's queue is empty, between rounds, then lets
// the calls that held the lane end too.
func waitDrained(p *proc) error {
	err := poll(p, time.Minute, func(q int) bool { return q == 0 }, "an empty queue")
	time.Sleep(200 * time.Millisecond)
	return err
}

// poll reads p's queue length until done says so, for d at most.
func poll(p *proc, d time.Duration, done func(queued int) bool, what string) error {
	q := 0
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if q, err = p.queued(); err != nil {
			return err
		}
		if done(q) {
			return nil
		}
	}
	return fmt.Errorf("%s: no %s after %s (%d queued)", p.name, what, d, q)
}

// bench is one run: the gateway, the settings, and the figures so far.
type bench struct {
	o    options
	p    params
	self string // this program, for the load generator
	dir  string
	up   *proc
	s    samples
}

// proxies are the two compared; the priority measurement has only them.
var proxies = []string{"lanes", "haproxy"}

// The others: lanes-exporter with the -variant environment, measured for
// latency and CPU beside them; the Go floor (serveFloor), measured for
// everything but priority, which it does not have.
const (
	variant = "lanes-variant"
	floor   = "floor"
)

// withFloor are the proxies and the Go floor.
var withFloor = []string{"lanes", floor, "haproxy"}

// start starts a proxy with a lane of limit. lanes-exporter keeps its
// default interactive reserve (1) in the priority measurement, where it is
// the point, and none elsewhere, so that its lane lets as many calls
// through as HAProxy's.
func (b *bench) start(name string, limit int, reserve bool) (*proc, error) {
	switch name {
	case "lanes":
		return startLanes(b.o.lanes, b.dir, b.up.url, limit, reserve, nil)
	case variant:
		p, err := startLanes(b.o.lanes, b.dir, b.up.url, limit, reserve, strings.Fields(b.o.variant))
		if p != nil {
			p.name = variant
		}
		return p, err
	case floor:
		return startFloor(b.self, b.up.url, limit)
	}
	return startHAProxy(b.dir, b.up.url, limit)
}

// each starts the proxies with a lane of limit and calls f for each, in
// every round, in interleaved order.
func (b *bench) each(proxies []string, limit int, reserve bool, f func(round int, px *proc) error) error {
	ps := map[string]*proc{}
	for _, name := range proxies {
		px, err := b.start(name, limit, reserve)
		if err != nil {
			return err
		}
		defer px.stop()
		ps[name] = px
	}
	for r := range b.p.Rounds {
		// In turn first: a drift of the machine over the run falls on
		// both alike.
		for i := range proxies {
			if err := f(r, ps[proxies[(r+i)%len(proxies)]]); err != nil {
				return err
			}
		}
	}
	return nil
}

func measure(o options) (*report, error) {
	b := &bench{o: o, s: samples{}, p: params{Rounds: o.rounds, Calls: o.calls, Warm: 300, LatencyLimit: 64,
		ThroughputLimit: 32, ThroughputCallers: 64, ThroughputMs: 20, ThroughputSeconds: 3,
		PriorityLimit: 4, PriorityBacklog: 100, PriorityMs: 1000, Queued: []int{5000, 10000}, QueueRounds: 3, Variant: o.variant,
		Overload: overloadParams{Capacity: 8, WorkMs: 250, TimeoutS: 5, MaxRetries: 2, WarmS: 5, WindowS: 20, NoLoadS: 3, Levels: []float64{1, 1.5, 2, 3}}}}
	if o.quick {
		b.p.Rounds, b.p.Calls, b.p.Warm, b.p.ThroughputSeconds, b.p.Queued, b.p.QueueRounds = 1, 300, 50, 1, []int{200}, 1
		b.p.Overload.WarmS, b.p.Overload.WindowS, b.p.Overload.NoLoadS, b.p.Overload.Levels = 1, 3, 1, []float64{3}
	}
	var err error
	if b.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if b.dir, err = os.MkdirTemp("", "proxybench"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.dir)
	if b.up, err = startUpstream(b.self); err != nil {
		return nil, err
	}
	defer b.up.stop()
	for _, st := range []struct {
		name string
		run  func() error
	}{{"latency", b.latency}, {"throughput", b.throughput}, {"priority", b.priority}, {"memory", b.memory}, {"overload", b.overload}} {
		if o.runs(st.name) {
			if err := st.run(); err != nil {
				return nil, fmt.Errorf("%s: %w", st.name, err)
			}
		}
	}
	return newReport(b.p, b.s), nil
}

// latency: sequential calls on one connection, and the proxy's CPU per
// call; the gateway direct, in the same round, is the reference.
func (b *bench) latency() error {
	p, up := b.p, b.up
	log.Printf("latency: %d rounds of %d sequential calls", p.Rounds, p.Calls)
	direct := make([]loadResult, p.Rounds)
	names := withFloor
	if b.o.variant != "" {
		names = []string{"lanes", variant, floor, "haproxy"}
	}
	return b.each(names, p.LatencyLimit, false, func(r int, px *proc) error {
		var err error
		if direct[r].Calls == 0 {
			if _, err := load(b.self, "-url", up.url, "-n", strconv.Itoa(p.Warm)); err != nil {
				return err
			}
			if direct[r], err = load(b.self, "-url", up.url, "-n", strconv.Itoa(p.Calls)); err != nil {
				return err
			}
			b.s.add("direct", "p50_us", direct[r].P50us)
			b.s.add("direct", "p99_us", direct[r].P99us)
		}
		if _, err := load(b.self, "-url", px.url, "-n", strconv.Itoa(p.Warm)); err != nil {
			return err
		}
		c0, _ := px.cpu()
		res, err := load(b.self, "-url", px.url, "-n", strconv.Itoa(p.Calls))
		if err != nil {
			return err
		}
		c1, _ := px.cpu()
		b.s.add(px.name, "p50_added_us", res.P50us-direct[r].P50us)
		b.s.add(px.name, "p99_added_us", res.P99us-direct[r].P99us)
		b.s.add(px.name, "cpu_us_per_call", float64((c1-c0).Microseconds())/float64(p.Calls))
		return nil
	})
}

// throughput: more callers than the lane lets through, for a while.
func (b *bench) throughput() error {
	p := b.p
	log.Printf("throughput: %d callers, a lane of %d, calls of %d ms", p.ThroughputCallers, p.ThroughputLimit, p.ThroughputMs)
	return b.each(withFloor, p.ThroughputLimit, false, func(r int, px *proc) error {
		res, err := load(b.self, "-mode", "throughput", "-url", fmt.Sprintf("%s?ms=%d", px.url, p.ThroughputMs),
			"-c", strconv.Itoa(p.ThroughputCallers), "-d", fmt.Sprint(time.Duration(p.ThroughputSeconds)*time.Second))
		if err != nil {
			return err
		}
		b.s.add(px.name, "calls_per_s", float64(res.Calls)/res.Seconds)
		return nil
	})
}

// priority: one interactive call behind a lane full of bulk calls and a
// backlog of them.
func (b *bench) priority() error {
	p := b.p
	log.Printf("priority: an interactive call behind %d bulk calls queued on a lane of %d", p.PriorityBacklog, p.PriorityLimit)
	return b.each(proxies, p.PriorityLimit, true, func(r int, px *proc) error {
		l, err := startLoad(b.self, "-mode", "priority", "-url", px.url, "-c", strconv.Itoa(p.PriorityLimit),
			"-n", strconv.Itoa(p.PriorityBacklog), "-ms", strconv.Itoa(p.PriorityMs))
		if err != nil {
			return err
		}
		if err := waitQueued(px, p.PriorityBacklog); err != nil {
			l.cmd.Process.Kill()
			l.cmd.Wait()
			return err
		}
		fmt.Fprintln(l.in, "go")
		var res loadResult
		line, err := l.out.ReadString('\n')
		if err == nil {
			err = json.Unmarshal([]byte(line), &res)
		}
		l.cmd.Wait()
		if err != nil {
			return fmt.Errorf("%s: %w", px.name, err)
		}
		b.s.add(px.name, "interactive_wait_ms", res.WaitMs)
		return waitDrained(px)
	})
}

// memory: a fresh proxy each time, one call holding the only slot, then n
// calls queued behind it.
func (b *bench) memory() error {
	for _, n := range b.p.Queued {
		for _, h2 := range []bool{false, true} {
			proto := map[bool]string{false: "http1", true: "h2c"}[h2]
			log.Printf("memory: %d calls queued over %s, %d rounds", n, proto, b.p.QueueRounds)
			for r := range b.p.QueueRounds {
				for i := range withFloor {
					name := withFloor[(r+i)%len(withFloor)]
					kib, err := b.queuedRSS(name, n, h2)
					if err != nil {
						return err
					}
					b.s.add(name, fmt.Sprintf("rss_kib_per_queued_%s_%d", proto, n), kib)
				}
			}
		}
	}
	return nil
}

// queuedRSS is the growth of a fresh proxy's resident memory with n calls
// queued, per call, in KiB.
func (b *bench) queuedRSS(name string, n int, h2 bool) (float64, error) {
	px, err := b.start(name, 1, false)
	if err != nil {
		return 0, err
	}
	defer px.stop()
	queue := func(n int) (*interactiveLoad, error) {
		args := []string{"-mode", "queue", "-url", px.url, "-n", strconv.Itoa(n)}
		if h2 {
			args = append(args, "-h2")
		}
		return startLoad(b.self, args...)
	}
	// One call first, so that the baseline has served a call already.
	warm, err := queue(0)
	if err != nil {
		return 0, err
	}
	warm.in.Close()
	warm.cmd.Wait()
	time.Sleep(200 * time.Millisecond)
	before, err := px.rss()
	if err != nil {
		return 0, err
	}
	l, err := queue(n)
	if err != nil {
		return 0, err
	}
	defer func() { l.in.Close(); l.cmd.Wait() }()
	if err := waitQueued(px, n); err != nil {
		return 0, err
	}
	time.Sleep(500 * time.Millisecond) // settled
	after, err := px.rss()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / 1024 / float64(n), nil
}
