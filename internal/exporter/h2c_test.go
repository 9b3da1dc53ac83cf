package exporter

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The listener serves HTTP/2 without TLS (prior knowledge) beside
// HTTP/1.1: a call queued behind another over the same HTTP/2 connection
// waits as a stream, both streams complete, and an HTTP/1.1 client on the
// same port is served too.
func TestH2C(t *testing.T) {
	up := newUpstream(t)
	srv := newTestServer(t, "limiter: {max_inflight: 1, interactive_reserve: 0}\nupstreams: [{name: gw, base_url: \""+up.srv.URL+"/v1\"}]\n")
	l, err := Start(srv, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	url := "http://" + l.Addr + "/proxy/gw/chat/completions"
	do := func(c *http.Client, id string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(chat))
		req.Header.Set("X-Test-Call", id)
		return c.Do(req)
	}
	holder, err := do(&http.Client{Transport: h2}, "long-holder")
	if err != nil {
		t.Fatal(err)
	}
	if holder.Proto != "HTTP/2.0" {
		t.Fatalf("served over %s, want HTTP/2.0", holder.Proto)
	}
	queued := make(chan *http.Response, 1)
	go func() {
		res, err := do(&http.Client{Transport: h2}, "queued")
		if err != nil {
			t.Error(err)
		}
		queued <- res
	}()
	for deadline := time.Now().Add(10 * time.Second); srv.Limiter().Snapshot().Lanes[0].Queued != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second call never queued")
		}
	}
	close(up.hold)
	for _, res := range []*http.Response{holder, <-queued} {
		if res == nil {
			t.FailNow()
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("status %d, %q, %v", res.StatusCode, b, err)
		}
	}
	h1 := &http.Transport{}
	defer h1.CloseIdleConnections()
	res, err := do(&http.Client{Transport: h1}, "http1")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.Proto != "HTTP/1.1" || res.StatusCode != http.StatusOK {
		t.Fatalf("HTTP/1.1 client: %s %d", res.Proto, res.StatusCode)
	}
}
