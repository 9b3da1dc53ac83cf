package lanehttp_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
)

// closeWatch is a connection that notes, at its first Close, how many
// calls the lane had in flight.
type closeWatch struct {
	net.Conn
	once     sync.Once
	inflight func() int
	at       chan int // the in-flight count at the first Close
}

func (c *closeWatch) Close() error {
	c.once.Do(func() { c.at <- c.inflight() })
	return c.Conn.Close()
}

// An exchange that ends before its body's end (closed, or its caller
// gone) closes its HTTP/1 connection before its slot is given back: the
// gateway hears of the end before the next call can reach it. net/http
// would close it too, but later, on its read loop's goroutine; so each
// round checks that the first Close came while the slot was still held,
// and before the body's Close returned.
func TestAbandonedExchangeClosesItsConnectionFirst(t *testing.T) {
	r := newRig(t, on(1))
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, s seen) bool {
		r.gw.streamChunks(w, s.Model, []string{"a", "b"}, make(chan struct{}), req.Context()) // never finishes by itself
		return true
	}
	inflight := func() int {
		for _, l := range r.lim.Snapshot().Lanes {
			if l.Lane == r.lane() {
				return l.Inflight
			}
		}
		return -1
	}
	conns := make(chan *closeWatch, 1)
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		w := &closeWatch{Conn: c, inflight: inflight, at: make(chan int, 1)}
		conns <- w
		return w, nil
	}}
	t.Cleanup(base.CloseIdleConnections)
	r.tr.Base = base
	for i := range 40 {
		ctx, cancel := context.WithCancel(callCtx("abandoned", limiter.Default))
		res, err := r.hc.Do(chatRequest(t, r.gw.url(), `{"model":"`+model+`","stream":true,"messages":[]}`).WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := res.Body.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		c := <-conns
		if i%2 == 0 {
			res.Body.Close() // the caller stops reading
		} else {
			cancel() // the caller is gone
			for _, err := res.Body.Read(make([]byte, 512)); err == nil; _, err = res.Body.Read(make([]byte, 512)) {
			}
		}
		select {
		case n := <-c.at:
			if n != 1 {
				t.Fatalf("round %d: the connection was closed with %d calls in flight, after its slot was given back", i, n)
			}
		default:
			t.Fatalf("round %d: the exchange ended and its connection is still open", i)
		}
		res.Body.Close()
		cancel()
		r.expectCounts(0, 0)
	}
}
