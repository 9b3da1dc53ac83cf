package lanehttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// backend is an upstream that does not stop a call's work when its client
// goes (as LiteLLM does not): every call runs its whole length, and the
// backend counts the calls at work at once.
type backend struct {
	srv        *httptest.Server
	work       chan struct{} // each receive lets one call's work end
	active     atomic.Int32
	peak       atomic.Int32
	ended      atomic.Int32
	whole      time.Duration // with work nil: each call's length
	streamed   bool
	chunks     int
	firstChunk chan struct{} // each call's first chunk, written (if not nil)
}

func newBackend(t *testing.T, whole time.Duration, streamed bool) *backend {
	b := &backend{whole: whole, streamed: streamed, chunks: 4}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := b.active.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	defer func() { b.active.Add(-1); b.ended.Add(1) }()
	step := func() {
		if b.work != nil {
			<-b.work
			return
		}
		time.Sleep(b.whole / time.Duration(b.chunks))
	}
	if !b.streamed {
		for range b.chunks {
			step()
		}
		writeCompletion(w, model, "done")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	for i := range b.chunks {
		step()
		// Written whether or not the client is still there: the work goes on.
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n", model)
		f.Flush()
		if i == 0 && b.firstChunk != nil {
			b.firstChunk <- struct{}{}
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	f.Flush()
}

func (b *backend) url() string { return b.srv.URL + "/v1" }

// newAbandonRig is a rig whose Transport does not take the upstream to stop
// the work when its client goes (the default), in front of b.
func newAbandonRig(t *testing.T, n int, b *backend) *rig {
	r := newRig(t, on(n))
	r.tr.CancelPropagates = false
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, _ seen) bool {
		b.serve(w, req)
		return true
	}
	if b.work != nil {
		t.Cleanup(func() { close(b.work) }) // before the gateway closes: no handler left waiting
	}
	return r
}

func (r *rig) waitCounts(t *testing.T, inflight, abandoned int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := r.snapshot()
		if l.Inflight == inflight && l.Abandoned == abandoned {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lane: inflight %d abandoned %d, want %d and %d", l.Inflight, l.Abandoned, inflight, abandoned)
		}
		time.Sleep(time.Millisecond)
	}
}

// A caller that gives up before the answer's headers gets its error at
// once, but the call is still at work at the upstream: its slot stays
// held, shown as abandoned, until the upstream's answer has ended, and
// the next call waits for it.
func TestCallerGoneBeforeHeadersKeepsSlotUntilUpstreamEnds(t *testing.T) {
	b := newBackend(t, 0, false)
	b.work = make(chan struct{})
	r := newAbandonRig(t, 1, b)
	ctx, cancel := context.WithCancel(callCtx("a", limiter.Default))
	res := make(chan error, 1)
	go func() {
		_, err := r.client().Chat.Completions.New(ctx, params())
		res <- err
	}()
	for b.active.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := recv(t, res); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller: %v, want its own cancellation at once", err)
	}
	r.waitCounts(t, 1, 1)

	second := make(chan error, 1)
	go func() {
		_, err := r.client().Chat.Completions.New(callCtx("b", limiter.Default), params())
		second <- err
	}()
	r.waitEnqueued("b") // the slot stands for the work still running
	for range b.chunks {
		b.work <- struct{}{}
	}
	// a's answer ends at the upstream: b is granted and served.
	for range b.chunks {
		b.work <- struct{}{}
	}
	if err := recv(t, second); err != nil {
		t.Fatal(err)
	}
	if p := b.peak.Load(); p != 1 {
		t.Fatalf("the upstream had %d calls at work at once, want 1 (the lane's limit)", p)
	}
	r.waitCounts(t, 0, 0)
	if u := r.snapshot().Upstream; u == nil || u.Canceled != 1 || u.OK != 1 {
		t.Fatalf("upstream %+v, want one canceled (a's caller left) and one ok", u)
	}
}

// A caller that closes a stream midway leaves the rest to the transport:
// read and discarded (its usage still settles), the slot held until then.
// With CancelPropagates the slot is given back at once.
func TestStreamClosedMidwayIsDrained(t *testing.T) {
	for _, propagates := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel_propagates=%v", propagates), func(t *testing.T) {
			b := newBackend(t, 0, true)
			b.work = make(chan struct{})
			b.firstChunk = make(chan struct{}, 1)
			r := newAbandonRig(t, 1, b)
			r.tr.CancelPropagates = propagates
			go func() { b.work <- struct{}{} }()
			s := r.client().Chat.Completions.NewStreaming(callCtx("a", limiter.Default), params())
			if !s.Next() {
				t.Fatal(s.Err())
			}
			s.Close()
			if propagates {
				r.expectCounts(0, 0)
				return
			}
			r.waitCounts(t, 1, 1)
			for range b.chunks - 1 {
				b.work <- struct{}{}
			}
			r.waitCounts(t, 0, 0)
			if u := r.snapshot().Upstream; u == nil || u.Canceled != 1 {
				t.Fatalf("upstream %+v, want the call counted as canceled by its caller", u)
			}
		})
	}
}

// An abandoned answer whose upstream then goes quiet holds its slot no
// longer than the stall timeout.
func TestDrainBoundedByStallTimeout(t *testing.T) {
	b := newBackend(t, 0, true)
	b.work = make(chan struct{})
	r := newAbandonRig(t, 1, b)
	r.tr.StallTimeout = 5 * time.Second
	go func() { b.work <- struct{}{} }()
	s := r.client().Chat.Completions.NewStreaming(callCtx("a", limiter.Default), params())
	if !s.Next() {
		t.Fatal(s.Err())
	}
	s.Close()
	r.waitCounts(t, 1, 1)
	waitInRead(t) // the drain waits for the next chunk
	r.clock.Advance(5 * time.Second)
	r.waitCounts(t, 0, 0)
}

// Whatever the moment callers give up (queued, before the headers, in the
// body, or never), the upstream never has more calls at work at once than
// the lane's limit, whole answers and streams alike: a randomized test on
// real time (the invariant holds at every moment, so the schedule only
// changes which moments are tried).
func TestUpstreamNeverOverLimitWhenCallersAbandon(t *testing.T) {
	for _, streamed := range []bool{false, true} {
		t.Run(fmt.Sprintf("streamed=%v", streamed), func(t *testing.T) {
			const limit, calls = 3, 40
			b := newBackend(t, 40*time.Millisecond, streamed)
			lim, err := limiter.New(on(limit))
			if err != nil {
				t.Fatal(err)
			}
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			hc := &http.Client{Transport: &lanehttp.Transport{Limiter: lim, Base: base}}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			var wg sync.WaitGroup
			for i := range calls {
				giveUp := time.Duration(rng.IntN(120)) * time.Millisecond // 0..120 ms: queued, at the headers, in the body, or never
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), giveUp+time.Millisecond)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url()+"/chat/completions",
						strings.NewReader(fmt.Sprintf(`{"model":%q,"stream":%v,"n":%d}`, model, streamed, i)))
					req.Header.Set("Content-Type", "application/json")
					res, err := hc.Do(req)
					if err != nil {
						return
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}()
			}
			wg.Wait()
			deadline := time.Now().Add(10 * time.Second)
			for b.active.Load() > 0 || lim.Snapshot().Lanes[0].Inflight > 0 {
				if time.Now().After(deadline) {
					t.Fatal("calls still at work 10 s after the last caller left")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if p := b.peak.Load(); p > limit {
				t.Fatalf("the upstream had %d calls at work at once, want at most %d (the lane's limit)", p, limit)
			}
			if b.ended.Load() == 0 {
				t.Fatal("no call reached the upstream")
			}
		})
	}
}

// An abandoned answer that never ends (a stream that goes on and on, so
// that no stall guard ends it) holds its slot at most ResponseHeaderTimeout
// plus StallTimeout from the send.
func TestEndlessDrainBounded(t *testing.T) {
	r := newRig(t, on(1))
	r.tr.CancelPropagates = false
	r.tr.ResponseHeaderTimeout = 10 * time.Second // no stall guard: the bound alone ends it
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, _ seen) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		for req.Context().Err() == nil && !isClosed(r.gw.done) {
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
		return true
	}
	s := r.client().Chat.Completions.NewStreaming(callCtx("a", limiter.Default), params())
	if !s.Next() {
		t.Fatal(s.Err())
	}
	s.Close()
	r.waitCounts(t, 1, 1)
	r.clock.Advance(9 * time.Second)
	time.Sleep(20 * time.Millisecond) // nothing is due before 10 s: the drain goes on
	r.waitCounts(t, 1, 1)
	r.clock.Advance(time.Second)
	r.waitCounts(t, 0, 0)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
