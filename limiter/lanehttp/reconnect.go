package lanehttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Reconnect reopens a streamed model call that breaks before any content
// arrives, the way docs/DESIGN.md asks of a streaming caller: each attempt
// holds its own slot, the slot is given back before the backoff (so the
// wait between attempts holds nothing), every attempt queues with the
// logical arrival of the first (so aging counts from the start of the
// call), attempts are bounded, and a queue timeout is never retried (a
// retry would join the same queue again: the storm the lanes exist to
// stop). A stream that has delivered content is never reopened: its
// failure is the caller's.
//
// The zero value is ready to use.
type Reconnect struct {
	// Attempts bounds the attempts, the first included; 0 means 3.
	Attempts int
	// Backoff is the wait before the second attempt, doubled before each
	// later one; 0 means 500 ms.
	Backoff time.Duration
	// Clock times the backoff; nil means the system clock. Pass the
	// limiter's (Limiter.Clock) to share its time.
	Clock limiter.Clock
	// Retryable reports whether an attempt that failed before any content
	// is worth another; nil means every failure but a queue timeout and
	// the end of the call's context.
	Retryable func(err error) bool
}

// ErrEmptyStream is the failure of an attempt whose response body ended
// before any content.
var ErrEmptyStream = errors.New("lanehttp: stream ended before any content")

// Do makes a streamed call with open, once per attempt, and returns the
// first response that is not a failure before content. open must send the
// request with the context it is given (it carries the call's arrival) and
// return the response or the error of the client. A successful response's
// body reconnects by itself if it breaks before its first byte; close it as
// always. A response with an error status is returned as it is, since
// retrying those is the SDK's business, except the
// synthesized answer to a queue timeout, which becomes its
// *limiter.QueueTimeoutError.
func (r *Reconnect) Do(ctx context.Context, open func(ctx context.Context) (*http.Response, error)) (*http.Response, error) {
	if _, ok := limiter.ArrivalFrom(ctx); !ok {
		ctx = limiter.WithArrival(ctx, r.clock().Now())
	}
	s := &stream{r: r, ctx: ctx, open: open}
	res, err := s.connect(nil)
	if err != nil || res.StatusCode < 200 || res.StatusCode > 299 {
		return res, err
	}
	s.body = res.Body
	res.Body = s
	return res, nil
}

func (r *Reconnect) clock() limiter.Clock {
	if r.Clock != nil {
		return r.Clock
	}
	return limiter.SystemClock()
}

func (r *Reconnect) attempts() int {
	if r.Attempts > 0 {
		return r.Attempts
	}
	return 3
}

func (r *Reconnect) retryable(err error) bool {
	if r.Retryable != nil {
		return r.Retryable(err)
	}
	return !errors.Is(err, limiter.ErrQueueTimeout) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// stream is the body of a reconnecting call.
type stream struct {
	r       *Reconnect
	ctx     context.Context
	open    func(ctx context.Context) (*http.Response, error)
	tries   int // attempts made
	body    io.ReadCloser
	content bool // a byte has arrived: never reconnect again
}

// connect makes attempts until one gives a response, backing off first if
// the previous attempt failed with prev. Failed responses are closed (and
// their slots given back) before the backoff.
func (s *stream) connect(prev error) (*http.Response, error) {
	for {
		if prev != nil {
			if !s.r.retryable(prev) || s.tries >= s.r.attempts() {
				return nil, prev
			}
			if err := s.sleep(s.r.backoff(s.tries)); err != nil {
				return nil, err
			}
		}
		s.tries++
		res, err := s.open(s.ctx)
		if err != nil {
			if qe, ok := asQueueTimeout(err); ok {
				return nil, qe
			}
			prev = fmt.Errorf("lanehttp: attempt %d of %d: %w", s.tries, s.r.attempts(), err)
			continue
		}
		if qe, ok := QueueTimeoutFrom(res); ok {
			res.Body.Close()
			return nil, qe
		}
		return res, nil
	}
}

func asQueueTimeout(err error) (*limiter.QueueTimeoutError, bool) {
	var qe *limiter.QueueTimeoutError
	return qe, errors.As(err, &qe)
}

func (r *Reconnect) backoff(done int) time.Duration {
	b := r.Backoff
	if b <= 0 {
		b = 500 * time.Millisecond
	}
	return b << (done - 1)
}

func (s *stream) sleep(d time.Duration) error {
	woke := make(chan struct{})
	t := s.r.clock().AfterFunc(d, func() { close(woke) })
	select {
	case <-woke:
		return nil
	case <-s.ctx.Done():
		t.Stop()
		return s.ctx.Err()
	}
}

func (s *stream) Read(p []byte) (int, error) {
	for {
		n, err := s.body.Read(p)
		if n > 0 || s.content {
			s.content = s.content || n > 0
			return n, err
		}
		if err == nil {
			continue
		}
		// The stream broke (or ended) before any content: give the slot
		// back, then try again.
		if err == io.EOF {
			err = ErrEmptyStream
		}
		s.body.Close()
		res, cerr := s.connect(fmt.Errorf("lanehttp: attempt %d of %d: %w", s.tries, s.r.attempts(), err))
		if cerr != nil {
			s.body = http.NoBody
			return 0, cerr
		}
		if res.StatusCode < 200 || res.StatusCode > 299 {
			res.Body.Close()
			s.body = http.NoBody
			return 0, fmt.Errorf("lanehttp: attempt %d of %d: status %s", s.tries, s.r.attempts(), res.Status)
		}
		s.body = res.Body
	}
}

func (s *stream) Close() error { return s.body.Close() }
