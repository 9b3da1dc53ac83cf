// Package redistest runs real redis-server processes (Debian's package,
// which make tools installs) for tests and the incident replay: a standalone server that can be
// restarted, a Cluster of several masters, and a TCP proxy whose
// connections a test can cut.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TB is what the helpers need of a test: *testing.T and *testing.B have
// it. The package does not import testing, so that a program (the replay)
// can run a server with Launch.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Server is one redis-server on loopback.
type Server struct {
	t    TB
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Start runs a redis-server with no persistence on a free port, stopped
// when the test ends. extra are more config directives ("cluster-enabled
// yes").
func Start(t TB, extra ...string) *Server {
	t.Helper()
	s, err := Launch(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	t.Cleanup(s.Kill)
	return s
}

// Launch runs a redis-server with no persistence on a free port, with its
// files in dir, for a program rather than a test; Kill stops it.
func Launch(dir string, extra ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server is not installed: run make tools (Debian's redis-server package)")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, dir: dir}
	s.args = append([]string{"--port", fmt.Sprint(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no"}, flags(extra)...)
	return s, s.start()
}

func flags(directives []string) []string {
	var out []string
	for _, d := range directives {
		f := strings.Fields(d) // "rename-command FCALL x": a flag and its two values
		out = append(out, "--"+f[0])
		out = append(out, f[1:]...)
	}
	return out
}

func (s *Server) start() error {
	s.cmd = exec.Command("redis-server", s.args...)
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, io.Discard
	if err := s.cmd.Start(); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, err := s.Do("PING")
		if (err == nil && out == "PONG") || (err != nil && strings.Contains(err.Error(), "NOAUTH")) {
			return nil // answering (a password-protected server wants AUTH first)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not start", s.Addr())
		}
	}
}

// Uptime waits until the server has been up for d (its
// uptime_in_seconds, whole seconds).
func (s *Server) Uptime(d time.Duration) error {
	for deadline := time.Now().Add(d + 10*time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err := s.Do("INFO server")
		if err == nil {
			for _, line := range strings.Split(out, "\r\n") {
				var up int
				if _, err := fmt.Sscanf(line, "uptime_in_seconds:%d", &up); err == nil && time.Duration(up)*time.Second >= d {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: not up for %s", s.Addr(), d)
		}
	}
}

// WaitUptime is Uptime in a test.
func (s *Server) WaitUptime(d time.Duration) {
	s.t.Helper()
	if err := s.Uptime(d); err != nil {
		s.t.Fatal(err)
	}
}

// Freeze stops the server where it stands (SIGSTOP): it keeps its data and
// its connections, and answers nothing until Thaw. It is a stall, as a long
// fork, a swapped-out host or a partition looks to its clients.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw lets a frozen server go on (SIGCONT); what was sent to it meanwhile
// is answered now.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("redis-server on %s is not running", s.Addr())
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

// Kill stops the server at once (SIGKILL): its data is gone.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// DumpFile is where the server writes its snapshot (SAVE) and reads it
// from when it starts.
func (s *Server) DumpFile() string { return filepath.Join(s.dir, "dump.rdb") }

// Restart kills the server and starts it again on the same port: empty,
// unless a SAVE left a snapshot in DumpFile, which it loads.
func (s *Server) Restart() {
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Do sends one command (space-separated words) and returns the reply as
// text: a simple answer, an integer, or a multi-bulk's items joined by
// newlines.
func (s *Server) Do(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	words := strings.Fields(cmd)
	fmt.Fprintf(c, "*%d\r\n", len(words))
	for _, w := range words {
		fmt.Fprintf(c, "$%d\r\n%s\r\n", len(w), w)
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		var n int
		fmt.Sscan(line[1:], &n)
		if n < 0 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	case '*':
		var n int
		fmt.Sscan(line[1:], &n)
		var items []string
		for range n {
			it, err := readReply(r)
			if err != nil {
				return "", err
			}
			items = append(items, it)
		}
		return strings.Join(items, "\n"), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

// Keys returns every key of the server (of a standalone one, or of one
// cluster node).
func (s *Server) Keys() []string {
	out, err := s.Do("KEYS *")
	if err != nil {
		s.t.Fatal(err)
	}
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// Cluster is a Redis Cluster of masters on loopback, no replicas.
type Cluster struct {
	Nodes []*Server
}

// URL is the cluster's redis:// URL, in the form sharedlane takes: the
// first node, and the others as addr parameters.
func (c *Cluster) URL() string {
	u := c.Nodes[0].URL() + "?"
	for i, n := range c.Nodes[1:] {
		if i > 0 {
			u += "&"
		}
		u += "addr=" + n.Addr()
	}
	return u
}

// StartCluster runs n masters and joins them into a cluster with
// redis-cli --cluster create.
func StartCluster(t TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	var addrs []string
	for range n {
		s := Start(t, "cluster-enabled yes", "cluster-config-file "+filepath.Join(t.TempDir(), "nodes.conf"), "cluster-node-timeout 5000")
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ok := true
		for _, s := range c.Nodes {
			if out, _ := s.Do("CLUSTER INFO"); !strings.Contains(out, "cluster_state:ok") {
				ok = false
			}
		}
		if ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("the cluster did not reach cluster_state:ok")
		}
	}
}

// Proxy forwards TCP connections to a server; Cut closes every connection
// it carries, and Block refuses new ones until Unblock.
type Proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	conns   map[net.Conn]bool
	blocked bool
	wg      sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target; it
// stops when the test ends.
func NewProxy(t TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.blocked {
			p.mu.Unlock()
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[u] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, src)
			delete(p.conns, dst)
			p.mu.Unlock()
		}
		go pipe(u, c)
		go pipe(c, u)
	}
}

// Cut closes every connection in progress.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Block cuts every connection and refuses new ones: the server is
// unreachable.
func (p *Proxy) Block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
	p.Cut()
}

// Unblock lets connections through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
