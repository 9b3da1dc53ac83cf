package lanehttp_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

func errorBody(t *testing.T, res *http.Response) lanehttp.ErrorDetail {
	t.Helper()
	defer res.Body.Close()
	var eb lanehttp.ErrorBody
	if err := json.NewDecoder(res.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	return eb.Error
}

// A call whose lane would exceed MaxLanes, and calls refused by a limiter
// that is shutting down, get clear answers that never reach the gateway;
// Describe names the lane in them instead of the gateway's address.
func TestRefusalAnswers(t *testing.T) {
	cfg := on(1)
	cfg.MaxLanes = 1
	r := newRig(t, cfg)
	r.tr.Describe = func(lane string) string {
		_, m := limiter.SplitLaneKey(lane)
		return "gw|" + m
	}
	post := func(model string) *http.Response {
		t.Helper()
		res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := post(model)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()

	res = post("another/model")
	if res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("lane limit: %d, x-should-retry %q", res.StatusCode, res.Header.Get("X-Should-Retry"))
	}
	d := errorBody(t, res)
	if d.Code != lanehttp.LaneLimitCode || d.Lane != "gw|another/model" || strings.Contains(d.Message, "127.0.0.1") ||
		!strings.Contains(d.Message, "max_lanes") {
		t.Fatalf("lane limit body %+v", d)
	}

	held := r.hold()
	done := make(chan *http.Response, 1)
	go func() {
		req := chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`).WithContext(callCtx("queued", limiter.Default))
		res, err := r.hc.Do(req)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	r.waitEnqueued("queued")
	r.lim.Shutdown()
	res = <-done
	if res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "" || !res.Close {
		t.Fatalf("shutting down: %d, x-should-retry %q, close %v", res.StatusCode, res.Header.Get("X-Should-Retry"), res.Close)
	}
	if d := errorBody(t, res); d.Code != lanehttp.ShuttingDownCode || strings.Contains(d.Message, "127.0.0.1") {
		t.Fatalf("shutting down body %+v", d)
	}
	held.Release()
	if n := len(r.gw.seen()); n != 1 {
		t.Fatalf("the gateway saw %d calls, want only the first", n)
	}

	// With ReturnErrors, the typed errors.
	r.tr2(t, func(tr *lanehttp.Transport) {
		_, err := (&http.Client{Transport: tr}).Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`"}`))
		if !errors.Is(err, limiter.ErrShuttingDown) {
			t.Fatalf("ReturnErrors: %v", err)
		}
	})
}

// tr2 runs f with a second transport on the rig's limiter that returns
// typed errors.
func (r *rig) tr2(t *testing.T, f func(*lanehttp.Transport)) {
	tr := &lanehttp.Transport{Limiter: r.lim, ReturnErrors: true, Base: &http.Transport{}}
	defer tr.Base.(*http.Transport).CloseIdleConnections()
	f(tr)
}

// A body that declares 32 MiB and sends a few bytes costs a few bytes, not
// the declared length.
func TestDeclaredLengthNotAllocated(t *testing.T) {
	r := newRig(t, on(1))
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"model":"m"`))
		pw.CloseWithError(io.ErrUnexpectedEOF) // the client stops one byte short, say
	}()
	req := chatRequest(t, r.gw.url(), "")
	req.Body, req.ContentLength = pr, 32<<20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := r.tr.RoundTrip(req)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a truncated body was sent")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading a truncated body allocated %d bytes: the declared length, not what arrived", grew)
	}
	if len(r.gw.seen()) != 0 {
		t.Fatal("the gateway saw it")
	}
}
