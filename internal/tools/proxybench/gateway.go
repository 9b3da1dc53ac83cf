package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// gateway is the overload measurement's backend: a model server of
// capacity C that shares itself among the calls at work, as a batching
// model server does. A call needs work seconds of the backend at full
// speed; with n > C calls at work each runs at C/n of it, so that an
// overloaded backend completes C/work calls a second however many it
// holds, and each of them later. A call whose client goes is stopped
// (the work done on it is wasted), as vLLM aborts a request whose
// connection closed.
type gateway struct {
	capacity int
	work     float64 // seconds of full-speed work per call

	mu     sync.Mutex // guards what follows
	active map[*gwCall]struct{}
	stats  gatewayStats
}

// gatewayStats are the gateway's counts since it started, served on
// /stats.
type gatewayStats struct {
	Completed int     `json:"completed"`
	Abandoned int     `json:"abandoned"`
	UsefulS   float64 `json:"useful_s"`   // work on calls answered
	WastedS   float64 `json:"wasted_s"`   // work on calls whose client went first
	MaxActive int     `json:"max_active"` // the most calls at work at once
}

type gwCall struct {
	done float64 // work done, seconds
	end  chan struct{}
}

// tick advances every call at work by dt of the backend, shared, and ends
// those whose work is done.
func (g *gateway) tick(dt float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := len(g.active)
	if n == 0 {
		return
	}
	rate := min(1, float64(g.capacity)/float64(n))
	for c := range g.active {
		c.done += dt * rate
		if c.done >= g.work {
			delete(g.active, c)
			g.stats.Completed++
			g.stats.UsefulS += g.work
			close(c.end)
		}
	}
}

func (g *gateway) start() *gwCall {
	c := &gwCall{end: make(chan struct{})}
	g.mu.Lock()
	g.active[c] = struct{}{}
	g.stats.MaxActive = max(g.stats.MaxActive, len(g.active))
	g.mu.Unlock()
	return c
}

// abandon stops c, unless its work ended meanwhile: false then.
func (g *gateway) abandon(c *gwCall) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.active[c]; !ok {
		return false
	}
	delete(g.active, c)
	g.stats.Abandoned++
	g.stats.WastedS += c.done
	return true
}

const gatewayAnswer = `{"id":"chatcmpl-bench","object":"chat.completion","model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":10,"completion_tokens":10,"total_tokens":20}}`

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/stats" {
		g.mu.Lock()
		s := g.stats
		g.mu.Unlock()
		json.NewEncoder(w).Encode(s)
		return
	}
	io.Copy(io.Discard, r.Body)
	c := g.start()
	select {
	case <-c.end:
	case <-r.Context().Done():
		if g.abandon(c) {
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, gatewayAnswer)
}

// serveGateway serves a gateway of capacity calls of work each on ln.
func serveGateway(ln net.Listener, capacity int, work time.Duration) error {
	g := &gateway{capacity: capacity, work: work.Seconds(), active: map[*gwCall]struct{}{}}
	go func() {
		const step = 2 * time.Millisecond
		last := time.Now()
		for now := range time.Tick(step) {
			g.tick(now.Sub(last).Seconds())
			last = now
		}
	}()
	return (&http.Server{Handler: g}).Serve(ln)
}
