package lanehttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// post sends a chat completion through the rig's transport as id, and
// returns its answer's Server-Timing values and status.
func (r *rig) post(id string) ([]string, int) {
	r.t.Helper()
	req, _ := http.NewRequestWithContext(callCtx(id, limiter.Default), http.MethodPost, r.gw.url()+"/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	res, err := r.hc.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	res.Body.Close()
	return res.Header.Values("Server-Timing"), res.StatusCode
}

// With ServerTiming, an answer says where its time went, before the
// upstream's own Server-Timing: the wait for a slot (its lane's name in
// desc), and the time to the upstream's headers. A call granted at once
// waited 0 ms; one queued for 3 s of the fake clock, 3,000 ms; a queue
// timeout's answer has its wait and no upstream. Off (the zero value), the
// upstream's header passes alone.
func TestServerTiming(t *testing.T) {
	cfg := on(1)
	cfg.QueueTimeout = 5 * time.Second
	r := newRig(t, cfg)
	r.tr.ServerTiming = true
	r.tr.Describe = func(lane string) string { return `gw|"` + model + `"` }
	r.answer(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Server-Timing", "cache;desc=miss")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"m","choices":[]}`)
	})
	desc := `desc="gw|\"` + model + `\""`
	want := func(what string, got []string, w ...string) {
		t.Helper()
		if strings.Join(got, " / ") != strings.Join(w, " / ") {
			t.Fatalf("%s: Server-Timing %q, want %q", what, got, w)
		}
	}
	st, _ := r.post("a")
	want("granted at once", st, "lane;dur=0;"+desc+", upstream;dur=0", "cache;desc=miss")

	s := r.hold()
	done := make(chan []string)
	go func() { st, _ := r.post("b"); done <- st }()
	r.waitEnqueued("b")
	r.clock.Advance(3 * time.Second)
	s.Release()
	want("queued for 3 s", <-done, "lane;dur=3000;"+desc+", upstream;dur=0", "cache;desc=miss")

	s = r.hold()
	gone := make(chan int)
	var timedOut []string
	go func() {
		var code int
		timedOut, code = r.post("c")
		gone <- code
	}()
	r.waitEnqueued("c")
	r.clock.Advance(5 * time.Second)
	if code := <-gone; code != http.StatusServiceUnavailable {
		t.Fatalf("the queue timeout answered %d, want 503", code)
	}
	want("queue timeout", timedOut, "lane;dur=5000;"+desc)
	s.Release()

	r.tr.ServerTiming = false
	st, _ = r.post("d")
	want("off", st, "cache;desc=miss")
}
