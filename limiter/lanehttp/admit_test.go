package lanehttp_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

const chatBody = `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`

// A call admitted ahead of its round trip waits for its slot in Admit, and
// its round trip (of the request Admit returned, or of one made from it, as
// a reverse proxy makes) then sends it with that slot, queuing no more.
func TestAdmitThenRoundTrip(t *testing.T) {
	r := newRig(t, on(1))
	held := r.hold()
	admitted := make(chan *http.Request, 1)
	go func() {
		req := chatRequest(t, r.gw.url(), chatBody)
		admitted <- r.tr.Admit(req.WithContext(context.WithValue(req.Context(), callKey{}, "admitted")))
	}()
	r.waitEnqueued("admitted")
	select {
	case <-admitted:
		t.Fatal("Admit returned while the lane's only slot was held")
	case <-time.After(50 * time.Millisecond):
	}
	held.Release()
	var req *http.Request
	select {
	case req = <-admitted:
	case <-time.After(10 * time.Second):
		t.Fatal("Admit never returned")
	}
	defer lanehttp.Abandon(req)
	r.expectCounts(1, 0) // the slot is the admitted call's
	// Bounded: a round trip that queued again would wait for ever.
	ctx, cancel := context.WithTimeout(req.Context(), 10*time.Second)
	defer cancel()
	res, err := r.tr.RoundTrip(req.Clone(ctx))
	if err != nil {
		t.Fatal(err)
	}
	r.expectCounts(1, 0) // the same slot, held by the answer's body
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	r.expectCounts(0, 0)
	if ids := len(r.gw.ids()); ids != 1 {
		t.Fatalf("the gateway saw %d calls", ids)
	}
	select {
	case id := <-r.enqueued:
		t.Fatalf("%q queued again in the round trip", id)
	default:
	}
}

// Abandon gives the slot back when no round trip took it, once; after a
// round trip it leaves the call's slot alone.
func TestAbandon(t *testing.T) {
	r := newRig(t, on(1))
	req := r.tr.Admit(chatRequest(t, r.gw.url(), chatBody))
	r.expectCounts(1, 0)
	lanehttp.Abandon(req)
	r.expectCounts(0, 0)
	lanehttp.Abandon(req) // twice: nothing more
	r.expectCounts(0, 0)

	req = r.tr.Admit(chatRequest(t, r.gw.url(), chatBody))
	res, err := r.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	lanehttp.Abandon(req)
	r.expectCounts(1, 0) // the exchange still holds it
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	r.expectCounts(0, 0)

	// A request that was never admitted: nothing happens.
	lanehttp.Abandon(chatRequest(t, r.gw.url(), chatBody))
	r.expectCounts(0, 0)
}

// A call refused in Admit gets, from its round trip, the answer RoundTrip
// would have given it, and the gateway never sees it.
func TestAdmitRefused(t *testing.T) {
	r := newRig(t, on(1))
	held := r.hold()
	done := make(chan *http.Request, 1)
	go func() {
		req := chatRequest(t, r.gw.url(), chatBody)
		done <- r.tr.Admit(req.WithContext(context.WithValue(req.Context(), callKey{}, "late")))
	}()
	r.waitEnqueued("late")
	r.clock.Advance(limiter.DefaultQueueTimeout)
	var req *http.Request
	select {
	case req = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Admit never returned")
	}
	lanehttp.Abandon(req) // nothing to give back
	r.expectCounts(1, 0)
	res, err := r.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d, x-should-retry %q: want the queue timeout's 503", res.StatusCode, res.Header.Get("X-Should-Retry"))
	}
	if ids := r.gw.ids(); len(ids) != 0 {
		t.Fatalf("the gateway saw %v", ids)
	}
	held.Release()
	r.expectCounts(0, 0)
}

// Requests Admit does not take pass as they are: not model calls, or a
// limiter that is off.
func TestAdmitPassesOthers(t *testing.T) {
	r := newRig(t, on(1))
	get := mustRequest(t, http.MethodGet, r.gw.url()+"/models", "")
	if got := r.tr.Admit(get); got != get {
		t.Error("a GET was not returned as it was")
	}
	off := newRig(t, on(0))
	chat := chatRequest(t, off.gw.url(), chatBody)
	if got := off.tr.Admit(chat); got != chat {
		t.Error("a model call with the limiter off was not returned as it was")
	}
	r.expectCounts(0, 0)
}
