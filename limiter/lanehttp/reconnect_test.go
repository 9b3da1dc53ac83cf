package lanehttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// reconnectRig is a lane of one slot on a fake clock, a gateway whose
// first streams break as the test says, and a Reconnect on the same clock.
type reconnectRig struct {
	t        *testing.T
	clock    *limitertest.Clock
	lim      *limiter.Limiter
	gw       *gateway
	hc       *http.Client
	arrivals chan time.Time // of every acquisition
	opens    atomic.Int32
	rc       *lanehttp.Reconnect
}

func newReconnectRig(t *testing.T, breaks func(n int32) string) *reconnectRig {
	r := &reconnectRig{t: t, clock: limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)), arrivals: make(chan time.Time, 16)}
	lim, err := limiter.New(limiter.Config{MaxInflight: 1, QueueTimeout: 30 * time.Second}, limiter.WithClock(r.clock),
		limiter.WithObserver(func(ctx context.Context, e limiter.Event) {
			if e.Kind == limiter.Acquired {
				a, _ := limiter.ArrivalFrom(ctx)
				r.arrivals <- a
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	r.lim = lim
	r.gw = newGateway(t)
	var n atomic.Int32
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		switch breaks(n.Add(1)) {
		case "before content": // headers, then the connection drops
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "after content": // one chunk, then the connection drops
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		return false
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	r.hc = &http.Client{Transport: &lanehttp.Transport{Limiter: lim, Base: base}}
	r.rc = &lanehttp.Reconnect{Clock: r.clock, Backoff: 2 * time.Second}
	return r
}

func (r *reconnectRig) open(ctx context.Context) (*http.Response, error) {
	r.opens.Add(1)
	req := chatRequest(r.t, r.gw.url(), `{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	return r.hc.Do(req.WithContext(ctx))
}

func (r *reconnectRig) inflight() int {
	for _, l := range r.lim.Snapshot().Lanes {
		return l.Inflight
	}
	return 0
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// A stream that drops before its first chunk is reopened: the slot is free
// during the backoff, and the new attempt queues with the first arrival.
func TestReconnectBeforeContent(t *testing.T) {
	r := newReconnectRig(t, func(n int32) string {
		if n == 1 {
			return "before content"
		}
		return ""
	})
	t0 := r.clock.Now()
	res, err := r.rc.Do(context.Background(), r.open)
	if err != nil {
		t.Fatal(err)
	}
	pending := r.clock.Pending()
	text := make(chan string, 1)
	go func() {
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			b = []byte("error: " + err.Error())
		}
		text <- string(b)
	}()
	// The first attempt broke: its slot is back before the backoff ends.
	eventually(t, "the backoff starts", func() bool { return r.inflight() == 0 && r.clock.Pending() > pending })
	other, err := r.lim.Acquire(context.Background(), r.gw.url()+"|"+model)
	if err != nil {
		t.Fatalf("the slot is not free during the backoff: %v", err)
	}
	<-r.arrivals // the first attempt's
	<-r.arrivals // other's
	other.Release()
	r.clock.Advance(10 * time.Second) // the backoff ends; the call has aged
	if got := <-text; !strings.Contains(got, "Hello") || !strings.Contains(got, "[DONE]") {
		t.Fatalf("stream after the reconnect: %q", got)
	}
	if a := <-r.arrivals; !a.Equal(t0) {
		t.Fatalf("the reconnect acquired with arrival %v, want the first attempt's %v", a, t0)
	}
	if n := r.opens.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	if r.inflight() != 0 {
		t.Fatal("a slot is still held")
	}
}

// A queue timeout is never retried: it comes back as the typed error after
// one attempt.
func TestReconnectNeverRetriesQueueTimeout(t *testing.T) {
	r := newReconnectRig(t, func(int32) string { return "" })
	held, _ := r.lim.Acquire(context.Background(), r.gw.url()+"|"+model)
	<-r.arrivals
	defer held.Release()
	done := make(chan error, 1)
	go func() {
		res, err := r.rc.Do(context.Background(), r.open)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	eventually(t, "the call queues", func() bool { return r.lim.Snapshot().Lanes[0].Queued == 1 })
	r.clock.Advance(30 * time.Second)
	err := recv(t, done)
	var qe *limiter.QueueTimeoutError
	if !errors.As(err, &qe) || !errors.Is(err, limiter.ErrQueueTimeout) {
		t.Fatalf("err %v, want the queue timeout", err)
	}
	r.clock.Advance(time.Minute) // no backoff timer would reopen it
	if n := r.opens.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

// Attempts are bounded, and a stream that has delivered content is never
// reopened.
func TestReconnectBounds(t *testing.T) {
	r := newReconnectRig(t, func(int32) string { return "before content" })
	r.rc.Backoff = time.Nanosecond
	res, err := r.rc.Do(context.Background(), r.open)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(res.Body)
		res.Body.Close()
		done <- err
	}()
	// Move the clock on until the reader gives up, however many backoffs
	// that takes: the bound is what is checked.
	var rerr error
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.clock.Advance(time.Second)
		select {
		case rerr = <-done:
		case <-time.After(5 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the reader never gave up")
			}
			continue
		}
		break
	}
	if err := rerr; err == nil || !strings.Contains(err.Error(), "attempt 3 of 3") {
		t.Fatalf("err %v, want the third attempt's failure", err)
	}
	if n := r.opens.Load(); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}

	r2 := newReconnectRig(t, func(int32) string { return "after content" })
	res, err = r2.rc.Do(context.Background(), r2.open)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err == nil || !strings.Contains(string(b), "Hel") {
		t.Fatalf("read %q, %v: want the first chunk, then the break", b, err)
	}
	if n := r2.opens.Load(); n != 1 {
		t.Fatalf("%d attempts after content, want 1", n)
	}
}
