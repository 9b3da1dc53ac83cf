package sharedlane

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/internal/tools/tlstest"
	"github.com/llmlanes/llmlanes/limiter"
)

// roundTrip acquires and releases one slot through a backend on url.
func roundTrip(t *testing.T, c Config) {
	t.Helper()
	c.LeaseTTL, c.Log = time.Second, quiet
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1, QueueTimeout: 10 * time.Second}, limiter.WithBackend(b))
	s, err := lim.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatal(err)
	}
	if l := b.Lanes(context.Background(), []string{lane})[lane]; l.State != limiter.BackendOK || l.Inflight != 1 {
		t.Fatalf("lane %+v", l)
	}
	s.Release()
}

// TLS (rediss://) with Redis' certificate checked against a private CA
// (tls_ca_file).
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, certFile, keyFile := tlstest.SelfSigned(t, dir)
	port := freeTCPPort(t)
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", fmt.Sprint(port), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--save", "", "--dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pool := tlstest.Pool(t, caFile)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{RootCAs: pool})
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server with TLS did not start: %v", err)
		}
	}
	time.Sleep(1100 * time.Millisecond) // its quiet time after a start
	url := fmt.Sprintf("rediss://127.0.0.1:%d", port)
	roundTrip(t, Config{URL: url, TLSCAFile: caFile})
	// Without the CA, the certificate is refused.
	b, _ := New(Config{URL: url, LeaseTTL: time.Second, Log: quiet, OnRedisDown: OnDownClosed})
	defer b.Close()
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1}, limiter.WithBackend(b))
	if _, err := lim.Acquire(context.Background(), lane); err == nil {
		t.Fatal("a server certificate from an unknown CA was accepted")
	}
}

// AUTH: the password in the URL is used, and never shows in an error or a
// log line.
func TestAuthNeverShown(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, "requirepass s3cret-pw")
	time.Sleep(1100 * time.Millisecond) // its quiet time after a start
	roundTrip(t, Config{URL: "redis://:s3cret-pw@" + r.Addr()})

	// A bad URL, and a Redis that is down: the messages name the URL
	// without its password.
	if err := (Config{URL: "redis://user:s3cret-pw@127.0.0.1:6379/notadb"}).Validate(); err == nil || strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("validation: %v", err)
	}
	var logs logbuf.Buffer
	b, err := New(Config{URL: "redis://user:s3cret-pw@127.0.0.1:1", LeaseTTL: time.Second, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1}, limiter.WithBackend(b))
	s, err := lim.Acquire(context.Background(), lane) // falls back: Redis is down
	if err != nil {
		t.Fatal(err)
	}
	s.Release()
	b.Close()
	if !strings.Contains(logs.String(), "unreachable") || strings.Contains(logs.String(), "s3cret-pw") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

// Sentinel: the backend finds the master through a sentinel
// (?master_name=).
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	dir := t.TempDir()
	port := freeTCPPort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor lanes %s 1\nsentinel down-after-milliseconds lanes 5000\n",
		port, strings.Replace(master.Addr(), ":", " ", 1))), 0o644)
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	master.WaitUptime(time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sentinel did not start")
		}
	}
	roundTrip(t, Config{URL: fmt.Sprintf("redis://127.0.0.1:%d?master_name=lanes", port)})
	if keys := master.Keys(); len(keys) == 0 {
		t.Fatal("nothing reached the master")
	}
}

func freeTCPPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
