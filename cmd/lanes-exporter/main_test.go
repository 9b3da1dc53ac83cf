package main

import (
	"bytes"
	"encoding/json"
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

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
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
	go func() { code <- run([]string{"--config", file, "--log-level", "error"}, io.Discard, io.Discard) }()
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
	var stderr bytes.Buffer
	if c := run([]string{"--config", file}, io.Discard, &stderr); c != 1 {
		t.Fatalf("exit %d, want 1", c)
	}
	if !strings.Contains(stderr.String(), file) || !strings.Contains(stderr.String(), "limiter.max_inflight") {
		t.Fatalf("stderr %q", stderr.String())
	}
}

// --help exits 0 and lists every flag and every route.
func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if c := run([]string{"--help"}, &out, &errOut); c != 0 {
		t.Fatalf("--help exit %d, want 0", c)
	}
	if n := strings.Count(out.String(), "Usage:"); n != 1 || errOut.Len() != 0 {
		t.Fatalf("--help printed its usage %d times on stdout and %q on stderr, want once on stdout alone", n, errOut.String())
	}
	for _, f := range []string{"-config", "-check-config", "-listen", "-demo", "-shutdown-timeout", "-log.level", "-log.format",
		"-web.enable-lifecycle", "-version", "X-LLM-Priority", "/proxy/", "/metrics", "/api/telemetry/llm-lanes ",
		"/api/telemetry/llm-lanes/classification", "/api/telemetry/llm-lanes/budget", "/healthz", "/-/healthy", "/-/ready",
		"/-/reload", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
	}
	if c := run([]string{"--no-such-flag"}, io.Discard, io.Discard); c != 2 {
		t.Fatalf("a bad flag: exit %d, want 2", c)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if c := run([]string{"--version"}, &out, io.Discard); c != 0 || !strings.HasPrefix(out.String(), "lanes-exporter ") ||
		!strings.Contains(out.String(), "go1.") {
		t.Fatalf("--version: exit %d, %q", c, out.String())
	}
}

// --check-config says whether a file is good, and what is wrong with it.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n"), 0o600)
	os.WriteFile(bad, []byte("limiter: {max_inflight: lots}\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n"), 0o600)
	var out, errOut bytes.Buffer
	if c := run([]string{"--check-config", good}, &out, &errOut); c != 0 || !strings.Contains(out.String(), "ok") {
		t.Fatalf("good file: exit %d, %q %q", c, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if c := run([]string{"--check-config", bad}, &out, &errOut); c != 1 ||
		!strings.Contains(errOut.String(), bad) || !strings.Contains(errOut.String(), "line 1: want a whole number, got text `lots`") {
		t.Fatalf("bad file: exit %d, %q", c, errOut.String())
	}
	if c := run([]string{"--check-config", filepath.Join(dir, "missing.yaml")}, io.Discard, io.Discard); c != 1 {
		t.Fatalf("missing file: exit %d", c)
	}
	// The example in the repository is good.
	if c := run([]string{"--check-config", "../../lanes.example.yaml"}, io.Discard, io.Discard); c != 0 {
		t.Fatal("lanes.example.yaml does not check")
	}
}

// --log.format json: every line is JSON, the proxy's errors included.
func TestJSONLogs(t *testing.T) {
	addr := freeAddr(t)
	dead := freeAddr(t) // nothing listens there
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf("listen: %s\nlimiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \"http://%s/v1\"}]\n", addr, dead)), 0o600)
	var logs logbuf.Buffer
	code := make(chan int, 1)
	go func() { code <- run([]string{"--config", file, "--log.format", "json"}, io.Discard, &logs) }()
	waitFor(t, "http://"+addr+"/-/ready", "ready")
	res, err := http.Post("http://"+addr+"/proxy/gw/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	<-code
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	sawProxyError := false
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q", l)
		}
		sawProxyError = sawProxyError || m["msg"] == "upstream unreachable"
	}
	if !sawProxyError || len(lines) < 3 {
		t.Fatalf("the proxy's error is not in the logs:\n%s", logs.String())
	}
}

// --check-config never echoes a Redis URL's secret: a password in its user
// information, a Sentinel's ?password=, both, or a URL that does not parse
// (as internal/exporter's TestRedisURLsRedacted does for the log).
func TestCheckConfigRedactsRedisURLs(t *testing.T) {
	for i, u := range []string{
		"redis://user:SECRET-1@127.0.0.1:1/0",
		"redis://127.0.0.1:1/0?master_name=lanes&password=SECRET-2",
		"redis://:SECRET-3@127.0.0.1:1/0?master_name=lanes&password=SECRET-4&addr=127.0.0.1:2",
		"redis://:Xy#SECRET-5@h:6379/0",
	} {
		file := filepath.Join(t.TempDir(), "lanes.yaml")
		os.WriteFile(file, []byte(fmt.Sprintf("upstreams: [{name: gw, base_url: \"https://gw/v1\"}]\nshared: {redis_url: %q, lease_ttl: -1s}\n", u)), 0o600)
		var out, errOut bytes.Buffer
		if c := run([]string{"--check-config", file}, &out, &errOut); c != 1 {
			t.Fatalf("form %d: --check-config exit %d, want 1 (a bad lease_ttl)", i, c)
		}
		if all := out.String() + errOut.String(); strings.Contains(all, "SECRET") || !strings.Contains(all, "shared") {
			t.Fatalf("form %d: --check-config says %q", i, all)
		}
	}
}

// The listener flags: a bad web config stops the start with a clear
// message (exit 1), naming the file and what is wrong; basic auth with one
// address is refused, saying to give the telemetry its own address; the
// flags that only --config takes are refused with --demo.
func TestWebConfigFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lanes.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf("listen: %s\nupstreams: [{name: gw, base_url: \"http://127.0.0.1:1/v1\"}]\n", freeAddr(t))), 0o600)
	web := filepath.Join(dir, "web.yml")
	for _, tc := range []struct {
		web  string
		args []string
		code int
		want string
	}{
		{"tls_server_config: {cert_file: none.pem, key_file: none.key}\n", []string{"--web.listen-address", freeAddr(t), "--web.config.file", web}, 1, "none.pem"},
		{"basic_auth_users: {prometheus: x}\n", []string{"--web.config.file", web}, 1, "give the telemetry its own address (--web.listen-address)"},
		{"{}\n", []string{"--web.config.file", web, "--proxy.web.config.file", web}, 2, "not both"},
	} {
		os.WriteFile(web, []byte(tc.web), 0o600)
		var stderr bytes.Buffer
		if c := run(append([]string{"--config", file, "--log-level", "error"}, tc.args...), io.Discard, &stderr); c != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, want %d; stderr %q does not say %q", tc.args, c, tc.code, stderr.String(), tc.want)
		}
	}
	var stderr bytes.Buffer
	if c := run([]string{"--demo", "--web.listen-address", freeAddr(t)}, io.Discard, &stderr); c != 2 || !strings.Contains(stderr.String(), "are for --config") {
		t.Errorf("--demo with --web.listen-address: exit %d, %q", c, stderr.String())
	}
}
