package lanehttp

import (
	"context"
	"io"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// exchange is the response body of a model call: it holds the call's slot
// until the body ends, guards it against stalls, and reports the exchange
// to the limiter when it is over.
type exchange struct {
	t       *Transport
	clock   limiter.Clock
	ctx     context.Context // the caller's
	lane    string
	attempt attempt            // for retry recognition
	cancel  context.CancelFunc // cancels the upstream request
	sent    time.Time
	wait    time.Duration // the call's wait for its slot
	// headerTimer guards the wait for the response headers.
	headerTimer limiter.Timer
	// call is what the exchange's report says of its call (began, path;
	// the rest at the end): in the exchange, which is on the heap anyway.
	call   limiter.ExchangeCall
	retry  bool
	status int
	// reqBytes is the request body's size; retryAfter, the response's
	// Retry-After: for the adaptive limit.
	reqBytes   int
	retryAfter time.Duration
	rc         io.ReadCloser
	// est is the call's token estimate; scan reads the answer for what it
	// cost (guarded by scanMu: a stall's finish may race a late Read);
	// stream is set for an event stream.
	est    Estimate
	scanMu sync.Mutex
	scan   usageScan
	stream bool

	firstByte atomic.Int64 // ns from sent to the first body byte; 0 until then
	lastRead  atomic.Int64 // ns from sent to the headers, then to the last read that returned data
	reading   atomic.Int32 // Reads in progress: with none, a quiet body is the caller's doing
	stalled   atomic.Bool  // the upstream went quiet while the caller read
	stopped   atomic.Bool  // the caller stopped reading
	// rmu orders the caller's reads of rc against the drain's, once the
	// caller has left (see abandon); draining is set then.
	rmu      sync.Mutex
	draining atomic.Bool
	left     limiter.Outcome // what the caller's leaving counts as (set before draining)
	// drainTimer ends a drain at the latest ResponseHeaderTimeout plus
	// StallTimeout after the send (guarded by mu).
	drainTimer limiter.Timer

	// mu orders finish against the stall timer, which may re-arm itself;
	// the slot is released exactly once, under done.
	mu         sync.Mutex
	done       bool
	inBody     bool // the headers are in: the stall guard watches the body
	slot       limiter.Slot
	stallTimer limiter.Timer
	guard      func() // x.check, made once
	// over is closed by finish when the slot can be lost (a shared lane),
	// to stop the goroutine that watches for that; lost is set when it was.
	over chan struct{}
	lost atomic.Bool

	// conn is the HTTP/1 connection the request went out on (from the
	// trace's GotConn; guarded by mu), and eof is set when the body reached
	// its end: an exchange that ends before it closes conn itself, since
	// net/http closes an abandoned connection later, on its own goroutine.
	conn  net.Conn
	http1 bool // the response came over HTTP/1: conn is this exchange's alone
	eof   atomic.Bool
}

// gotConn is the request's httptrace.ClientTrace.GotConn: it keeps the
// connection (the last one, should net/http retry on another).
func (x *exchange) gotConn(info httptrace.GotConnInfo) {
	x.mu.Lock()
	x.conn = info.Conn
	x.mu.Unlock()
}

func (x *exchange) Read(p []byte) (int, error) {
	x.rmu.Lock()
	if x.draining.Load() {
		x.rmu.Unlock()
		return 0, &StallError{Lane: x.lane, Phase: "caller", After: x.t.StallTimeout}
	}
	n, err := x.read(p)
	x.rmu.Unlock()
	return n, err
}

// read reads rc for the caller or the drain, with rmu held.
func (x *exchange) read(p []byte) (int, error) {
	x.reading.Add(1)
	n, err := x.rc.Read(p)
	x.reading.Add(-1)
	if n > 0 {
		x.scanMu.Lock()
		x.scan.feed(p[:n])
		x.scanMu.Unlock()
		since := int64(x.clock.Now().Sub(x.sent))
		if x.firstByte.CompareAndSwap(0, max(since, 1)) {
			// The adaptive limit learns from first bytes as they come.
			x.t.Limiter.RecordFirstByte(x.ctx, x.lane, limiter.FirstByte{Sent: x.sent, After: time.Duration(since), RequestBytes: x.reqBytes})
		}
		x.lastRead.Store(since)
	}
	switch {
	case err == nil:
	case err == io.EOF:
		x.eof.Store(true)
		o := x.statusOutcome()
		if o == limiter.OutcomeOK && x.draining.Load() {
			o = x.left // its caller left before the end
			if n > 0 {
				o = limiter.OutcomeCanceled // and more came after it left
			}
		}
		x.finish(o)
	case x.lost.Load():
		err = &lostError{lane: x.lane}
		x.finish(limiter.OutcomeCanceled)
	case x.stalled.Load():
		err = &StallError{Lane: x.lane, Phase: "response body", After: x.t.StallTimeout}
		x.finish(limiter.OutcomeStall)
	case x.stopped.Load():
		err = &StallError{Lane: x.lane, Phase: "caller", After: x.t.StallTimeout}
	case x.ctx.Err() != nil:
		x.finish(limiter.OutcomeCanceled)
	default:
		x.finish(limiter.OutcomeTransportError)
	}
	return n, err
}

// Close ends the exchange. A successful response closed before its end
// counts as canceled only if the caller's context has ended or none of its
// body had arrived: SDKs stop reading a stream at its end marker ("data:
// [DONE]") and close it before the transport sees EOF, and telling that
// from giving up would mean parsing every API's stream format.
func (x *exchange) Close() error {
	o := x.statusOutcome()
	if o == limiter.OutcomeOK && (x.ctx.Err() != nil || x.firstByte.Load() == 0) {
		o = limiter.OutcomeCanceled
	}
	if x.abandon(o) {
		return nil
	}
	err := x.rc.Close()
	x.finish(o)
	return err
}

func (x *exchange) statusOutcome() limiter.Outcome {
	switch {
	case x.status == 429:
		return limiter.OutcomeRateLimited
	case x.status >= 500:
		return limiter.OutcomeServerError
	case x.status >= 400:
		return limiter.OutcomeClientError
	}
	return limiter.OutcomeOK
}

// check runs on the guards' timers. Before the headers, only the header
// timer runs it, and it means they are late: canceling the request makes
// RoundTrip return at once. In the body, when nothing has arrived for
// StallTimeout, it cancels the request: if the caller is reading, the
// upstream went quiet, and the pending Read fails and reports the stall;
// if the caller is not reading, it has stopped (a client that no longer
// reads its stream), and the exchange ends at once so its slot is not
// held hostage. Otherwise it looks again when the quiet spell would reach
// the limit.
func (x *exchange) check() {
	x.mu.Lock()
	if x.done {
		x.mu.Unlock()
		return
	}
	if !x.inBody {
		x.mu.Unlock()
		x.cancel()
		return
	}
	idle := x.clock.Now().Sub(x.sent) - time.Duration(x.lastRead.Load())
	if idle < x.t.StallTimeout {
		x.stallTimer = x.clock.AfterFunc(x.t.StallTimeout-idle, x.guard)
		x.mu.Unlock()
		return
	}
	if x.reading.Load() > 0 {
		x.stalled.Store(true)
		x.mu.Unlock()
		x.cancel()
		return
	}
	x.stopped.Store(true)
	x.mu.Unlock()
	if x.abandon(limiter.OutcomeClientStall) {
		return // the upstream goes on: its answer is read and discarded
	}
	x.cancel()
	x.finish(limiter.OutcomeClientStall)
}

// abandon takes over the answer of a caller that left before its end
// (closed the body, or stopped reading), unless the upstream stops the
// work when its client goes (CancelPropagates): the rest is read and
// discarded on a goroutine of its own, within the stall timeout and at
// most ResponseHeaderTimeout plus StallTimeout from the send, and the
// slot is given back when it ends, so that the upstream never has more
// calls at work than the lane's limit. The exchange's outcome is then o,
// unless the upstream's answer says worse. It reports whether it did
// (false also once the exchange is over); a second call does nothing.
func (x *exchange) abandon(o limiter.Outcome) bool {
	if x.t.CancelPropagates || x.eof.Load() {
		return false
	}
	x.mu.Lock()
	if x.done || x.draining.Load() {
		x.mu.Unlock()
		return !x.done
	}
	x.left = o
	x.draining.Store(true) // after left: whoever sees it set reads left
	if bound := x.t.ResponseHeaderTimeout + x.t.StallTimeout; bound > 0 {
		// An answer that never ends (a stream that goes on and on) holds
		// the slot no longer than the two timeouts from the send.
		x.drainTimer = x.clock.AfterFunc(max(0, x.sent.Add(bound).Sub(x.clock.Now())), x.cancel)
	}
	x.mu.Unlock()
	x.slot.Abandon()
	go x.drain()
	return true
}

// drain reads the rest of an abandoned answer and discards it (its usage
// still settles the call's tokens), then finishes the exchange.
func (x *exchange) drain() {
	buf := make([]byte, 4<<10)
	for {
		x.rmu.Lock()
		n, err := x.read(buf)
		if n > 0 && x.left == limiter.OutcomeOK {
			// More came: the caller left before the end (not an SDK
			// closing a stream at its end marker).
			x.left = limiter.OutcomeCanceled
		}
		x.rmu.Unlock()
		if err == nil {
			continue
		}
		// read finished the exchange at the end of the body or on an
		// error; the caller's leaving is the outcome that counts.
		x.rc.Close()
		x.finish(x.left)
		return
	}
}

// finish releases the slot, stops the guards and reports the exchange,
// once.
func (x *exchange) finish(o limiter.Outcome) {
	x.mu.Lock()
	if x.done {
		x.mu.Unlock()
		return
	}
	x.done = true
	if x.stallTimer != nil {
		x.stallTimer.Stop()
	}
	if x.drainTimer != nil {
		x.drainTimer.Stop()
	}
	// The upstream request is ended before its slot is given back, so
	// that the gateway hears of the end before the next call can reach it.
	// Canceling is not enough for that: net/http closes the connection of
	// a canceled or abandoned HTTP/1 exchange on its read loop's goroutine,
	// which may run after the next call has been granted. So an exchange
	// that did not reach its end closes the connection here. (An HTTP/2
	// connection carries other calls: its stream is reset by the cancel.)
	x.cancel()
	if x.conn != nil && x.http1 && !x.eof.Load() {
		x.conn.Close()
	}
	x.scanMu.Lock()
	used, fromUsage := x.scan.settle(x.est, x.status, x.stream)
	chunks := x.scan.events
	x.scanMu.Unlock()
	x.slot.Settle(used)
	x.slot.Release()
	if x.over != nil {
		close(x.over)
	}
	x.mu.Unlock()
	now := x.clock.Now()
	x.attempt.end(now, true, o == limiter.OutcomeOK)
	x.t.Limiter.RecordExchange(x.ctx, x.lane, limiter.Exchange{
		Outcome:    o,
		Status:     x.status,
		Retry:      x.retry,
		FirstByte:  time.Duration(x.firstByte.Load()),
		Sent:       x.sent,
		Duration:   now.Sub(x.sent),
		RetryAfter: x.retryAfter,
		Tokens:     &limiter.ExchangeTokens{Estimate: x.est.Total(), Used: used, FromUsage: fromUsage},
		Call:       x.callReport(chunks),
	})
}

// callReport completes the exchange's report of its call, once it is over.
func (x *exchange) callReport(chunks int64) *limiter.ExchangeCall {
	x.call.Stream, x.call.Chunks, x.call.LastByte = x.stream, chunks, time.Duration(x.lastRead.Load())
	return &x.call
}
