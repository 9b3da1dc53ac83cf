package exporter

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A queued call waits for its slot at the top of its handler, not inside
// the reverse proxy, traced or not (docs/DESIGN.md, "A queued call's
// stack"); traced, its queue-wait span is a child of its call span, which
// opens before the wait. Either way the call is served once the slot is
// free.
func TestQueuedCallWaitsAtTheTop(t *testing.T) {
	for _, traced := range []bool{false, true} {
		t.Run(fmt.Sprintf("traced=%v", traced), func(t *testing.T) {
			release := make(chan struct{})
			gw := holdingGateway(release)
			defer gw.Close()
			front, srv, spans := newFront(t, fmt.Sprintf("limiter: {max_inflight: 1, interactive_reserve: 0}\nupstreams: [{name: gw, base_url: %q}]\n", gw.URL+"/v1"), traced)
			url := front.URL + "/proxy/gw/chat/completions"
			done := make(chan string, 2)
			for range 2 {
				go func() {
					res, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true}`))
					if err != nil {
						done <- err.Error()
						return
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					done <- fmt.Sprintf("%d %s", res.StatusCode, b)
				}()
			}
			waitFor(t, func() bool { l := srv.Limiter().Snapshot().Lanes; return len(l) == 1 && l[0].Queued == 1 })

			waiting := waitingStack(t)
			if strings.Contains(waiting, "httputil.(*ReverseProxy).ServeHTTP") || !strings.Contains(waiting, "exporter.(*Server).serveProxy") {
				t.Errorf("the queued call does not wait at the top of the handler:\n%s", waiting)
			}
			close(release)
			for range 2 {
				select {
				case got := <-done:
					if got != "200 data: [DONE]\n\n" {
						t.Errorf("a call ended with %q", got)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a call never ended")
				}
			}
			if traced {
				parents := map[string]bool{}
				for _, s := range spans.Ended() {
					parents[s.SpanContext().SpanID().String()] = s.Name() == "chat m"
				}
				queued := 0
				for _, s := range spans.Ended() {
					if s.Name() == "llm.queue_wait" {
						queued++
						if !parents[s.Parent().SpanID().String()] {
							t.Errorf("a queue-wait span's parent is not its call span")
						}
					}
				}
				if queued != 2 {
					t.Errorf("%d queue-wait spans, want 2", queued)
				}
			}
		})
	}
}

// waitingStack returns the stack of the goroutine waiting in a lane.
func waitingStack(t *testing.T) string {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "limiter.(*lane).waitLocked") {
			return g
		}
	}
	t.Fatal("no goroutine waits in a lane")
	return ""
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}
