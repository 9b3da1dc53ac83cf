package gatewaysim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

func serve(t *testing.T, c Config) (*Gateway, string) {
	g := New(c)
	srv := httptest.NewServer(g)
	t.Cleanup(func() { g.Close(); srv.Close() })
	return g, srv.URL + "/v1/chat/completions"
}

func fast() Config { return Config{Capacity: 2, TokenTime: time.Millisecond, Tokens: 10, Seed: 1} }

func post(ctx context.Context, url string, stream bool) (*http.Response, error) {
	body := `{"model":"m","stream":false}`
	if stream {
		body = `{"model":"m","stream":true}`
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	return http.DefaultClient.Do(req)
}

func TestAnswersStreamedAndWhole(t *testing.T) {
	g, url := serve(t, fast())
	res, err := post(context.Background(), url, true)
	if err != nil {
		t.Fatal(err)
	}
	var chunks int
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			chunks++
		}
	}
	res.Body.Close()
	if chunks != 11 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") { // 10 tokens and the stop chunk
		t.Fatalf("%d chunks, %s", chunks, res.Header.Get("Content-Type"))
	}
	res, _ = post(context.Background(), url, false)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(b), `"content":"tok0 tok1`) || !strings.Contains(string(b), `"completion_tokens":10`) {
		t.Fatalf("body %s", b)
	}
	if s := g.Stats(); s.Completed != 2 || s.TokensGenerated != 20 || s.Received != 2 || s.Active != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPeakCountsConcurrency(t *testing.T) {
	c := fast()
	c.Tokens = 50
	g, url := serve(t, c)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := post(context.Background(), url, true)
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	if s := g.Stats(); s.Peak < 2 || s.Peak > 6 || s.Completed != 6 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want func(*testing.T, *http.Response, error, Stats)
	}{
		{"429", func(c *Config) { c.RateLimited = 1 }, func(t *testing.T, r *http.Response, err error, s Stats) {
			if err != nil || r.StatusCode != 429 || s.RateLimited != 1 {
				t.Fatalf("%v %v %+v", r, err, s)
			}
		}},
		{"5xx", func(c *Config) { c.ServerError = 1 }, func(t *testing.T, r *http.Response, err error, s Stats) {
			if err != nil || r.StatusCode != 502 || s.ServerErrors != 1 {
				t.Fatalf("%v %v %+v", r, err, s)
			}
		}},
		{"reset", func(c *Config) { c.Reset = 1 }, func(t *testing.T, r *http.Response, err error, s Stats) {
			if err == nil {
				_, err = io.ReadAll(r.Body)
			}
			if err == nil || s.Resets != 1 {
				t.Fatalf("read err %v, stats %+v", err, s)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fast()
			tc.set(&c)
			g, url := serve(t, c)
			res, err := post(context.Background(), url, true)
			tc.want(t, res, err, g.Stats())
			if res != nil {
				res.Body.Close()
			}
		})
	}
}

func TestStallHoldsUntilClientLeaves(t *testing.T) {
	c := fast()
	c.Stall = 1
	g, url := serve(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := post(ctx, url, true)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v", res, err)
	}
	read := make(chan error, 1)
	go func() { _, err := io.ReadAll(res.Body); read <- err }()
	select {
	case err := <-read:
		t.Fatalf("a stalled body ended: %v", err)
	case <-time.After(50 * time.Millisecond): // no data is the point; nothing is timed
	}
	cancel()
	<-read
	res.Body.Close()
	if g.Stats().Stalls != 1 {
		t.Fatalf("stats %+v", g.Stats())
	}
}

// An abandoned request goes on being generated, and counted as waste,
// unless the disconnect propagates.
func TestAbandonedWork(t *testing.T) {
	for _, propagate := range []bool{false, true} {
		c := fast()
		c.Tokens, c.TokenTime, c.PropagateDisconnect = 40, 2*time.Millisecond, propagate
		g, url := serve(t, c)
		ctx, cancel := context.WithCancel(context.Background())
		res, err := post(ctx, url, true)
		if err != nil {
			t.Fatal(err)
		}
		bufio.NewReader(res.Body).ReadString('\n') // the first token arrived
		cancel()
		res.Body.Close()
		for deadline := time.Now().Add(10 * time.Second); g.Stats().Active != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the request never ended")
			}
		}
		s := g.Stats()
		if s.Abandoned != 1 || s.Completed != 0 {
			t.Fatalf("propagate %v: %+v", propagate, s)
		}
		if propagate && s.TokensWasted > 1 || !propagate && s.TokensGenerated != 40 {
			t.Fatalf("propagate %v: generated %d, wasted %d", propagate, s.TokensGenerated, s.TokensWasted)
		}
		if !propagate && s.TokensWasted < 30 {
			t.Fatalf("wasted %d tokens, want most of the 40", s.TokensWasted)
		}
	}
}
