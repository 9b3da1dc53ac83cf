package lanehttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A model call goes to the gateway in one write, headers and body
// together (one TCP segment, not two), whether the body came to the
// Transport as a plain reader or through SetBody. (The first request on a
// new connection goes in one write either way: the calls after it, on the
// reused connection, are the ones that tell.)
func TestRequestInOneWrite(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer gw.Close()
	var writes atomic.Int64
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return countingConn{c, &writes}, err
	}}
	defer base.CloseIdleConnections()
	lim, err := limiter.New(limiter.Config{MaxInflight: 2, QueueTimeout: limiter.DefaultQueueTimeout})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &lanehttp.Transport{Limiter: lim, Base: base}}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, viaSetBody := range []bool{true, false, false, true} {
		req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
		if viaSetBody {
			lanehttp.SetBody(req, []byte(body))
		}
		before := writes.Load()
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if n := writes.Load() - before; n != 1 {
			t.Errorf("SetBody %v: the request took %d writes, want 1", viaSetBody, n)
		}
	}
}
