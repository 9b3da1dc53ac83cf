package exporter

import (
	"bufio"
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

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// 6. Load: 2,000 concurrent streaming calls through the proxy, a fifth of
// them canceled by their clients (half while queued, half mid-stream). Every
// call ends answered or canceled, no slot is left, and no more calls than
// the limit were ever on the wire to the gateway at once. The simulator's
// own count can exceed the limit by a call whose client it has not yet
// seen go (the slot passes on when the proxy drops the upstream request;
// the gateway notices the closed connection a moment later), so without
// cancellations (TestLoadGatewayCount) its own count is checked too.
func TestLoadWithCancellations(t *testing.T) {
	runLoad(t, 2000, 16, true)
}

// Without cancellations, the simulator's own count never exceeds the limit.
func TestLoadGatewayCount(t *testing.T) {
	_, simPeak := runLoad(t, 500, 8, false)
	if simPeak > 8 {
		t.Fatalf("the gateway counted %d calls at once, limit 8", simPeak)
	}
}

func runLoad(t *testing.T, calls, limit int, cancels bool) (wirePeak, simPeak int) {
	sim := gatewaysim.New(gatewaysim.Config{Capacity: 64, TokenTime: 2 * time.Millisecond, Tokens: 5, PropagateDisconnect: true, Seed: 3})
	simSrv := httptest.NewServer(sim)
	defer simSrv.Close()
	defer sim.Close()
	cfg, err := ParseConfig("load.yaml", []byte(fmt.Sprintf(`
limiter: {max_inflight: %d, queue_timeout: 600s, interactive_reserve: 1}
upstreams: [{name: sim, base_url: "%s/v1"}]
`, limit, simSrv.URL)))
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{MaxIdleConnsPerHost: limit}
	w := &wire{base: base}
	srv, err := New(cfg, Options{Base: w})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	defer srv.Shutdown(context.Background())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: calls}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	var answered, canceled, failed atomic.Int64
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range calls {
		mode := rng.IntN(10) // 0: cancel while waiting, 1: cancel mid-stream, else read to the end
		if !cancels {
			mode = 9
		}
		delay := time.Duration(rng.IntN(3000)) * time.Microsecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if mode == 0 {
				time.AfterFunc(delay, cancel)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/proxy/sim/chat/completions",
				strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set(PriorityHeader, []string{"interactive", "default", "bulk"}[i%3])
			res, err := client.Do(req)
			if err != nil {
				if ctx.Err() != nil {
					canceled.Add(1)
				} else {
					failed.Add(1)
					t.Log(err)
				}
				return
			}
			defer res.Body.Close()
			sc := bufio.NewScanner(res.Body)
			done := false
			for sc.Scan() {
				if mode == 1 && strings.HasPrefix(sc.Text(), "data: {") {
					cancel()
				}
				done = done || sc.Text() == "data: [DONE]"
			}
			switch {
			case done && res.StatusCode == 200:
				answered.Add(1)
			case ctx.Err() != nil:
				canceled.Add(1)
			default:
				failed.Add(1)
				t.Logf("status %d, stream ended early", res.StatusCode)
			}
			io.Copy(io.Discard, res.Body)
		}()
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(3 * time.Minute):
		t.Fatalf("calls still running: %d answered, %d canceled", answered.Load(), canceled.Load())
	}
	if failed.Load() != 0 || answered.Load()+canceled.Load() != int64(calls) || (canceled.Load() == 0) == cancels {
		t.Fatalf("%d answered, %d canceled, %d failed", answered.Load(), canceled.Load(), failed.Load())
	}
	// A canceled call's slot is held until the simulator's answer has
	// ended (read and discarded by the proxy), a moment after its client
	// left: every slot comes back.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left := ""
		for _, l := range srv.Limiter().Snapshot().Lanes {
			if l.Inflight != 0 || l.Queued != 0 {
				left = fmt.Sprintf("lane %s left inflight %d queued %d", l.Lane, l.Inflight, l.Queued)
			}
		}
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(left)
		}
	}
	if p := int(w.peak.Load()); p > limit || p < limit/2 {
		t.Fatalf("at most %d exchanges on the wire at once, limit %d", p, limit)
	}
	t.Logf("%d answered, %d canceled; peak on the wire %d, the gateway's own peak %d (limit %d)",
		answered.Load(), canceled.Load(), w.peak.Load(), sim.Stats().Peak, limit)
	return int(w.peak.Load()), sim.Stats().Peak
}

// wire counts the exchanges between the lanes and the network: from
// sending a request to the end of its response body.
type wire struct {
	base      http.RoundTripper
	cur, peak atomic.Int64
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	n := w.cur.Add(1)
	for p := w.peak.Load(); n > p && !w.peak.CompareAndSwap(p, n); p = w.peak.Load() {
	}
	res, err := w.base.RoundTrip(r)
	if err != nil {
		w.cur.Add(-1)
		return nil, err
	}
	res.Body = &wireBody{ReadCloser: res.Body, w: w}
	return res, nil
}

type wireBody struct {
	io.ReadCloser
	w    *wire
	once sync.Once
}

func (b *wireBody) done() { b.once.Do(func() { b.w.cur.Add(-1) }) }

func (b *wireBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *wireBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}
