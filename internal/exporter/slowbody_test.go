package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sync/semaphore"
	"pgregory.net/rapid"
)

// stacks is the memory goroutine stacks take.
func stacks() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// The slow-body flood: 2,000 HTTP/2 streams (8 connections of 250, the
// most Go's server takes on one) and 200 HTTP/1.1 connections, each
// sending one byte of its body and never the rest. While they trickle, an
// honest call (HTTP/1.1, and a stream of an HTTP/2 connection of its own)
// still goes through; each slow body costs its goroutine and a bounded few
// KiB; after proxy.body_min_rate_grace (5 s), not before, every one is
// cut (408) and gives back what it held.
//
// The defaults, but for limits.max_queued_bytes: 32 MiB, an eighth of the
// default (and proxy.max_body_bytes just under 16 MiB, the most such a
// budget admits: TestConfigErrors), so that the flood is one that took the whole budget when each
// reader reserved 32 KiB ahead (2,200 × 32 KiB is 69 MiB; at the default
// it takes 8,192 attackers, past the race detector's goroutine limit).
func TestSlowBodyFlood(t *testing.T) {
	const h2Conns, streams, h1Conns = 8, 250, 200
	const slow = h2Conns*streams + h1Conns
	const budget = 32 << 20
	h := newHostile(t, fmt.Sprintf("limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\nlimits: {max_queued_bytes: %d}\nproxy: {max_body_bytes: %d}\n", budget, (budget-64<<10)/2), Options{})
	path := "/proxy/gw/chat/completions"
	baseG, baseHeap, baseStacks := runtime.NumGoroutine(), heap(), stacks()
	start := time.Now()
	var flood []*h2Client
	for range h2Conns {
		c := dialH2(t, h.l.Addr)
		for range streams {
			c.post(path, []byte("{"), false)
		}
		flood = append(flood, c)
	}
	var conns []net.Conn
	for range h1Conns {
		c, err := net.Dial("tcp", h.l.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", path)
		conns = append(conns, c)
	}
	waitHandlers(t, "every slow body being read", func(n int) bool { return n >= slow }, 30*time.Second)
	g, mem, st := runtime.NumGoroutine()-baseG, int64(heap())-int64(baseHeap), int64(stacks())-int64(baseStacks)
	t.Logf("%d slow bodies: +%d goroutines, heap +%.1f MiB, stacks +%.1f MiB: %.1f KiB each in all",
		slow, g, float64(mem)/(1<<20), float64(st)/(1<<20), float64(mem+st)/slow/1024)

	// An honest client, on HTTP/1.1 and on HTTP/2.
	if code, _ := postJSON(t, h.base+path, `{"model":"m"}`); code != 200 {
		t.Fatalf("an honest call during the flood: %d", code)
	}
	honest := dialH2(t, h.l.Addr)
	honest.post(path, []byte(`{"model":"m"}`), true)

	// The bound: one goroutine a slow body (and the connections' own, a
	// few each); 12 KiB of heap a slow body (its stream or connection, its
	// request, its first chunk: 9 KiB measured), and its goroutine's stack
	// (8 KiB, 16 KiB under the race detector).
	if g > slow+4*(h2Conns+1)+40 {
		t.Errorf("+%d goroutines for %d slow bodies", g, slow)
	}
	if mem > slow*12<<10 || st > slow*16<<10 {
		t.Errorf("%d slow bodies hold %d bytes of heap, %d of stacks", slow, mem, st)
	}

	// Cut after the grace: every HTTP/2 stream answered 408, every
	// HTTP/1.1 connection too, and every handler gone.
	took := waitHandlers(t, "the slow bodies cut", func(n int) bool { return n == 0 }, 60*time.Second)
	cutAt := time.Since(start)
	if cutAt < DefaultBodyMinRateGrace {
		t.Fatalf("the slow bodies were cut %s after they began, before the grace", cutAt)
	}
	for i, c := range flood {
		for deadline := time.Now().Add(10 * time.Second); c.answers()[408] < streams; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("connection %d's streams: %v, want %d 408s", i, c.answers(), streams)
			}
		}
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 12)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "HTTP/1.1 408" {
			t.Fatalf("HTTP/1.1 connection %d: %q %v", i, b, err)
		}
	}
	if a := honest.answers(); a[200] != 1 {
		t.Fatalf("the honest HTTP/2 call: %v", a)
	}
	if !h.srv.queued.TryAcquire(budget) {
		t.Fatal("the slow bodies did not give their bytes back")
	}
	h.srv.queued.Release(budget)
	t.Logf("cut %s after they began (%s after all were read)", cutAt.Round(100*time.Millisecond), took.Round(100*time.Millisecond))
}

// The calls in progress on one connection hold at most
// limits.max_connection_queued_bytes between them: one HTTP/2 connection's
// streams, each sending 60 KiB of a body it never ends, are refused (503
// queued_bytes_limit, naming the connection's share) once the connection
// holds its share (1 MiB here: an eighth of the budget, and what one body
// of max_body_bytes, 480 KiB, holds while it is read), while the
// exporter's budget (8 MiB) stays open to every other client: an honest
// call on another connection goes through.
func TestConnectionShareBounded(t *testing.T) {
	const budget, share, streams, each = 8 << 20, 1 << 20, 40, 60 << 10
	h := newHostile(t, fmt.Sprintf("limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n"+
		"limits: {max_queued_bytes: %d}\nproxy: {max_body_bytes: %d}\n", budget, (share-64<<10)/2), Options{})
	if h.srv.connShare != share {
		t.Fatalf("the connection share is %d, want an eighth of the budget, at least what a body of max_body_bytes holds: %d", h.srv.connShare, share)
	}
	raw, err := net.Dial("tcp", h.l.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(raw)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
	}
	answers := make(chan answer, streams)
	var writers []*io.PipeWriter
	for range streams {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		go pw.Write([]byte(`{"model":"m","x":"` + strings.Repeat("a", each-18)))
		req, _ := http.NewRequest("POST", "http://"+h.l.Addr+"/proxy/gw/chat/completions", pr)
		go func() {
			res, err := cc.RoundTrip(req)
			if err != nil {
				answers <- answer{code: -1, body: err.Error()}
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			answers <- answer{res.StatusCode, string(b)}
		}()
	}
	// Each body held takes at least 60 KiB of the share: at most 17 fit,
	// the others are answered.
	var refused []answer
	for len(refused) < streams-share/each {
		select {
		case a := <-answers:
			refused = append(refused, a)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d streams refused, %d handlers reading", len(refused), handlers())
		}
	}
	for _, a := range refused {
		if a.code != 503 || !strings.Contains(a.body, "queued_bytes_limit") || !strings.Contains(a.body, "limits.max_connection_queued_bytes (1048576)") {
			t.Fatalf("a stream past the connection's share: %d %s", a.code, a.body)
		}
	}
	// The rest of the budget is everyone else's.
	if !h.srv.queued.TryAcquire(budget - share) {
		t.Fatal("one connection took more than its share of the budget")
	}
	h.srv.queued.Release(budget - share)
	if code, _ := postJSON(t, h.base+"/proxy/gw/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("an honest call beside the greedy connection: %d", code)
	}
	for _, w := range writers {
		w.CloseWithError(errors.New("gone"))
	}
	waitHandlers(t, "the greedy streams gone", func(n int) bool { return n == 0 }, 30*time.Second)
	if !h.srv.queued.TryAcquire(budget) {
		t.Fatal("the budget was not given back")
	}
	h.srv.queued.Release(budget)
}

// While a body is read, it holds at most twice what has arrived, plus
// 512 bytes, of the budget; once whole, exactly its size; refused midway
// (the budget or the connection's share is spent), it holds nothing once
// released. Random bodies, arriving in random pieces, against random
// budgets and shares.
func TestBodyHoldFollowsArrival(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		size := rapid.IntRange(0, 300<<10).Draw(rt, "size")
		budget, share := int64(1<<30), int64(1<<30)
		if rapid.Bool().Draw(rt, "tight") {
			budget = rapid.Int64Range(1, 1<<20).Draw(rt, "budget")
			share = rapid.Int64Range(1, 1<<20).Draw(rt, "share")
		}
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i)
		}
		s := &Server{}
		h := &bodyHold{all: semaphore.NewWeighted(budget), conn: new(connState), share: share}
		r := &trickle{body: body, pieces: rapid.SliceOfN(rapid.IntRange(1, 70<<10), 1, 50).Draw(rt, "pieces"), hold: h}
		c := &bodyClock{setDeadline: func(time.Time) error { return nil }, start: time.Now(), rate: 1, grace: time.Hour, most: time.Hour}
		b, err := s.readBody(r, 1<<30, h, c)
		if r.worst != "" {
			rt.Fatal(r.worst)
		}
		switch {
		case err == nil:
			if !bytes.Equal(b, body) {
				rt.Fatalf("read %d bytes, not the %d sent", len(b), size)
			}
			if h.n != int64(size) || h.conn.held.Load() != int64(size) {
				rt.Fatalf("a whole body of %d bytes holds %d (its connection %d)", size, h.n, h.conn.held.Load())
			}
		case errors.Is(err, errQueuedBytes) || errors.Is(err, errConnQueuedBytes):
		default:
			rt.Fatal(err)
		}
		h.release()
		if h.conn.held.Load() != 0 || !h.all.TryAcquire(budget) {
			rt.Fatal("bytes still held after release")
		}
	})
}

// trickle hands its body out in the given pieces (cycling), and checks at
// every read what its hold holds against what it has handed out.
type trickle struct {
	body   []byte
	pieces []int
	next   int
	sent   int
	hold   *bodyHold
	worst  string
}

func (r *trickle) Read(p []byte) (int, error) {
	if n := r.hold.n; n > 2*int64(r.sent)+firstChunk && r.worst == "" {
		r.worst = fmt.Sprintf("%d bytes held with %d arrived", n, r.sent)
	}
	if r.sent == len(r.body) {
		return 0, io.EOF
	}
	n := min(len(p), r.pieces[r.next%len(r.pieces)], len(r.body)-r.sent)
	r.next++
	copy(p, r.body[r.sent:r.sent+n])
	r.sent += n
	return n, nil
}

// The read deadline follows the rule: body_min_rate_grace, then as long as
// the body arrives at body_min_rate on average, body_read_timeout in all;
// it is set again only when it moves a second or more, or reaches
// body_read_timeout; a read cut before body_read_timeout was too slow.
func TestBodyClock(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var set []time.Duration
	c := &bodyClock{setDeadline: func(d time.Time) error { set = append(set, d.Sub(t0)); return nil },
		start: t0, rate: 240, grace: 5 * time.Second, most: 60 * time.Second}
	s := time.Second
	for _, step := range []struct {
		arrived int64
		set     []time.Duration // every deadline set so far, from the start
		cut     error
	}{
		{0, []time.Duration{5 * s}, errBodyTooSlow},
		{240 * 5, []time.Duration{5 * s}, errBodyTooSlow},                 // the rate's deadline is the grace's
		{240*6 - 1, []time.Duration{5 * s}, errBodyTooSlow},               // under a second more: not set again
		{240 * 6, []time.Duration{5 * s, 6 * s}, errBodyTooSlow},          // a second more
		{240*6 + 120, []time.Duration{5 * s, 6 * s}, errBodyTooSlow},      // half a second more
		{240 * 59, []time.Duration{5 * s, 6 * s, 59 * s}, errBodyTooSlow}, // any way more
		{240*59 + 120, []time.Duration{5 * s, 6 * s, 59 * s}, errBodyTooSlow},
		{240 * 70, []time.Duration{5 * s, 6 * s, 59 * s, 60 * s}, errBodyReadDeadline}, // body_read_timeout reached, under a second on
		{240 * 1000, []time.Duration{5 * s, 6 * s, 59 * s, 60 * s}, errBodyReadDeadline},
	} {
		c.arrived(step.arrived)
		if !slices.Equal(set, step.set) {
			t.Fatalf("%d bytes arrived: deadlines set %v, want %v", step.arrived, set, step.set)
		}
		if err := c.cut(); err != step.cut {
			t.Fatalf("%d bytes arrived: a cut read is %v, want %v", step.arrived, err, step.cut)
		}
	}
}

// Through the proxy, with real connections: a body that trickles under
// proxy.body_min_rate is cut once the grace has passed (408, saying so);
// one that arrives at five times the rate, longer than the grace, is
// not.
func TestSlowBodyCutAtMinRate(t *testing.T) {
	h := newHostile(t, "limiter: {max_inflight: 4}\nupstreams: [{name: gw, base_url: UPSTREAM}]\n"+
		"proxy: {body_min_rate: 1000, body_min_rate_grace: 1s}\n", Options{})
	send := func(perTenth int, tenths int) (int, string) {
		pr, pw := io.Pipe()
		go func() {
			io.WriteString(pw, `{"model":"m","x":"`)
			for range tenths {
				if _, err := pw.Write(bytes.Repeat([]byte("a"), perTenth)); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			io.WriteString(pw, `"}`)
			pw.Close()
		}()
		res, err := http.Post(h.base+"/proxy/gw/chat/completions", "application/json", pr)
		if err != nil {
			return -1, err.Error()
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		pr.CloseWithError(errors.New("answered"))
		return res.StatusCode, string(b)
	}
	start := time.Now()
	code, body := send(1, 100) // 10 bytes a second, for 10 s
	took := time.Since(start)
	if code != 408 || !strings.Contains(body, "slower than proxy.body_min_rate (1000 bytes a second, after the first 1s)") {
		t.Fatalf("a body at 10 B/s: %d %s", code, body)
	}
	if took < time.Second {
		t.Fatalf("cut %s in, before the grace", took)
	}
	if code, body := send(500, 30); code != 200 { // 5,000 bytes a second, for 3 s
		t.Fatalf("a body at 5,000 B/s: %d %s", code, body)
	}
}
