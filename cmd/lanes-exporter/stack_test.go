package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A call queued over HTTP/2 keeps a 4 KiB goroutine stack while it waits,
// traced or not: the invariant of docs/DESIGN.md, "A queued call's stack",
// and this is its one test. The binary is built without the race detector,
// whose frames are bigger, and the calls come from this process, so the
// exporter's stacks are its handlers': 300 queued calls, measured from its
// own metrics; traced, every call's spans are recorded (to the console
// exporter, whose output is dropped).
func TestQueuedCallStack(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "lanes-exporter")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, traced := range []bool{false, true} {
		t.Run(fmt.Sprintf("traced=%v", traced), func(t *testing.T) {
			per := queuedStack(t, bin, traced)
			t.Logf("%.2f KiB of goroutine stack per queued call", per)
			if per > 6 {
				t.Errorf("%.2f KiB of goroutine stack per call queued over HTTP/2, want 4 (a handler's stack that grew to 8 KiB before it waited)", per)
			}
		})
	}
}

// queuedStack runs lanes-exporter, queues 300 calls behind one held slot,
// and returns the goroutine stack per queued call, in KiB.
func queuedStack(t *testing.T, bin string, traced bool) float64 {
	release := make(chan struct{})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer gw.Close()
	defer close(release)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nlimiter: {max_inflight: 1, queue_timeout: 10m}\nupstreams: [{name: gw, base_url: %q}]\n", addr, gw.URL+"/v1")), 0o644)
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if traced {
		cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=console")
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	base := "http://" + addr
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res, err := http.Get(base + "/metrics"); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lanes-exporter is not listening")
		}
	}

	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	call := func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/proxy/gw/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		if res, err := client.Do(req); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	wg.Add(1)
	go call() // holds the lane's only slot
	waitQueued(t, base, 0)
	before := stackInuse(t, base)
	const queued = 300
	for range queued {
		wg.Add(1)
		go call()
	}
	waitQueued(t, base, queued)
	return float64(stackInuse(t, base)-before) / queued / 1024
}

// waitQueued waits until the lane's slot is held and queued calls wait,
// from the snapshot route.
func waitQueued(t *testing.T, base string, queued int) {
	t.Helper()
	want := fmt.Sprintf(`"inflight":1,"queued":%d,`, queued)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		res, err := http.Get(base + "/api/telemetry/llm-lanes")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(string(b), want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lane with %s", want)
		}
	}
}

// stackInuse reads go_memstats_stack_inuse_bytes from the exporter.
func stackInuse(t *testing.T, base string) int64 {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_stack_inuse_bytes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(f)
		}
	}
	t.Fatal("no go_memstats_stack_inuse_bytes")
	return 0
}
