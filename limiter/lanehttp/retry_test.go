package lanehttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// ask returns chat parameters with a prompt of its own: different calls
// have different bodies.
func ask(prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

// An openai-go retry after a 5xx queues with the arrival of the call's
// first attempt, with no code in the caller: behind a call that arrived
// earlier, ahead of one that arrived after the first attempt. A request
// with a forged retry header, for a call never seen, gains nothing.
//
//	t=0   a holder takes the only slot; E (bulk) queues
//	t=30  F (default) queues; the holder leaves; F outranks E by class
//	t=35  L (default) queues
//	t=60  F's first attempt fails with 502; E has aged to default and,
//	      having arrived first, takes the slot; F's retry queues, with
//	      arrival 30; then X (default) queues with a forged retry header
//	then  E ends: F (arrival 30) goes before L (35), X (60) last
func TestOpenAIRetryKeepsItsPlace(t *testing.T) {
	r := newRig(t, on(1))
	answerF, answerE := make(chan struct{}), make(chan struct{})
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		var wait chan struct{}
		switch {
		case s.ID == "F" && s.Retry == "0":
			wait = answerF
		case s.ID == "E":
			wait = answerE
		default:
			return false
		}
		select {
		case <-wait:
		case <-r.gw.done:
			return true
		}
		if s.ID == "F" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"message":"upstream down","type":"server_error","code":null,"param":null}}`)
			return true
		}
		return false
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	call := func(id string, p limiter.Priority, retries int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.client(option.WithMaxRetries(retries))
			_, err := c.Chat.Completions.New(callCtx(id, p), ask("prompt of "+id), option.WithHeader("X-Test-Call", id))
			if err != nil {
				errs <- err
			}
		}()
	}
	held := r.hold()
	call("E", limiter.Bulk, 0)
	r.waitEnqueued("E")
	r.clock.Advance(30 * time.Second)
	call("F", limiter.Default, 2)
	r.waitEnqueued("F")
	held.Release()
	waitAcquired(t, r, "F")
	r.clock.Advance(5 * time.Second)
	call("L", limiter.Default, 0)
	r.waitEnqueued("L")
	r.clock.Advance(25 * time.Second)
	close(answerF) // F's first attempt fails; the slot goes to E, aged
	waitAcquired(t, r, "E")
	r.waitEnqueued("F") // the retry, after openai-go's backoff
	// A request that says it is a retry, for a call never seen.
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := chatRequest(t, r.gw.url(), `{"model":"`+model+`","messages":[{"role":"user","content":"prompt of X"}]}`)
		req = req.WithContext(callCtx("X", limiter.Default))
		req.Header.Set("X-Stainless-Retry-Count", "2")
		req.Header.Set("X-Test-Call", "X")
		res, err := r.hc.Do(req)
		if err != nil {
			errs <- err
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}()
	r.waitEnqueued("X")
	close(answerE)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := strings.Join(r.gw.ids(), ","); got != "F,E,F,L,X" {
		t.Fatalf("gateway order %s, want F,E,F,L,X: the retry ahead of L, the forged retry last", got)
	}
	if u := r.snapshot().Upstream; u == nil || u.Retries != 1 || u.ServerErrors != 1 {
		// F's retry, recognised. X's header is only the client's claim: it
		// neither moves X up nor counts as a retry (a forged one on fresh
		// calls would make the lane read gateway_degraded).
		t.Fatalf("upstream %+v, want 1 retry and 1 server error", u)
	}
}

func waitAcquired(t *testing.T, r *rig, id string) {
	t.Helper()
	select {
	case got := <-r.acquired:
		if got != id {
			t.Fatalf("acquired %q, want %q", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never acquired", id)
	}
}

// A client that resends a request with no retry header (curl, a script)
// is recognised too: the resend acquires with the first attempt's arrival.
// A different caller (other credentials) sending the same body is a call
// of its own.
func TestResendRecognisedWithoutHeaders(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	arrivals := make(chan time.Time, 8)
	lim, err := limiter.New(on(2), limiter.WithClock(clock), limiter.WithObserver(func(ctx context.Context, e limiter.Event) {
		if e.Kind == limiter.Acquired {
			a, _ := limiter.ArrivalFrom(ctx)
			arrivals <- a
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	g := newGateway(t)
	var n atomic.Int32
	g.handle = func(w http.ResponseWriter, _ *http.Request, _ seen) bool {
		if n.Add(1) == 1 { // the first attempt fails
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	hc := &http.Client{Transport: &lanehttp.Transport{Limiter: lim, Base: base}}
	send := func(key string) int {
		req := chatRequest(t, g.url(), `{"model":"`+model+`","messages":[{"role":"user","content":"same"}]}`)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	t0 := clock.Now()
	if code := send("sk-a"); code != 503 {
		t.Fatalf("first attempt %d", code)
	}
	clock.Advance(20 * time.Second) // within the retry window (30 s)
	if code := send("sk-a"); code != 200 {
		t.Fatalf("resend %d", code)
	}
	clock.Advance(time.Second)
	if code := send("sk-b"); code != 200 {
		t.Fatalf("other caller %d", code)
	}
	got := []time.Time{<-arrivals, <-arrivals, <-arrivals}
	if !got[0].Equal(t0) || !got[1].Equal(t0) || !got[2].Equal(t0.Add(21*time.Second)) {
		t.Fatalf("arrivals %v, want the first attempt's twice, then the other caller's own", got)
	}
}

// The pre-registration attack: a bulk call sent and canceled while it
// queued, again and again within the retry window, then sent for real, gets no better place than a
// fresh call: its arrival is its own, and a bulk call sent just before it
// goes first. (A genuine SDK retry after a 5xx keeps its place:
// TestOpenAIRetryKeepsItsPlace.)
func TestCanceledWhileQueuedLeavesNoPlace(t *testing.T) {
	for _, marked := range []bool{false, true} {
		t.Run(fmt.Sprint("retry-header-", marked), func(t *testing.T) { canceledWhileQueued(t, marked) })
	}
}

// canceledWhileQueued is the attack, each resend marked as an SDK's retry
// (X-Stainless-Retry-Count) or not: the attempts gave up without waiting,
// so the header gains nothing either.
func canceledWhileQueued(t *testing.T, marked bool) {
	r := newRig(t, on(1))
	held := r.hold()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"the attacker's"}]}`
	try := func(id string, cancelQueued bool) chan error {
		ctx, cancel := context.WithCancel(callCtx(id, limiter.Bulk))
		req := chatRequest(t, r.gw.url(), body).WithContext(ctx)
		req.Header.Set("Authorization", "Bearer sk-attacker")
		req.Header.Set("X-Test-Call", id)
		if marked && id != "pre0" {
			req.Header.Set("X-Stainless-Retry-Count", "1")
		}
		done := r.sendAsync(req)
		r.waitEnqueued(id)
		if cancelQueued {
			cancel()
			<-done
		} else {
			t.Cleanup(cancel)
		}
		return done
	}
	for i := range 3 { // every 20 s: inside the retry window
		try("pre"+strconv.Itoa(i), true)
		r.clock.Advance(20 * time.Second)
	}
	req := chatRequest(t, r.gw.url(), `{"model":"`+model+`","messages":[{"role":"user","content":"control"}]}`).WithContext(callCtx("control", limiter.Bulk))
	req.Header.Set("X-Test-Call", "control")
	control := r.sendAsync(req)
	r.waitEnqueued("control")
	real := try("real", false)
	held.Release()
	for _, c := range []chan error{control, real} {
		if err := recv(t, c); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(r.gw.ids(), ","); got != "control,real" {
		t.Fatalf("gateway order %s, want control,real: the canceled attempts left the attacker no place", got)
	}
}

// A client whose timeout counts the wait gives up after 10 s in the queue
// and its SDK resends the call, marked as a retry, a second later: it
// keeps the 10 s it waited, ahead of a call that arrived 5 s after its
// first attempt, and the lane counts no retry. Without the mark it goes
// behind.
func TestGaveUpInQueueRetryKeepsItsWait(t *testing.T) {
	for _, marked := range []bool{true, false} {
		t.Run(fmt.Sprint("marked-", marked), func(t *testing.T) {
			r := newRig(t, on(1))
			held := r.hold()
			send := func(ctx context.Context, id, prompt string, retry int) chan error {
				req := chatRequest(t, r.gw.url(), `{"model":"`+model+`","messages":[{"role":"user","content":"`+prompt+`"}]}`).WithContext(ctx)
				req.Header.Set("X-Test-Call", id)
				req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(retry))
				done := r.sendAsync(req)
				r.waitEnqueued(id)
				return done
			}
			ctx, cancel := context.WithCancel(callCtx("first", limiter.Default))
			first := send(ctx, "first", "the patient one's", 0)
			r.clock.Advance(5 * time.Second)
			other := send(callCtx("other", limiter.Default), "other", "another", 0)
			r.clock.Advance(5 * time.Second)
			cancel() // the client's timeout, 10 s after it sent
			<-first
			r.clock.Advance(time.Second)
			n := 0
			if marked {
				n = 1
			}
			again := send(callCtx("again", limiter.Default), "again", "the patient one's", n)
			held.Release()
			for _, c := range []chan error{other, again} {
				if err := recv(t, c); err != nil {
					t.Fatal(err)
				}
			}
			want := "again,other"
			if !marked {
				want = "other,again"
			}
			if got := strings.Join(r.gw.ids(), ","); got != want {
				t.Fatalf("gateway order %s, want %s", got, want)
			}
			if u := r.lim.Snapshot().Lanes[0].Upstream; u == nil || u.Retries != 0 {
				t.Fatalf("upstream counts %+v, want no retry counted", u)
			}
		})
	}
}
