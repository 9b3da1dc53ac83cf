package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// proc is a process under measurement.
type proc struct {
	name   string // lanes, lanes-variant, floor, haproxy or direct
	url    string // where calls go (…/chat/completions)
	cmd    *exec.Cmd
	queued func() (int, error)
}

func (p *proc) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// cpu is the process's CPU time so far, every thread's: the sum of the
// threads' run time in /proc/PID/task/*/schedstat, in nanoseconds. (The
// utime and stime of /proc/PID/stat count in ticks of 10 ms: a quick run's
// few hundred calls through HAProxy, 20 ms of CPU or so, could read 0 or
// 10 ms, a ratio that says nothing.) A thread that has exited is not
// counted; the proxies measured keep theirs.
func (p *proc) cpu() (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var ns int64
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s/schedstat: %q", t.Name(), b)
		}
		ns += v
	}
	return time.Duration(ns), nil
}

// rss is the process's resident memory in bytes.
func (p *proc) rss() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitListening(addr string, p *proc) error {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		if p.cmd.ProcessState != nil {
			return fmt.Errorf("%s exited", p.name)
		}
	}
	return fmt.Errorf("%s is not listening on %s after 20 s", p.name, addr)
}

// startUpstream runs the gateway in its own process (this program again).
func startUpstream(self string) (*proc, error) {
	p, err := startSelf(self, "direct", "-role", "upstream")
	if p != nil {
		p.url += "/v1/chat/completions"
	}
	return p, err
}

// startFloor runs the Go floor (serveFloor) with a lane of limit in its
// own process.
func startFloor(self, upstream string, limit int) (*proc, error) {
	p, err := startSelf(self, "floor", "-role", "floor", "-url", upstream, "-c", strconv.Itoa(limit))
	if err != nil {
		return nil, err
	}
	base := p.url
	p.url += "/v1/chat/completions"
	p.queued = func() (int, error) {
		res, err := http.Get(base + "/queued")
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		var n int
		_, err = fmt.Fscan(res.Body, &n)
		return n, err
	}
	return p, nil
}

// startSelf runs this program with args, listening on a loopback port it
// is handed (file descriptor 3), so that it takes calls at once; the
// proc's url is http://that-address.
func startSelf(self, name string, args ...string) (*proc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f, _ := ln.(*net.TCPListener).File()
	ln.Close()
	defer f.Close()
	cmd := exec.Command(self, args...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{name: name, url: "http://" + ln.Addr().String(), cmd: cmd}, nil
}

// startLanes runs lanes-exporter with one upstream and a lane of limit,
// otherwise on its defaults; reserve false sets interactive_reserve to 0,
// the lane HAProxy has (it keeps no slot for a class).
func startLanes(bin, dir, upstream string, limit int, reserve bool, env []string) (*proc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(upstream, "/chat/completions")
	lim := fmt.Sprintf("{max_inflight: %d, interactive_reserve: 0}", limit)
	if reserve {
		lim = fmt.Sprintf("{max_inflight: %d}", limit)
	}
	// The bench's upstream stops a call's work when its client goes (its
	// held calls wait for that), as HAProxy's lane takes it to.
	cfg := fmt.Sprintf("listen: %s\nlimiter: %s\nupstreams: [{name: gw, base_url: %q, cancel_propagates: true}]\n", addr, lim, base)
	file := filepath.Join(dir, "lanes.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", file)
	cmd.Env = append(os.Environ(), env...)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: "lanes", url: "http://" + addr + "/proxy/gw/chat/completions", cmd: cmd}
	p.queued = func() (int, error) {
		res, err := http.Get("http://" + addr + "/api/telemetry/llm-lanes")
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		var s struct{ Lanes []struct{ Queued int } }
		if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
			return 0, err
		}
		n := 0
		for _, l := range s.Lanes {
			n += l.Queued
		}
		return n, nil
	}
	if err := waitListening(addr, p); err != nil {
		p.stop()
		return nil, fmt.Errorf("%w: %s", err, logs.String())
	}
	return p, nil
}

// haproxyConfig is the equivalent lane in HAProxy: one server with
// maxconn limit, a queue timeout as lanes-exporter's default, and priority
// classes from the same header (a lower class is served first); a call
// whose client has gone leaves the queue (abortonclose), as in a lane. Its
// connection bound holds 10,000 queued calls; HAProxy reserves two file
// descriptors per connection, more than a process may have here (20,000),
// so it is told to go on with what it gets (a queued call holds one).
const haproxyConfig = `global
	maxconn 10100
	no strict-limits
	stats socket %[1]s mode 600 level admin
	tune.h2.max-concurrent-streams 250
defaults
	mode http
	option abortonclose
	maxconn 10100
	timeout connect 10s
	timeout client 10m
	timeout server 10m
	timeout queue 300s
	timeout http-request 10s
frontend lane
	bind %[2]s
	http-request set-priority-class int(-1) if { req.hdr(x-llm-priority) -m str interactive }
	http-request set-priority-class int(1) if { req.hdr(x-llm-priority) -m str bulk }
	http-request del-header x-llm-priority
	default_backend gateway
backend gateway
	server gw %[3]s maxconn %[4]d
`

// startHAProxy runs Debian's haproxy as the same lane.
func startHAProxy(dir, upstream string, limit int) (*proc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "haproxy.sock")
	host := strings.TrimPrefix(strings.SplitN(upstream, "/v1", 2)[0], "http://")
	file := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(haproxyConfig, sock, addr, host, limit)), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("haproxy", "-db", "-f", file)
	var logs bytes.Buffer
	cmd.Stderr, cmd.Stdout = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: "haproxy", url: "http://" + addr + "/v1/chat/completions", cmd: cmd}
	p.queued = func() (int, error) { return haproxyQueued(sock) }
	if err := waitListening(addr, p); err != nil {
		p.stop()
		return nil, fmt.Errorf("%w: %s", err, logs.String())
	}
	return p, nil
}

// haproxyQueued reads the backend's queue length from the stats socket.
func haproxyQueued(sock string) (int, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	fmt.Fprintf(c, "show stat\n")
	r := csv.NewReader(c)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, errors.New("empty stats")
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[strings.TrimPrefix(h, "# ")] = i
	}
	n := 0
	for _, r := range rows[1:] {
		if r[col["pxname"]] == "gateway" && r[col["svname"]] == "BACKEND" {
			n, _ = strconv.Atoi(r[col["qcur"]])
		}
	}
	return n, nil
}
