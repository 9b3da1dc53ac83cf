package lanehttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlanes/llmlanes/internal/redact"
	"github.com/llmlanes/llmlanes/limiter"
)

// Transport is an http.RoundTripper that sends model calls through the
// lanes of Limiter (see the package documentation). Its fields must not
// change once it is in use. It is safe for concurrent use.
type Transport struct {
	// Limiter owns the lanes. Required.
	Limiter *limiter.Limiter

	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper

	// ModelCall reports whether a request is a model call, to be sent
	// through a lane; nil means IsModelCall.
	ModelCall func(req *http.Request) bool

	// Lane names the lane of a model call from the request and the model
	// its body names; nil means DefaultLane ("<base URL>|<model>").
	Lane func(req *http.Request, model string) string

	// MaxBodyBytes bounds the body of a model call, which is read whole
	// before the call queues; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64

	// ResponseHeaderTimeout bounds the time from sending a model call (its
	// slot held) to its response headers; 0 means no limit.
	ResponseHeaderTimeout time.Duration

	// StallTimeout bounds the time from the response headers to the first
	// byte of the body, and between reads that return data; 0 means no
	// limit.
	StallTimeout time.Duration

	// ReturnErrors makes RoundTrip return the typed errors
	// (*limiter.QueueTimeoutError, *limiter.LaneLimitError,
	// limiter.ErrShuttingDown, *RequestError) instead of the synthesized
	// 503, 400 or 413 responses. Leave it false under an SDK that retries
	// transport errors.
	ReturnErrors bool

	// ServerTiming adds a Server-Timing header to every model call's
	// answer, before any the upstream sent: "lane", its duration the
	// call's wait for a slot and its description the lane's name (as
	// Describe gives it), then "upstream", the time from sending to the
	// upstream's headers; both in ms. A refusal's answer (a queue timeout,
	// a call larger than the budget) has the wait alone. Browsers' and HTTP
	// tools' timing views show it, so a caller sees where the time went
	// without the lane's telemetry.
	ServerTiming bool

	// Describe names a lane in the errors a client sees (the synthesized
	// responses); nil means the lane key. A proxy in front of internal
	// gateways can name the upstream instead of its address.
	Describe func(lane string) string

	// RetryWindow is how long after an attempt of a model call ended an
	// identical attempt counts as its retry and queues with the call's
	// first arrival (see the package documentation); 0 means
	// DefaultRetryWindow, and a negative value turns recognition off.
	RetryWindow time.Duration

	// Recall, if set, is the memory of recent calls to use (and share),
	// in place of one of the Transport's own made from RetryWindow.
	Recall *Recall

	// CancelPropagates says that the upstream stops a call's work when
	// its client goes away. Without it (the default: LiteLLM, for one,
	// goes on calling its backend), a call whose caller leaves after it
	// was sent keeps its slot, and its request, until the upstream's
	// answer ends: the rest is read and discarded, within the header and
	// stall timeouts, and the slot shows as abandoned
	// (limiter.Slot.Abandon). So the upstream never has more calls at
	// work than the lane's limit. With it, the request is canceled and
	// the slot given back at once.
	CancelPropagates bool

	// RateLimitHeaders says whose rate-limit headers the upstream sends
	// (see HeaderSource); the zero value is HeadersGateway.
	RateLimitHeaders HeaderSource

	// DefaultMaxOutputTokens is the output bound of a call whose body
	// names none (max_completion_tokens, max_tokens, max_output_tokens),
	// for its token estimate (see EstimateTokens); 0 means
	// DefaultMaxOutputTokens.
	DefaultMaxOutputTokens int64

	recallOnce sync.Once
	recall     *recall
}

// recalls returns the transport's memory of recent calls, or nil when
// retry recognition is off.
func (t *Transport) recalls() *recall {
	t.recallOnce.Do(func() {
		switch {
		case t.Recall != nil:
			t.recall = t.Recall.r
		case t.RetryWindow == 0:
			t.recall = newRecall(DefaultRetryWindow)
		case t.RetryWindow > 0:
			t.recall = newRecall(t.RetryWindow)
		}
	})
	return t.recall
}

// RoundTrip implements http.RoundTripper. For a model call it waits for a
// slot, sends the request, and returns a response whose body holds the slot
// until the body is read to the end, fails, or is closed: the caller must
// close it, as always. Every other request passes straight to Base.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !t.Limiter.Enabled() || !t.isModelCall(req) {
		return base.RoundTrip(req)
	}

	a, ok := req.Context().Value(admissionKey{}).(*admission)
	if ok && a.t == t && a.taken.CompareAndSwap(false, true) {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper closes the request body; Admit has its bytes
		}
	} else {
		a = t.admit(req)
	}
	if a.res != nil || a.err != nil {
		return a.res, a.err
	}
	return t.send(base, req, a)
}

// admission is what a model call's round trip does before it sends: the
// body read and checked, the lane found, the slot taken; or the answer or
// error of a call refused on the way (res or err set, no slot).
type admission struct {
	t     *Transport
	body  []byte
	read  bool // body was read from the request (not set by SetBody)
	lane  string
	est   Estimate
	slot  limiter.Slot
	at    attempt
	res   *http.Response
	err   error
	began time.Time     // the acquisition's start
	wait  time.Duration // for a slot
	// taken is set by the round trip that uses the admission, or by
	// Abandon: whichever comes first owns the slot.
	taken atomic.Bool
}

type admissionKey struct{}

// Admit does for model call req what RoundTrip does before it sends: reads
// and checks the body, finds the lane, and waits for a slot (or is refused).
// It returns req with the outcome attached and the body in memory (SetBody);
// RoundTrip of that request, or of a request made from it (WithContext,
// Clone, a reverse proxy's outgoing request), then sends the call at once
// with that slot, or returns the refusal RoundTrip would have returned.
// Any other request is returned as it is.
//
// It is for a proxy: waiting here, at the top of its handler, a queued call
// keeps a smaller goroutine stack than waiting in RoundTrip, deep inside
// httputil.ReverseProxy and the transports around this one, and no copy of
// the request made for the round trip (see the package documentation).
// Events (and so the OpenTelemetry bridge's queue-wait span) see the
// request's context as it is here: a tracing proxy announces the call's
// span first (otelbridge.Bridge.StartCall).
//
// The caller must call Abandon on the returned request when done with it:
// it gives the slot back if no round trip took it.
func (t *Transport) Admit(req *http.Request) *http.Request {
	if !t.Limiter.Enabled() || !t.isModelCall(req) {
		return req
	}
	a := t.admit(req)
	out := req.WithContext(context.WithValue(req.Context(), admissionKey{}, a))
	if a.read {
		SetBody(out, a.body) // the caller's body was read; a body set by SetBody is still there
	}
	return out
}

// Abandon gives back the slot of a request Admit returned, unless a round
// trip took it; it does nothing for any other request.
func Abandon(req *http.Request) {
	a, ok := req.Context().Value(admissionKey{}).(*admission)
	if !ok || a.res != nil || a.err != nil || !a.taken.CompareAndSwap(false, true) {
		return // not admitted, refused (no slot), or taken by a round trip
	}
	a.at.end(a.t.Limiter.Clock().Now(), false, false)
	a.slot.Release()
}

func (t *Transport) isModelCall(req *http.Request) bool {
	if t.ModelCall != nil {
		return t.ModelCall(req)
	}
	return IsModelCall(req)
}

// admit reads and checks a model call's body (prepare), finds its lane and
// waits for its slot (acquire).
func (t *Transport) admit(req *http.Request) *admission {
	a := t.prepare(req)
	if a.res == nil && a.err == nil {
		t.acquire(a, req)
	}
	return a
}

// acquire waits for the slot of a, or records why there is none.
func (t *Transport) acquire(a *admission, req *http.Request) {
	ctx := req.Context()
	if a.at.r != nil { // prepare began an attempt: the arrival is its call's
		ctx = limiter.WithArrival(ctx, a.at.arrival)
	}
	if limiter.TokensFrom(ctx) == 0 {
		if a.est.Open {
			ctx = limiter.WithOpenOutput(ctx, a.est.Prompt, a.est.Output)
		} else {
			ctx = limiter.WithTokens(ctx, a.est.Total())
		}
	}
	var err error
	a.clock(t, false)
	a.slot, err = t.Limiter.Acquire(ctx, a.lane)
	a.clock(t, true)
	if err != nil {
		t.refuse(a, req, err)
	}
}

// clock notes, before the acquisition (done false) and after it, how long
// it waited. Out of line: a time read in acquire's own frame, live all
// through a queued call's wait, grew the handler's stack of every queued
// call past 4 KiB, to 8 (TestQueuedCallStack).
//
//go:noinline
func (a *admission) clock(t *Transport, done bool) {
	now := t.Limiter.Clock().Now()
	if done {
		a.wait = now.Sub(a.began)
	} else {
		a.began = now
	}
}

// refuse records the refusal of a's acquisition with err.
func (t *Transport) refuse(a *admission, req *http.Request, err error) {
	if req.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		a.at.gaveUp(t.Limiter.Clock().Now()) // its caller gave up while it queued
	} else {
		a.at.end(t.Limiter.Clock().Now(), false, false)
	}
	if a.res = t.refusal(req, a.lane, err); a.res == nil {
		a.err = err
	} else if t.ServerTiming {
		t.serverTiming(a.res.Header, a.lane, a.wait, -1)
	}
}

// prepare reads and checks a model call's body and finds its lane and its
// arrival (a retry's is its call's first).
func (t *Transport) prepare(req *http.Request) *admission {
	a := &admission{t: t}
	limit := t.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	out := t.DefaultMaxOutputTokens
	if out <= 0 {
		out = DefaultMaxOutputTokens
	}
	var model string
	var err error
	if b, ok := setBody(req); ok && int64(len(b)) <= limit {
		a.body = b
	} else {
		a.body, err = readBody(req.Body, req.ContentLength, limit)
		a.read = true
	}
	if err == nil {
		// Validated once, walked once: the model for the lane and the
		// estimate for the budget together.
		model, a.est, err = modelAndEstimate(a.body, out)
	}
	if req.Body != nil {
		req.Body.Close() // a RoundTripper closes the request body, even on error
	}
	if err != nil {
		if !errors.Is(err, ErrBodyTooLarge) && !errors.Is(err, ErrNotJSON) && !errors.Is(err, ErrNoModel) {
			a.err = err // the caller's body failed to read
			return a
		}
		re := &RequestError{URL: redact.URL(req.URL), Limit: limit, Err: err}
		if t.ReturnErrors {
			a.err = re
			return a
		}
		c := requestErrorCode(re)
		a.res = c.Response(req, c.Body(re.Error()))
		return a
	}
	a.lane = DefaultLane(req, model)
	if t.Lane != nil {
		a.lane = t.Lane(req, model)
	}

	// A retry queues with its call's first arrival, unless the caller set
	// the arrival itself.
	if _, set := limiter.ArrivalFrom(req.Context()); !set {
		if r := t.recalls(); r != nil {
			call, caller := r.fingerprint(req, a.lane, a.body)
			a.at = r.begin(call, caller, t.Limiter.Clock().Now(), sdkRetry(req))
		}
	}
	return a
}

// sdkRetry reports whether req's SDK marks it as a retry: an
// X-Stainless-Retry-Count above 0.
func sdkRetry(req *http.Request) bool {
	n, err := strconv.Atoi(req.Header.Get("X-Stainless-Retry-Count"))
	return err == nil && n > 0
}

// refusal returns the synthesized answer to an acquisition that failed with
// err, or nil when err is the caller's (its context) or ReturnErrors is set.
func (t *Transport) refusal(req *http.Request, lane string, err error) *http.Response {
	if t.ReturnErrors {
		return nil
	}
	name := lane
	if t.Describe != nil {
		name = t.Describe(lane)
	}
	var qe *limiter.QueueTimeoutError
	var le *limiter.LaneLimitError
	switch {
	case errors.As(err, &qe):
		named := *qe
		named.Lane = name
		return QueueTimeoutResponse(req, &named)
	case errors.As(err, &le):
		named := *le
		named.Lane = name
		c := mustCode(LaneLimitCode)
		b := c.Body(named.Error())
		b.Error.Lane = name
		return c.Response(req, b)
	case errors.Is(err, limiter.ErrLaneUnavailable):
		c := mustCode(LaneUnavailableCode)
		b := c.Body(fmt.Sprintf("lane %q: the shared lane's store (Redis) is unreachable and this process refuses calls until it is back; send the call again later", name))
		b.Error.Lane = name
		res := c.Response(req, b)
		res.Header.Set("Retry-After", "5")
		return res
	case errors.Is(err, limiter.ErrTokenBudget):
		var te *limiter.TokenBudgetError
		errors.As(err, &te)
		named := *te
		named.Lane = name
		c := mustCode(TokenBudgetCode)
		b := c.Body(named.Error())
		b.Error.Lane = name
		return c.Response(req, b)
	case errors.Is(err, limiter.ErrShuttingDown):
		c := mustCode(ShuttingDownCode)
		b := c.Body(fmt.Sprintf("lane %q: this process is shutting down and grants no more slots; send the call again (to another instance)", name))
		b.Error.Lane = name
		res := c.Response(req, b)
		res.Header.Set("Connection", "close")
		res.Close = true
		return res
	}
	return nil
}

// send makes the exchange of a model call whose slot is held. From here on
// every path ends in exchange.finish, which releases the slot.
func (t *Transport) send(base http.RoundTripper, req *http.Request, a *admission) (*http.Response, error) {
	body, lane, slot, at := a.body, a.lane, a.slot, a.at
	clock := t.Limiter.Clock()
	x := &exchange{t: t, clock: clock, ctx: req.Context(), lane: lane, slot: slot, attempt: at, sent: clock.Now(), reqBytes: len(body),
		est: a.est, scan: newUsageScan(), call: limiter.ExchangeCall{Began: a.began, Path: req.URL.Path}, wait: a.wait}
	x.retry = at.retry // recognised from this transport's memory, never from what the client claims
	// The upstream request lives on when its caller leaves, unless the
	// upstream stops the work when its client goes (CancelPropagates):
	// the slot stands for work at the backend (see abandon).
	upCtx := req.Context()
	if !t.CancelPropagates {
		upCtx = context.WithoutCancel(upCtx)
	}
	// The trace learns the connection, for finish to close (see there);
	// the guards, a lost shared slot and finish end the request by
	// canceling it.
	upCtx, x.cancel = context.WithCancel(httptrace.WithClientTrace(upCtx, &httptrace.ClientTrace{GotConn: x.gotConn}))
	out := req.WithContext(upCtx) // a copy: a RoundTripper must not modify the caller's request
	// A NopCloser around a bytes.Reader is a body net/http knows is in
	// memory: it writes the headers and the body in one write (one
	// segment), where for any other body it flushes the headers first.
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil

	if lost := slot.Lost(); lost != nil {
		x.over = make(chan struct{})
		go func() {
			select {
			case <-lost:
				x.lost.Store(true)
				x.cancel()
			case <-x.over:
			}
		}()
	}
	if t.ResponseHeaderTimeout > 0 || t.StallTimeout > 0 {
		x.guard = x.check // one func value for both guards' timers
	}
	if d := t.ResponseHeaderTimeout; d > 0 {
		x.headerTimer = clock.AfterFunc(d, x.guard)
	}
	done := req.Context().Done()
	if t.CancelPropagates || done == nil {
		res, err := base.RoundTrip(out)
		return x.answer(res, err)
	}
	// The caller may leave before the headers: it gets its error at once,
	// and the exchange goes on without it, its answer read and discarded.
	ch := make(chan roundTrip, 1)
	go func() {
		res, err := base.RoundTrip(out)
		ch <- roundTrip{res, err}
	}()
	select {
	case r := <-ch:
		return x.answer(r.res, r.err)
	case <-done:
		x.slot.Abandon()
		go func() {
			r := <-ch
			if res, err := x.answer(r.res, r.err); err == nil {
				res.Body.Close() // x: it reads the rest and discards it (abandon)
			}
		}()
		return nil, context.Cause(req.Context())
	}
}

// roundTrip is the outcome of the base transport's RoundTrip.
type roundTrip struct {
	res *http.Response
	err error
}

// answer takes the upstream's answer to the exchange's request: headers
// (res) or err. It returns the response to hand the caller, its body the
// exchange, or the error, the exchange then finished.
func (x *exchange) answer(res *http.Response, err error) (*http.Response, error) {
	t, clock, lane := x.t, x.clock, x.lane
	if res != nil {
		x.http1 = res.ProtoMajor == 1
	}
	if x.headerTimer != nil && !x.headerTimer.Stop() {
		// It fired: the headers were late, whatever RoundTrip returned.
		if res != nil {
			res.Body.Close()
		}
		res, err = nil, &StallError{Lane: lane, Phase: "response headers", After: t.ResponseHeaderTimeout}
	}
	if err != nil {
		outcome := limiter.OutcomeTransportError
		switch {
		case x.lost.Load():
			err, outcome = &lostError{lane: lane}, limiter.OutcomeCanceled
		case errors.Is(err, ErrStall):
			outcome = limiter.OutcomeStall
		case x.ctx.Err() != nil:
			outcome = limiter.OutcomeCanceled
		}
		x.finish(outcome)
		return nil, err
	}

	if t.ServerTiming {
		t.serverTiming(res.Header, lane, x.wait, clock.Now().Sub(x.sent))
	}
	x.status = res.StatusCode
	x.stream = strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	var peek []byte
	if res.StatusCode == http.StatusTooManyRequests && res.Body != nil {
		peek = x.peekRefusal(res)
	}
	if pl, ok := ReadLimits(res.Header, res.StatusCode, peek, clock.Now(), t.RateLimitHeaders); ok {
		pl.At = x.sent   // the provider counted when the call arrived
		pl.Slot = x.slot // a shared lane's store knows when it was granted
		t.Limiter.RecordLimits(x.ctx, lane, pl)
	}
	if res.StatusCode >= 400 {
		x.retryAfter = retryAfter(res.Header, clock.Now())
		x.retryAfter = min(x.retryAfter, limiter.MaxRetryAfterHold)
	}
	x.rc = res.Body
	if x.rc == nil {
		x.rc = http.NoBody
	}
	if t.StallTimeout > 0 {
		x.lastRead.Store(int64(clock.Now().Sub(x.sent)))
		x.mu.Lock()
		x.inBody = true
		x.stallTimer = clock.AfterFunc(t.StallTimeout, x.guard)
		x.mu.Unlock()
	}
	res.Body = x
	return res, nil
}

// peekRefusal reads the start of a 429's body (at most MaxRefusalPeek
// bytes, within the stall timeout or a second), so that its words can say
// what refused the call, and puts it back in front of the rest.
func (x *exchange) peekRefusal(res *http.Response) []byte {
	d := x.t.StallTimeout
	if d <= 0 || d > time.Second {
		d = time.Second
	}
	late := x.clock.AfterFunc(d, x.cancel)
	buf := make([]byte, MaxRefusalPeek)
	n, err := io.ReadFull(res.Body, buf)
	late.Stop()
	buf = buf[:n]
	rest := io.Reader(res.Body)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		rest = errReader{err}
	}
	res.Body = peeked{Reader: io.MultiReader(bytes.NewReader(buf), rest), Closer: res.Body}
	return buf
}

type peeked struct {
	io.Reader
	io.Closer
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// replay is a request body replayed from memory.
type replay struct {
	bytes.Reader
	b []byte
}

func newReplay(b []byte) *replay {
	r := &replay{b: b}
	r.Reset(b)
	return r
}

func (*replay) Close() error { return nil }

// SetBody makes b the body of req in a way a Transport takes without
// copying it: for a caller (a proxy, say) that has read and checked the
// body already. It sets Body, GetBody and ContentLength; a reverse proxy
// that wraps Body keeps GetBody, which is where the Transport finds b. b
// must not change while the request is in use.
func SetBody(req *http.Request, b []byte) {
	req.Body, req.ContentLength, req.TransferEncoding = newReplay(b), int64(len(b)), nil
	req.GetBody = func() (io.ReadCloser, error) { return newReplay(b), nil }
}

// setBody returns the bytes of a body made by SetBody, if req has one.
func setBody(req *http.Request) ([]byte, bool) {
	if r, ok := req.Body.(*replay); ok {
		return r.b, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	rb, err := req.GetBody()
	if r, ok := rb.(*replay); ok && err == nil {
		return r.b, true
	}
	if rb != nil {
		rb.Close()
	}
	return nil, false
}
