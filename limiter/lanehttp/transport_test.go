package lanehttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// 1. The slot is held for the whole stream.
func TestSlotHeldForWholeStream(t *testing.T) {
	r := newRig(t, on(1))
	hold := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		if s.ID == "first" {
			r.gw.streamChunks(w, s.Model, []string{"a", "b"}, hold, req.Context())
			return true
		}
		return false
	}
	c := r.client()
	first := c.Chat.Completions.NewStreaming(callCtx("first", limiter.Default), params(), option.WithHeader("X-Test-Call", "first"))
	if !first.Next() { // the first chunk is here; the stream goes on
		t.Fatalf("first stream: %v", first.Err())
	}
	second := make(chan string, 1)
	go func() {
		s := c.Chat.Completions.NewStreaming(callCtx("second", limiter.Default), params(), option.WithHeader("X-Test-Call", "second"))
		text, err := streamText(s)
		s.Close()
		if err != nil {
			text = err.Error()
		}
		second <- text
	}()
	r.waitEnqueued("second")
	r.expectCounts(1, 1)
	if ids := r.gw.ids(); len(ids) != 1 {
		t.Fatalf("gateway saw %v while the first stream ran", ids)
	}
	close(hold)
	if text, err := streamText(first); text != "b" || err != nil {
		t.Fatalf("rest of first stream %q %v", text, err)
	}
	first.Close()
	var got string
	select {
	case got = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("second stream never ended")
	}
	if got != "Hello world" {
		t.Fatalf("second stream: %q", got)
	}
	r.expectCounts(0, 0)
}

func TestClosingOrCancelingStreamFreesSlotAtOnce(t *testing.T) {
	r := newRig(t, on(1))
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		r.gw.streamChunks(w, s.Model, []string{"a", "b"}, make(chan struct{}), req.Context()) // never finishes by itself
		return true
	}
	c := r.client()
	// Close mid-stream.
	s := c.Chat.Completions.NewStreaming(callCtx("closed", limiter.Default), params())
	if !s.Next() {
		t.Fatal(s.Err())
	}
	r.expectCounts(1, 0)
	s.Close()
	r.expectCounts(0, 0)

	// Cancel mid-stream.
	ctx, cancel := context.WithCancel(callCtx("canceled", limiter.Default))
	s = c.Chat.Completions.NewStreaming(ctx, params())
	if !s.Next() {
		t.Fatal(s.Err())
	}
	r.expectCounts(1, 0)
	cancel()
	for s.Next() {
	}
	if !errors.Is(s.Err(), context.Canceled) {
		t.Fatalf("stream err %v", s.Err())
	}
	r.expectCounts(0, 0)
	s.Close()
	// The closed stream had data, and its context is alive: it counts as
	// ok (SDKs close at the end marker, before EOF); the canceled one as
	// canceled.
	if u := r.snapshot().Upstream; u == nil || u.Canceled != 1 || u.OK != 1 {
		t.Fatalf("upstream %+v, want 1 ok and 1 canceled", u)
	}
}

// 2. Chat completions through openai-go, off and on.
func TestOpenAIClientOffAndOn(t *testing.T) {
	for _, limit := range []int{0, 2} {
		r := newRig(t, on(limit))
		c := r.client()
		got, err := c.Chat.Completions.New(callCtx("plain", limiter.Default), params())
		if err != nil || got.Choices[0].Message.Content != "Hello world" {
			t.Fatalf("limit %d: New = %v, %v", limit, got, err)
		}
		s := c.Chat.Completions.NewStreaming(callCtx("stream", limiter.Default), params())
		text, err := streamText(s)
		s.Close()
		if err != nil || text != "Hello world" {
			t.Fatalf("limit %d: stream %q %v", limit, text, err)
		}
		snap := r.lim.Snapshot()
		if limit == 0 {
			if snap.Enabled {
				t.Fatal("snapshot enabled with limit 0")
			}
			continue
		}
		l := r.snapshot()
		if l.Inflight != 0 || l.Upstream == nil || l.Upstream.OK != 2 {
			t.Fatalf("limit %d: lane %+v upstream %+v", limit, l, l.Upstream)
		}
	}
}

// 3. Queue wait does not start the request or stall timeout.
func TestQueueWaitDoesNotCountTowardTimeouts(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.ResponseHeaderTimeout = time.Second
	r.tr.StallTimeout = time.Second
	held := r.hold()
	done := make(chan error, 1)
	go func() {
		_, err := r.client().Chat.Completions.New(callCtx("waiter", limiter.Default), params())
		done <- err
	}()
	r.waitEnqueued("waiter")
	r.clock.Advance(2 * time.Second) // waits 2 s for its slot, with 1 s limits
	held.Release()
	if err := recv(t, done); err != nil {
		t.Fatalf("call after a 2 s wait: %v", err)
	}
	if l := r.snapshot(); l.Upstream == nil || l.Upstream.OK != 1 || l.Upstream.Stalls != 0 {
		t.Fatalf("upstream %+v", l.Upstream)
	}
}

// The limits do apply once the slot is held.
func TestResponseHeaderTimeout(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.ResponseHeaderTimeout = time.Second
	arrived := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		close(arrived)
		select { // never answers; sees the cancellation
		case <-req.Context().Done():
		case <-r.gw.done:
		}
		return true
	}
	done := make(chan error, 1)
	go func() {
		res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`))
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	<-arrived
	r.clock.Advance(time.Second)
	err := recv(t, done)
	var se *lanehttp.StallError
	if !errors.As(err, &se) || se.Phase != "response headers" || errors.Is(err, limiter.ErrQueueTimeout) {
		t.Fatalf("err %v, want a header stall", err)
	}
	r.expectCounts(0, 0)
	if u := r.snapshot().Upstream; u == nil || u.Stalls != 1 {
		t.Fatalf("upstream %+v", u)
	}
}

// 4. A queue timeout through openai-go is answered once and not retried.
func TestQueueTimeoutNotRetriedByOpenAI(t *testing.T) {
	r := newRig(t, on(1))
	held := r.hold()
	defer held.Release()
	done := make(chan error, 1)
	go func() {
		c := r.client(option.WithMaxRetries(2))
		_, err := c.Chat.Completions.New(callCtx("late", limiter.Bulk), params(), option.WithHeader("X-Test-Call", "late"))
		done <- err
	}()
	r.waitEnqueued("late")
	r.clock.Advance(limiter.DefaultQueueTimeout)
	err := recv(t, done)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %T %v, want *openai.Error", err, err)
	}
	if apiErr.StatusCode != 503 || apiErr.Code != lanehttp.QueueTimeoutCode || !strings.Contains(apiErr.Message, r.lane()) {
		t.Fatalf("status %d code %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Message)
	}
	if got := apiErr.Response.Header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("x-should-retry %q", got)
	}
	// With no hold times known yet, come back after one queue timeout.
	if got := apiErr.Response.Header.Get("Retry-After"); got != "300" {
		t.Fatalf("retry-after %q, want 300", got)
	}
	qe, ok := lanehttp.QueueTimeoutFrom(apiErr.Response)
	if !ok || qe.Lane != r.lane() || qe.Priority != limiter.Bulk || qe.Waited != limiter.DefaultQueueTimeout || qe.Position != 1 ||
		qe.RetryAfter != limiter.DefaultQueueTimeout {
		t.Fatalf("QueueTimeoutFrom = %+v, %v", qe, ok)
	}
	for _, s := range []string{r.lane(), "waiting 5m0s", "position 1", "raise max_inflight", "queue_timeout (now 5m0s)"} {
		if !strings.Contains(apiErr.Message, s) {
			t.Fatalf("message %q lacks %q", apiErr.Message, s)
		}
	}
	if ids := r.gw.ids(); len(ids) != 0 {
		t.Fatalf("the gateway saw %v", ids)
	}
	// Exactly one acquisition: a retry would have queued (or been granted) again.
	select {
	case id := <-r.enqueued:
		t.Fatalf("a second acquisition by %q", id)
	case id := <-r.acquired:
		t.Fatalf("a second acquisition by %q", id)
	default:
	}
	if l := r.snapshot(); l.QueueTimeouts5m != 1 || l.Queued != 0 {
		t.Fatalf("lane %+v", l)
	}
}

func TestQueueTimeoutAsError(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.ReturnErrors = true
	held := r.hold()
	defer held.Release()
	done := make(chan error, 1)
	go func() {
		req := chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`).WithContext(callCtx("late", limiter.Default))
		res, err := r.hc.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	r.waitEnqueued("late")
	r.clock.Advance(limiter.DefaultQueueTimeout)
	err := recv(t, done)
	var qe *limiter.QueueTimeoutError
	if !errors.Is(err, limiter.ErrQueueTimeout) || !errors.As(err, &qe) || qe.Lane != r.lane() {
		t.Fatalf("err %v, want the typed queue timeout", err)
	}
}

// 5. A stall mid-body gives the stall error, frees the slot, and counts.
func TestStallMidBody(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.StallTimeout = 5 * time.Second
	upstreamCanceled := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		r.gw.streamChunks(w, s.Model, []string{"a", "b"}, make(chan struct{}), req.Context())
		close(upstreamCanceled)
		return true
	}
	res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 4096)
	if n, err := res.Body.Read(buf); n == 0 || err != nil {
		t.Fatalf("first chunk: %d %v", n, err)
	}
	// The caller reads on, waiting for the upstream's next chunk.
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(res.Body)
		read <- err
	}()
	waitInRead(t)
	r.clock.Advance(4 * time.Second)
	r.expectCounts(1, 0) // quiet for 4 s: not yet a stall
	r.clock.Advance(time.Second)
	err = recv(t, read)
	var se *lanehttp.StallError
	if !errors.As(err, &se) || !errors.Is(err, lanehttp.ErrStall) || se.Phase != "response body" || se.Lane != r.lane() {
		t.Fatalf("read err %v, want a body stall", err)
	}
	<-upstreamCanceled // the gateway saw the request end
	r.expectCounts(0, 0)
	if u := r.snapshot().Upstream; u == nil || u.Stalls != 1 || u.OK != 0 {
		t.Fatalf("upstream %+v", u)
	}
}

// A caller that stops reading a stream whose data is waiting does not hold
// its slot hostage: after StallTimeout the exchange ends, the slot is free,
// the upstream request is canceled, and the outcome (client_stall) is not
// the gateway's fault.
func TestCallerThatStopsReadingFreesSlot(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.StallTimeout = 5 * time.Second
	upstreamCanceled := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		r.gw.streamChunks(w, s.Model, []string{"a", "b"}, make(chan struct{}), req.Context())
		close(upstreamCanceled)
		return true
	}
	res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if n, err := res.Body.Read(make([]byte, 4096)); n == 0 || err != nil {
		t.Fatalf("first chunk: %d %v", n, err)
	}
	r.clock.Advance(5 * time.Second) // the caller reads nothing more
	<-upstreamCanceled
	r.expectCounts(0, 0) // freed at once, not when the caller comes back
	_, err = io.ReadAll(res.Body)
	var se *lanehttp.StallError
	if !errors.As(err, &se) || se.Phase != "caller" {
		t.Fatalf("read after the stop: %v, want the caller stall", err)
	}
	if u := r.snapshot().Upstream; u == nil || u.ClientStalls != 1 || u.Stalls != 0 {
		t.Fatalf("upstream %+v, want one client stall and no gateway stall", u)
	}
}

// waitInRead waits until a goroutine is blocked inside the lane transport's
// response body read (the caller's, or the drain's of an abandoned call), so that a test can move the fake clock knowing the
// caller is reading.
func waitInRead(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
		if bytes.Contains(buf[:n], []byte("lanehttp.(*exchange).read(")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no Read in progress")
		}
	}
}

// Reads that keep coming keep the stall guard quiet.
func TestSteadyStreamDoesNotStall(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.StallTimeout = 5 * time.Second
	next := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 4; i++ {
			io.WriteString(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.gw.done:
				return true
			}
		}
		return true
	}
	res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for i := 0; i < 4; i++ {
		if _, err := res.Body.Read(buf); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		r.clock.Advance(4 * time.Second) // 16 s in all, never 5 s quiet
		next <- struct{}{}
	}
	if _, err := io.ReadAll(res.Body); err != nil {
		t.Fatalf("end: %v", err)
	}
	res.Body.Close()
	if u := r.snapshot().Upstream; u == nil || u.OK != 1 || u.Stalls != 0 {
		t.Fatalf("upstream %+v", u)
	}
}

// 6. An SDK retry after a 5xx gives the slot away during the backoff and
// queues again; the retry is counted.
func TestRetryReleasesSlotDuringBackoff(t *testing.T) {
	r := newRig(t, on(1))
	fail := make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		if s.ID == "flaky" && s.Retry == "0" {
			select { // answer 502 once another call has queued behind this attempt
			case <-fail:
			case <-r.gw.done:
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"message":"upstream down","type":"server_error","code":null,"param":null}}`)
			return true
		}
		return false
	}
	c := r.client(option.WithMaxRetries(1))
	flaky := make(chan error, 1)
	go func() {
		_, err := c.Chat.Completions.New(callCtx("flaky", limiter.Default), params(), option.WithHeader("X-Test-Call", "flaky"))
		flaky <- err
	}()
	other := make(chan error, 1)
	<-r.acquired // flaky's first attempt holds the slot
	go func() {
		_, err := r.client().Chat.Completions.New(callCtx("other", limiter.Default), params(), option.WithHeader("X-Test-Call", "other"))
		other <- err
	}()
	r.waitEnqueued("other")
	close(fail)
	if err := recv(t, other); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, flaky); err != nil {
		t.Fatalf("retried call: %v", err)
	}
	got := r.gw.seen()
	if len(got) != 3 || got[0].ID != "flaky" || got[1].ID != "other" || got[2].ID != "flaky" || got[2].Retry != "1" {
		t.Fatalf("gateway saw %+v, want flaky, other (during the backoff), flaky retry", got)
	}
	if u := r.snapshot().Upstream; u == nil || u.Retries != 1 || u.ServerErrors != 1 || u.OK != 2 {
		t.Fatalf("upstream %+v", u)
	}
}

// 7. Priority from the context, end to end through openai-go.
func TestInteractiveOvertakesBulkThroughOpenAI(t *testing.T) {
	r := newRig(t, on(1))
	held := r.hold()
	c := r.client()
	var wg sync.WaitGroup
	start := func(id string, p limiter.Priority) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Chat.Completions.New(callCtx(id, p), params(), option.WithHeader("X-Test-Call", id)); err != nil {
				t.Error(id, err)
			}
		}()
		r.waitEnqueued(id)
	}
	start("bulk1", limiter.Bulk)
	start("bulk2", limiter.Bulk)
	start("bulk3", limiter.Bulk)
	start("chat", limiter.Interactive)
	held.Release()
	wg.Wait()
	if ids := strings.Join(r.gw.ids(), ","); ids != "chat,bulk1,bulk2,bulk3" {
		t.Fatalf("gateway order %s", ids)
	}
}

// 8. Bad requests fail clearly and never reach the gateway.
func TestBadRequests(t *testing.T) {
	cases := []struct {
		name, body string
		status     int
		code       string
		err        error
	}{
		{"no model", `{"messages":[]}`, 400, "missing_model", lanehttp.ErrNoModel},
		{"empty model", `{"model":""}`, 400, "missing_model", lanehttp.ErrNoModel},
		{"model not a string", `{"model":7}`, 400, "missing_model", lanehttp.ErrNoModel},
		{"not JSON", `model=gpt`, 400, "invalid_json", lanehttp.ErrNotJSON},
		{"truncated JSON", `{"model":"m",`, 400, "invalid_json", lanehttp.ErrNotJSON},
		{"too large", `{"model":"m","pad":"` + strings.Repeat("x", 2048) + `"}`, 413, "request_too_large", lanehttp.ErrBodyTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, on(2))
			r.tr.MaxBodyBytes = 1024
			res, err := r.hc.Do(chatRequest(t, r.gw.url(), tc.body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || !bytes.Contains(b, []byte(`"code":"`+tc.code+`"`)) || res.Header.Get("X-Should-Retry") != "false" {
				t.Fatalf("status %d body %s", res.StatusCode, b)
			}
			r.tr.ReturnErrors = true
			_, err = r.hc.Do(chatRequest(t, r.gw.url(), tc.body))
			var re *lanehttp.RequestError
			if !errors.Is(err, tc.err) || !errors.As(err, &re) || strings.Contains(err.Error(), "sk-") {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if ids := r.gw.seen(); len(ids) != 0 {
				t.Fatalf("the gateway saw %+v", ids)
			}
			if n := len(r.lim.Snapshot().Lanes); n != 0 {
				t.Fatalf("%d lanes created by a bad request", n)
			}
		})
	}
}

// Requests that are not model calls pass through without a lane.
func TestNonModelCallsPassThrough(t *testing.T) {
	r := newRig(t, on(1))
	held := r.hold() // the lane is full: model calls would queue
	defer held.Release()
	for _, req := range []*http.Request{
		mustRequest(t, http.MethodPost, r.gw.url()+"/embeddings", `{"model":"`+model+`","input":"x"}`),
		mustRequest(t, http.MethodPost, r.gw.url()+"/files", `not json at all`),
		mustRequest(t, http.MethodGet, r.gw.url()+"/models", ``),
		mustRequest(t, http.MethodGet, r.gw.url()+"/chat/completions", ``),
	} {
		res, err := r.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	if n := len(r.gw.seen()); n != 4 {
		t.Fatalf("gateway saw %d, want 4", n)
	}
	r.expectCounts(1, 0)
}

func TestDefaultLane(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"https://gw/v1/chat/completions", "https://gw/v1|m"},
		{"https://key:secret@GW.example:8443/openai/v1/chat/completions/?x=1", "https://gw.example:8443/openai/v1|m"},
		{"http://127.0.0.1:4000/v1/completions", "http://127.0.0.1:4000/v1|m"},
		{"https://api.anthropic.com/v1/messages", "https://api.anthropic.com/v1|m"},
		{"https://gw/responses", "https://gw|m"},
	} {
		req := mustRequest(t, http.MethodPost, tc.url, "")
		if !lanehttp.IsModelCall(req) {
			t.Fatalf("%s: not a model call", tc.url)
		}
		if got := lanehttp.DefaultLane(req, "m"); got != tc.want {
			t.Fatalf("%s: lane %q, want %q", tc.url, got, tc.want)
		}
	}
	for _, u := range []string{"https://gw/v1/embeddings", "https://gw/v1/messages/count_tokens", "https://gw/v1/images/generations"} {
		if lanehttp.IsModelCall(mustRequest(t, http.MethodPost, u, "")) {
			t.Fatalf("%s: counted as a model call", u)
		}
	}
}

func TestCustomLaneFunction(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.Lane = func(_ *http.Request, m string) string { return "anthropic-oauth|" + m }
	res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if l := r.lim.Snapshot().Lanes; len(l) != 1 || l[0].Lane != "anthropic-oauth|"+model {
		t.Fatalf("lanes %+v", l)
	}
}

// 9. No slot leaks after 1,000 calls with random cancellations mid-stream.
func TestNoLeakUnderRandomCancellation(t *testing.T) {
	r := newRig(t, on(8))
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		r.gw.streamChunks(w, s.Model, []string{"a", "b", "c", "d", "e"}, nil, req.Context())
		return true
	}
	c := r.client()
	rng := rand.New(rand.NewPCG(7, 8))
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended := map[string]int{}
	sem := make(chan struct{}, 200)
	for i := 0; i < 1000; i++ {
		mode, after := rng.IntN(3), rng.IntN(4)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithCancel(callCtx("x", limiter.Priority(i%3-1)))
			defer cancel()
			s := c.Chat.Completions.NewStreaming(ctx, params())
			n := 0
			for s.Next() {
				if n++; mode > 0 && n > after {
					if mode == 1 {
						cancel()
					} else {
						break
					}
				}
			}
			s.Close()
			mu.Lock()
			ended[[]string{"read", "canceled", "closed"}[mode]]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.expectCounts(0, 0)
	if ended["canceled"] == 0 || ended["closed"] == 0 {
		t.Fatalf("the run exercised %v", ended)
	}
	u := r.snapshot().Upstream
	if u == nil || u.OK+u.Canceled != 1000 || u.TransportErrors != 0 {
		t.Fatalf("upstream %+v, want 1000 exchanges ended ok or canceled", u)
	}
}

func chatRequest(t *testing.T, base, body string) *http.Request {
	return mustRequest(t, http.MethodPost, base+"/chat/completions", body)
}

func mustRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-secret")
	return req
}

// recv waits for a call to end; a call that never ends (queued again by a
// retry, say) fails the test instead of hanging it.
func recv(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call never ended")
		return nil
	}
}
