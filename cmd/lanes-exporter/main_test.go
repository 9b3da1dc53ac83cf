package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitFor(t *testing.T, url, want string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(string(b), want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed %q", url, want)
		}
	}
}

// The real run loop: start from a file, reload on SIGHUP, stop on SIGTERM.
func TestSIGHUPReloadsAndSIGTERMStops(t *testing.T) {
	addr := freeAddr(t)
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	write := func(limit int) {
		os.WriteFile(file, []byte(fmt.Sprintf("listen: %s\nlimiter: {max_inflight: %d}\nupstreams: [{name: gw, base_url: \"http://127.0.0.1:1/v1\"}]\n", addr, limit)), 0o600)
	}
	write(0)
	code := make(chan int, 1)
	go func() { code <- run([]string{"--config", file, "--log-level", "error"}) }()
	waitFor(t, "http://"+addr+"/api/telemetry/llm-lanes", `{"enabled":false}`)
	write(4)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "http://"+addr+"/api/telemetry/llm-lanes", `"enabled":true`)
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d", c)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("SIGTERM did not stop it")
	}
}

func TestBadConfigRefusesToStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte("limiter: {max_inflight: -1}\nupstreams: [{name: gw, base_url: \"https://gw\"}]\n"), 0o600)
	stderr := captureStderr(t, func() {
		if c := run([]string{"--config", file}); c != 1 {
			t.Fatalf("exit %d, want 1", c)
		}
	})
	if !strings.Contains(stderr, file) || !strings.Contains(stderr, "limiter.max_inflight") {
		t.Fatalf("stderr %q", stderr)
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	out := captureStderr(t, func() {
		if c := run([]string{"--help"}); c != 2 {
			t.Fatalf("exit %d", c)
		}
	})
	for _, f := range []string{"-config", "-listen", "-demo", "-shutdown-timeout", "-log-level", "X-LLM-Priority", "/-/reload"} {
		if !strings.Contains(out, f) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, _ := os.Pipe()
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, r)
		done <- b.String()
	}()
	f()
	os.Stderr = old
	w.Close()
	return <-done
}
