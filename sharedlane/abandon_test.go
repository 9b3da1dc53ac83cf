package sharedlane

import (
	"context"
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

// A shared lane holds the backend's limit too when callers abandon their
// calls (docs/DESIGN.md, "Behind a real gateway"): two processes on one
// lane of 2, each through lanehttp's Transport (the upstream does not stop
// a call's work when its client goes, as LiteLLM does not), callers giving
// up at random moments; the backend never has more than 2 calls at work.
func TestSharedLaneAbandonedCallsKeepTheirSlots(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	const limit = 2
	var active, peak, served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		n := active.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		defer active.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		for range 4 { // the work goes on whether or not the client is there
			time.Sleep(15 * time.Millisecond)
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		served.Add(1)
	}))
	defer up.Close()
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	for _, name := range []string{"a", "b"} {
		p := newProcess(t, r.URL(), name, limiter.Config{MaxInflight: limit, QueueTimeout: time.Minute})
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: &lanehttp.Transport{Limiter: p.lim, Base: tr}}
		for i := range 12 {
			giveUp := time.Duration(rng.IntN(120)) * time.Millisecond
			if i == 0 {
				// One caller of each process stays: under make stress a
				// round trip to Redis can outlast every random give-up,
				// and then no call would reach the backend.
				giveUp = time.Minute
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), giveUp+time.Millisecond)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				res, err := client.Do(req)
				if err != nil {
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}()
		}
	}
	wg.Wait()
	for deadline := time.Now().Add(20 * time.Second); active.Load() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("calls still at work 20 s after the last caller left")
		}
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("the backend had %d calls at work at once, want at most %d (the shared lane's limit)", p, limit)
	}
	if served.Load() == 0 {
		t.Fatal("no call reached the backend")
	}
}
