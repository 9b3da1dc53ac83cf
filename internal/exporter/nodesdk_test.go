package exporter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// nodeSDK is the directory of the official OpenAI Node SDK, installed by
// make tools (npm ci).
const nodeSDK = "testdata/node-sdk"

// Through the proxy, a retry by the official OpenAI Node SDK (marked with
// X-Stainless-Retry-Count, after a 502) queues with the arrival of its
// call's first attempt: behind a call that arrived earlier, ahead of one
// that arrived after the first attempt. A request with a forged retry
// header, for a call the proxy never saw, gains nothing. (The same
// scenario as lanehttp's TestOpenAIRetryKeepsItsPlace, with openai-go.)
//
//	t=0   a holder takes the only slot; E (bulk) queues
//	t=30  F (default) queues; the holder leaves; F outranks E by class
//	t=35  L (default) queues
//	t=60  F's first attempt gets a 502; E has aged to default and, having
//	      arrived first, takes the slot; the SDK retries F, which queues
//	      with arrival 30; X (default) queues with a forged retry header
//	then  E ends: F (30) goes before L (35), X (60) last
func TestNodeSDKRetryKeepsItsPlace(t *testing.T) {
	if _, err := os.Stat(filepath.Join(nodeSDK, "node_modules", "openai")); err != nil {
		t.Fatalf("the OpenAI Node SDK is not installed (%v): run make tools", err)
	}
	answerF, answerE := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	var mu sync.Mutex
	var order []string
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("X-Test-Call")
		mu.Lock()
		order = append(order, id)
		first := id == "F" && !strings.Contains(strings.Join(order[:len(order)-1], ","), "F")
		mu.Unlock()
		var wait chan struct{}
		switch {
		case first:
			wait = answerF
		case id == "E":
			wait = answerE
		}
		if wait != nil {
			select {
			case <-wait:
			case <-done:
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if first {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"message":"upstream down","type":"server_error"}}`)
			return
		}
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":"protolabs/smart","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"answer for %s"}}]}`, id)
	}))
	defer gw.Close()
	defer close(done)

	cfg, err := ParseConfig("t.yaml", []byte(fmt.Sprintf("limiter: {max_inflight: 1}\nupstreams: [{name: gw, base_url: %q}]\n", gw.URL+"/v1")))
	if err != nil {
		t.Fatal(err)
	}
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	events := make(chan limiter.EventKind, 64)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	srv, err := New(cfg, Options{Clock: clock, Base: base, Observers: []limiter.Observer{func(_ context.Context, e limiter.Event) {
		if e.Kind == limiter.Enqueued || e.Kind == limiter.Acquired {
			events <- e.Kind
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	proxy := front.URL + "/proxy/gw"

	expect := func(k limiter.EventKind, what string) {
		t.Helper()
		select {
		case got := <-events:
			if got != k {
				t.Fatalf("%s: event %s, want %s", what, got, k)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no %s event", what, k)
		}
	}
	var wg sync.WaitGroup
	results := make(chan string, 8)
	node := func(id, priority string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			cmd := exec.Command("node", "chat.mjs", proxy, id, priority, "prompt of "+id)
			cmd.Dir, cmd.Stdout, cmd.Stderr = nodeSDK, &out, &out
			err := cmd.Run()
			var res struct{ OK bool }
			if json.Unmarshal(out.Bytes(), &res); err != nil || !res.OK {
				results <- fmt.Sprintf("%s: %v: %s", id, err, out.String())
			}
		}()
	}

	holder, err := srv.Limiter().Acquire(context.Background(), limiter.LaneKey(gw.URL+"/v1", "protolabs/smart"))
	if err != nil {
		t.Fatal(err)
	}
	expect(limiter.Acquired, "holder")
	node("E", "bulk")
	expect(limiter.Enqueued, "E")
	clock.Advance(30 * time.Second)
	node("F", "default")
	expect(limiter.Enqueued, "F")
	holder.Release()
	expect(limiter.Acquired, "F")
	clock.Advance(5 * time.Second)
	node("L", "default")
	expect(limiter.Enqueued, "L")
	clock.Advance(25 * time.Second)
	close(answerF) // 502: the slot goes to E, aged; the SDK retries F
	expect(limiter.Acquired, "E")
	expect(limiter.Enqueued, "F's retry")
	// A request that claims to be a retry, for a call never seen.
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, _ := http.NewRequest(http.MethodPost, proxy+"/chat/completions",
			strings.NewReader(`{"model":"protolabs/smart","messages":[{"role":"user","content":"prompt of X"}]}`))
		req.Header.Set("Authorization", "Bearer sk-node-test")
		req.Header.Set("X-Stainless-Retry-Count", "2")
		req.Header.Set("X-Test-Call", "X")
		req.Header.Set("X-LLM-Priority", "default")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			results <- "X: " + err.Error()
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}()
	expect(limiter.Enqueued, "X")
	close(answerE)
	wg.Wait()
	close(results)
	for r := range results {
		t.Error(r)
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "F,E,F,L,X" {
		t.Fatalf("gateway order %s, want F,E,F,L,X: the SDK's retry ahead of L, the forged retry last", got)
	}
}

// The official OpenAI Node SDK with a 6 s timeout and two retries, queued
// behind a held slot: it sends X-Stainless-Timeout: 6, and the lane
// answers 503 lane_deadline 5.5 s in on its clock, before the SDK's own
// timer: one attempt, a typed error (InternalServerError, code
// lane_deadline), no retry.
func TestNodeSDKDeadline(t *testing.T) {
	if _, err := os.Stat(filepath.Join(nodeSDK, "node_modules", "openai")); err != nil {
		t.Fatalf("the OpenAI Node SDK is not installed (%v): run make tools", err)
	}
	r := newProxy(t, oneSlot+"proxy: {stall_timeout: 1h, response_header_timeout: 1h}\n")
	r.holdSlot()
	hitsBefore := r.hits.Load()
	out := nodeChat(r.front.URL+"/proxy/gw", "short", "bulk", "hi", "6000")
	r.waitQueued("protolabs/smart", 1)
	sent := time.Now()
	r.clock.Advance(5500 * time.Millisecond)
	res := nodeResult(t, out)
	if res.OK || res.Status != 503 || res.Code != lanehttp.DeadlineCode || res.Type != "InternalServerError" {
		t.Fatalf("%+v, want a typed 503 %s", res, lanehttp.DeadlineCode)
	}
	if took := time.Since(sent); took > 5*time.Second {
		t.Fatalf("answered %s after the deadline's margin", took)
	}
	if n := r.hits.Load() - hitsBefore; n != 1 {
		t.Fatalf("%d attempts reached the proxy, want 1 (no retry)", n)
	}
	close(r.up.hold)
}

// A stream of the official OpenAI Node SDK that waits past the first
// keepalive (15 s) and then times out in the queue (30 s): the timeout
// comes as OpenAI's in-stream error event, which the SDK raises while it
// iterates (an APIError) and does not retry.
func TestNodeSDKStreamError(t *testing.T) {
	if _, err := os.Stat(filepath.Join(nodeSDK, "node_modules", "openai")); err != nil {
		t.Fatalf("the OpenAI Node SDK is not installed (%v): run make tools", err)
	}
	r := newProxy(t, `limiter: {max_inflight: 1, queue_timeout: 30s, interactive_reserve: 0}
upstreams:
  - {name: gw, base_url: UPSTREAM, capacity: 4, cancel_propagates: true}
proxy: {stall_timeout: 1h, response_header_timeout: 1h}
`)
	r.holdSlot()
	hitsBefore := r.hits.Load()
	out := nodeChat(r.front.URL+"/proxy/gw", "stream", "default", "hi", "0", "stream")
	r.waitQueued("protolabs/smart", 1)
	r.clock.Advance(15 * time.Second)
	r.clock.Advance(15 * time.Second)
	res := nodeResult(t, out)
	if res.OK || res.Type != "APIError" || !strings.Contains(res.Message, lanehttp.QueueTimeoutCode) {
		t.Fatalf("%+v, want the queue timeout raised from the stream", res)
	}
	if n := r.hits.Load() - hitsBefore; n != 1 {
		t.Fatalf("%d attempts reached the proxy, want 1 (no retry)", n)
	}
	close(r.up.hold)
}

// nodeChat runs chat.mjs with args in the background; its one JSON line
// comes on the channel (a failed call exits 1, its JSON printed).
func nodeChat(args ...string) <-chan []byte {
	out := make(chan []byte, 1)
	go func() {
		cmd := exec.Command("node", append([]string{"chat.mjs"}, args...)...)
		cmd.Dir = nodeSDK
		b, _ := cmd.Output()
		out <- b
	}()
	return out
}

// nodeChatResult is the line chat.mjs prints.
type nodeChatResult struct {
	OK                  bool
	Status              int
	Code, Type, Message string
}

// nodeResult reads how a chat.mjs call ended, within 30 s.
func nodeResult(t *testing.T, out <-chan []byte) nodeChatResult {
	t.Helper()
	var got []byte
	select {
	case got = <-out:
	case <-time.After(30 * time.Second):
		t.Fatal("the SDK never returned")
	}
	var res nodeChatResult
	if err := json.Unmarshal(got, &res); err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	return res
}
