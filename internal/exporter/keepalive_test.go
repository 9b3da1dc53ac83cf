package exporter

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// lines reads res's body line by line onto a channel, closed at its end.
func lines(res *http.Response) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				ch <- sc.Text()
			}
		}
	}()
	return ch
}

func nextLine(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the stream ended", what)
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing came", what)
		return ""
	}
}

// A streamed call from a client with a 30 s read timeout, as openai-python
// sends it (X-Stainless-Read-Timeout: 30.0; openai-python itself is in no
// registry this project installs from, so a Go client stands in for it:
// its headers, and a read timeout checked on the lane's clock between
// lines), waits 2 minutes behind a held slot and completes: committed
// within 15 s, a comment every 15 s after, never 30 s without a byte; its
// read timeout is no deadline for a kept-alive stream.
func TestQueuedStreamKeptAlive(t *testing.T) {
	r := newProxy(t, oneSlot+"proxy: {stall_timeout: 1h, response_header_timeout: 1h}\n")
	r.holdSlot()
	got := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/proxy/gw/chat/completions", strings.NewReader(chat))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Stainless-Read-Timeout", "30.0")
		req.Header.Set("X-Stainless-Retry-Count", "0")
		req.Header.Set("X-Test-Call", "py")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- res
	}()
	r.waitQueued("protolabs/smart", 1)
	r.clock.Advance(14 * time.Second)
	select {
	case <-got:
		t.Fatal("answered before the first keepalive was due")
	default:
	}
	r.clock.Advance(time.Second)
	var res *http.Response
	select {
	case res = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer committed at 15 s")
	}
	if res == nil || res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("committed %v, want 200 text/event-stream", res)
	}
	defer res.Body.Close()
	ch := lines(res)
	if l := nextLine(t, ch, "at 15 s"); !strings.HasPrefix(l, ": lane queued position=1 waited=15s") {
		t.Fatalf("first line %q, want the queued comment", l)
	}
	for i := 2; i <= 8; i++ { // to 120 s: one comment every 15 s
		r.clock.Advance(15 * time.Second)
		if l := nextLine(t, ch, "a keepalive"); !strings.HasPrefix(l, ": lane queued") {
			t.Fatalf("line %q, want a keepalive comment", l)
		}
	}
	if q := r.snapshot("protolabs/smart").Queued; q != 1 {
		t.Fatalf("queued %d after 120 s with a read timeout of 30 s, want 1: no deadline for a kept-alive stream", q)
	}
	close(r.up.hold)
	var data []string
	for l := range ch {
		data = append(data, l)
	}
	if strings.Join(data, "|") != `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}|data: {"choices":[{"index":0,"delta":{"content":"b"}}]}|data: [DONE]` {
		t.Fatalf("the stream after its grant: %q", data)
	}
}

// A kept-alive stream that times out in the queue gets OpenAI's in-stream
// error event, which openai-go raises as the stream's error: one attempt,
// no retry. A stream granted before the first keepalive is untouched
// (TestProxyPriority).
func TestQueuedStreamErrorWithOpenAI(t *testing.T) {
	r := newProxy(t, `limiter: {max_inflight: 1, queue_timeout: 30s, interactive_reserve: 0}
upstreams:
  - {name: gw, base_url: UPSTREAM, capacity: 4, cancel_propagates: true}
proxy: {stall_timeout: 1h, response_header_timeout: 1h}
`)
	r.holdSlot()
	hitsBefore := r.hits.Load()
	done := make(chan error, 1)
	go func() {
		c := openai.NewClient(option.WithBaseURL(r.front.URL+"/proxy/gw/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(2))
		s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "protolabs/smart",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		for s.Next() {
		}
		done <- s.Err()
	}()
	r.waitQueued("protolabs/smart", 1)
	r.clock.Advance(15 * time.Second)
	r.clock.Advance(15 * time.Second)
	var err2 error
	select {
	case err2 = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never ended")
	}
	if err2 == nil || !strings.Contains(err2.Error(), lanehttp.QueueTimeoutCode) {
		t.Fatalf("err %v, want the queue timeout as the stream's error", err2)
	}
	var apiErr *openai.Error
	if errors.As(err2, &apiErr) && apiErr.StatusCode != 200 {
		t.Fatalf("status %d: the answer was committed as 200", apiErr.StatusCode)
	}
	if n := r.hits.Load() - hitsBefore; n != 1 {
		t.Fatalf("%d requests reached the proxy, want 1 (no retry)", n)
	}
	close(r.up.hold)
}

func TestKeepAliveEvery(t *testing.T) {
	cfg := &Config{}
	cfg.Proxy.StreamKeepaliveEvery = Duration(15 * time.Second)
	h := http.Header{}
	if d := keepAliveEvery(cfg, []byte(`{"model":"m","stream":true}`), h); d != 15*time.Second {
		t.Errorf("a stream: %s", d)
	}
	if d := keepAliveEvery(cfg, []byte(`{"model":"m","stream":false,"x":"\"stream\""}`), h); d != 0 {
		t.Errorf("not a stream: %s", d)
	}
	h.Set("X-Stainless-Read-Timeout", "8")
	if d := keepAliveEvery(cfg, []byte(`{"stream":true}`), h); d != 4*time.Second {
		t.Errorf("read timeout 8 s: %s, want 4 s", d)
	}
	off := false
	cfg.Proxy.StreamKeepalive = &off
	if d := keepAliveEvery(cfg, []byte(`{"stream":true}`), h); d != 0 {
		t.Errorf("off: %s", d)
	}
}

// A committed stream's error answer becomes one in-stream event as soon
// as it is whole: JSON once it parses (however it was split), other text
// at the first flush; a 200 passes through.
func TestCommittedStreamEvents(t *testing.T) {
	for _, c := range []struct {
		name      string
		anthropic bool
		status    int
		writes    []string
		flush     bool
		want      string
	}{
		{"openai, split JSON", false, 503, []string{`{"error":{"message":"no slot","type":"queue_timeout",`, `"code":"lane_queue_timeout"}}`}, false,
			`data: {"error":{"code":"lane_queue_timeout","message":"503 lane_queue_timeout: no slot","type":"queue_timeout"}}` + "\n\n"},
		{"anthropic", true, 429, []string{`{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`}, false,
			`event: error` + "\n" + `data: {"error":{"message":"429 slow down","type":"rate_limit_error"},"type":"error"}` + "\n\n"},
		{"text at the flush", false, 502, []string{"Bad Gateway"}, true,
			`data: {"error":{"code":null,"message":"502 Bad Gateway","type":""}}` + "\n\n"},
		{"200 passes", false, 200, []string{"data: x\n\n"}, true, "data: x\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			cs := newCommittedStream(rec, c.anthropic)
			cs.Header().Set("Content-Type", "application/json") // not sent: the answer is committed
			cs.WriteHeader(c.status)
			for _, w := range c.writes {
				cs.Write([]byte(w))
			}
			if c.flush {
				cs.FlushError()
			}
			cs.Write([]byte(" trailing"))
			got := rec.Body.String()
			if c.status == 200 {
				got = strings.TrimSuffix(got, " trailing")
			}
			if got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}
