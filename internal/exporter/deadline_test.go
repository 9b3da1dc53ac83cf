package exporter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// The client's stated timeout through the proxy: openai-go with a request
// timeout of 6 s and two retries sends X-Stainless-Timeout: 6. Queued
// behind a held slot, its call is answered 503 lane_deadline with
// x-should-retry: false when 5.5 s have passed on the lane's clock, before
// the client's own timer: one attempt, a typed error, no retry.
func TestProxyDeadlineWithOpenAI(t *testing.T) {
	r := newProxy(t, oneSlot+"proxy: {stall_timeout: 1h, response_header_timeout: 1h}\n")
	r.holdSlot()
	hitsBefore := r.hits.Load()
	done := make(chan error, 1)
	go func() {
		c := openai.NewClient(option.WithBaseURL(r.front.URL+"/proxy/gw/"), option.WithAPIKey("sk-test"),
			option.WithMaxRetries(2), option.WithRequestTimeout(6*time.Second))
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "protolabs/smart",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		done <- err
	}()
	r.waitQueued("protolabs/smart", 1)
	r.clock.Advance(5400 * time.Millisecond)
	if l := r.snapshot("protolabs/smart"); l.Queued != 1 {
		t.Fatalf("queued %d before the deadline's margin, want 1", l.Queued)
	}
	start := time.Now()
	r.clock.Advance(100 * time.Millisecond)
	var err2 error
	select {
	case err2 = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never ended")
	}
	var apiErr *openai.Error
	if !errors.As(err2, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != lanehttp.DeadlineCode ||
		apiErr.Response.Header.Get("X-Should-Retry") != "false" || apiErr.Response.Header.Get("Retry-After") == "" {
		t.Fatalf("err %v, want a 503 %s marked not to retry, with a Retry-After", err2, lanehttp.DeadlineCode)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("answered %s after the deadline's margin passed", took)
	}
	if n := r.hits.Load() - hitsBefore; n != 1 {
		t.Fatalf("%d requests reached the proxy, want 1 (no retry)", n)
	}
	l := r.snapshot("protolabs/smart")
	if l.GaveUp5m == nil || l.GaveUp5m.Deadline.Default != 1 || l.QueueTimeouts5m != 0 {
		t.Fatalf("snapshot gave up %+v, timeouts %d: want one deadline", l.GaveUp5m, l.QueueTimeouts5m)
	}
	close(r.up.hold)
}

// whole is a chat call that asks for a whole answer, not a stream (a
// queued stream is kept alive: TestQueuedStreamKeptAlive).
const whole = `{"model":"protolabs/smart","messages":[]}`

// X-LLM-Timeout comes first and is not forwarded; a bad value of it is
// ignored for the next header, never refused.
func TestProxyTimeoutHeaders(t *testing.T) {
	r := newProxy(t, oneSlot+"proxy: {stall_timeout: 1h, response_header_timeout: 1h}\n")
	long := r.holdSlot()
	send := func(h map[string]string) <-chan *http.Response {
		ch := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/proxy/gw/chat/completions", strings.NewReader(whole))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range h {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				close(ch)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			ch <- res
		}()
		return ch
	}
	recv := func(ch <-chan *http.Response) *http.Response {
		select {
		case res := <-ch:
			return res
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
			return nil
		}
	}
	a := send(map[string]string{"X-LLM-Timeout": "3", "X-Stainless-Timeout": "600"})
	r.waitQueued("protolabs/smart", 1)
	b := send(map[string]string{"X-LLM-Timeout": "NaN", "X-Stainless-Timeout": "-1", "X-Stainless-Read-Timeout": "10.0"})
	r.waitQueued("protolabs/smart", 2)
	r.clock.Advance(2500 * time.Millisecond)
	if res := recv(a); res == nil || res.StatusCode != 503 {
		t.Fatalf("X-LLM-Timeout 3: %v, want a 503 at 2.5 s", res)
	}
	if q := r.snapshot("protolabs/smart").Queued; q != 1 {
		t.Fatalf("queued %d, want the call with a read timeout of 10 s still queued", q)
	}
	r.clock.Advance(7 * time.Second)
	if res := recv(b); res == nil || res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("read timeout 10: %v, want a 503 at 9.5 s", res)
	}
	close(r.up.hold)
	io.Copy(io.Discard, long.Body)
	c := send(map[string]string{"X-LLM-Timeout": "30", "X-Test-Call": "stated"})
	if res := recv(c); res == nil || res.StatusCode != 200 {
		t.Fatalf("a call with a free slot: %v", res)
	}
	for _, h := range r.up.hdrs {
		if h.Get("X-LLM-Timeout") != "" {
			t.Fatal("X-LLM-Timeout reached the upstream")
		}
	}
}
