package exporter

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// A model call's body is read whole before the call queues (the model in
// it names the lane). Reading it must not let a client make the exporter
// hold what it has not sent: a slow-body flood (thousands of HTTP/2
// streams or connections, each sending a byte and never ending its body)
// once took the whole queued-bytes budget, because every reader reserved a
// 32 KiB chunk before any byte arrived. Three rules bound it:
//
//   - A body holds buffers that grow with what has arrived (512 bytes,
//     then doubling up to 32 KiB chunks), counted against
//     limits.max_queued_bytes as they are taken: at most twice what has
//     arrived, plus 512 bytes, while it is read; its exact size once whole.
//   - The calls in progress on one connection (an HTTP/2 connection's
//     streams together) hold at most limits.max_connection_queued_bytes, so
//     that one client cannot take the budget from every other.
//   - A body must arrive at proxy.body_min_rate on average once
//     proxy.body_min_rate_grace has passed, and whole within
//     proxy.body_read_timeout: a body that trickles is cut after the grace
//     (408), however many streams its client opens.

var (
	errBodyTooLarge     = errors.New("body too large")
	errQueuedBytes      = errors.New("max_queued_bytes reached")
	errConnQueuedBytes  = errors.New("max_connection_queued_bytes reached")
	errBodyTooSlow      = errors.New("body slower than body_min_rate")
	errBodyReadDeadline = errors.New("body not read within body_read_timeout")
)

// Chunk sizes: a body is read into chunks of 512 bytes, 1 KiB, ... 32 KiB,
// then 32 KiB chunks; each chunk is no larger than what has arrived before
// it (but the first).
const (
	firstChunk   = 512
	chunkClasses = 7 // 512 B ... 32 KiB
)

// chunkPool recycles body chunks by size, so that reading a body allocates
// only its final copy.
type chunkPool [chunkClasses]sync.Pool

func (p *chunkPool) get(class int) []byte {
	if b, ok := p[class].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, firstChunk<<class)
}

func (p *chunkPool) put(class int, b []byte) { b = b[:0]; p[class].Put(&b) }

// connState is what the exporter keeps of one client connection: the body
// bytes its calls in progress hold. http.Server.ConnContext puts it in
// every request's context (Start does).
type connState struct{ held atomic.Int64 }

type connKey struct{}

// withConnState is the http.Server's ConnContext.
func withConnState(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, new(connState))
}

// bodyHold is the budget a body's reading takes from: the exporter's
// limits.max_queued_bytes and its connection's share. Its zero conn (a
// handler served outside Start) takes from the exporter's budget only.
type bodyHold struct {
	all   *semaphore.Weighted
	conn  *connState
	share int64
	n     int64 // held
}

// take holds n more bytes, or none and says which bound refused them.
func (h *bodyHold) take(n int64) error {
	if h.conn != nil && h.conn.held.Add(n) > h.share {
		h.conn.held.Add(-n)
		return errConnQueuedBytes
	}
	if !h.all.TryAcquire(n) {
		if h.conn != nil {
			h.conn.held.Add(-n)
		}
		return errQueuedBytes
	}
	h.n += n
	return nil
}

// give gives n of the bytes held back.
func (h *bodyHold) give(n int64) {
	h.n -= n
	h.all.Release(n)
	if h.conn != nil {
		h.conn.held.Add(-n)
	}
}

// release gives back everything held.
func (h *bodyHold) release() { h.give(h.n) }

// bodyClock moves a body's read deadline as its bytes arrive: the body
// may take body_min_rate_grace, then as long as it arrives at
// body_min_rate on average since its start, and body_read_timeout in all.
type bodyClock struct {
	setDeadline func(time.Time) error // the request's: http.ResponseController.SetReadDeadline
	start       time.Time
	rate        int64 // bytes a second
	grace, most time.Duration
	set         time.Time // the deadline last set
}

// rateStep is how far the deadline must move before it is set again:
// setting it is a message to the HTTP/2 connection's goroutine, and a body
// read in many small reads would otherwise send one for each. So the rule
// holds to within a second: a body sent at body_min_rate is given up to a
// second less than the rate alone would.
const rateStep = time.Second

// arrived moves the deadline for a body of which n bytes have arrived.
func (c *bodyClock) arrived(n int64) {
	d := max(c.grace, time.Duration(n)*time.Second/time.Duration(c.rate))
	want := c.start.Add(min(d, c.most))
	if c.set.IsZero() || want.Sub(c.set) >= rateStep || (want.After(c.set) && d >= c.most) {
		c.set = want
		_ = c.setDeadline(want)
	}
}

// cut tells why a read that hit its deadline was cut.
func (c *bodyClock) cut() error {
	if c.set.Before(c.start.Add(c.most)) {
		return errBodyTooSlow
	}
	return errBodyReadDeadline
}

// readBody reads a body of at most limit bytes into chunks held from h,
// under c's deadline, and returns it at its exact size (h then holds just
// that). On an error h may hold bytes still: the caller releases h
// whatever the outcome.
func (s *Server) readBody(body io.Reader, limit int64, h *bodyHold, c *bodyClock) ([]byte, error) {
	var chunks [][]byte
	defer func() {
		for i, ch := range chunks {
			s.chunks.put(min(i, chunkClasses-1), ch)
		}
	}()
	var total int64
	c.arrived(0)
	for {
		class := min(len(chunks), chunkClasses-1)
		if err := h.take(firstChunk << class); err != nil {
			return nil, err
		}
		ch := s.chunks.get(class)
		chunks = append(chunks, ch)
		for len(ch) < cap(ch) {
			n, err := body.Read(ch[len(ch):cap(ch)])
			ch = ch[:len(ch)+n]
			chunks[len(chunks)-1] = ch
			if total += int64(n); total > limit {
				return nil, errBodyTooLarge
			}
			if err == io.EOF {
				return s.whole(chunks, total, h)
			}
			if isTimeout(err) {
				return nil, c.cut()
			}
			if err != nil {
				return nil, err
			}
			if n > 0 {
				c.arrived(total)
			}
		}
	}
}

// bodyPeak is the most a body of n bytes holds while it is read: its
// chunks (n and at most one 32 KiB chunk more), then its copy beside them
// (whole); 64 KiB covers the chunks' rounding.
func bodyPeak(n int64) int64 { return 2*n + 64<<10 }

// whole copies a body out of its chunks at its exact size, holding the
// copy before the chunks are given back.
func (s *Server) whole(chunks [][]byte, total int64, h *bodyHold) ([]byte, error) {
	chunked := h.n
	if err := h.take(total); err != nil {
		return nil, err
	}
	b := make([]byte, 0, total)
	for _, ch := range chunks {
		b = append(b, ch...)
	}
	h.give(chunked)
	return b, nil
}

// isTimeout reports a read deadline's error, as net/http returns it for
// HTTP/1.1 (a net.Error) and HTTP/2 (wrapping os.ErrDeadlineExceeded, a
// net.Error too).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
