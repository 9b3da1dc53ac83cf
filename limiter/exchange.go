package limiter

import (
	"context"
	"time"

	"github.com/llmlanes/llmlanes/limiter/internal/stats"
)

// Outcome is how one exchange with the upstream gateway ended. Transports
// such as lanehttp report it with RecordExchange; the lane keeps the counts
// of the last 5 minutes for classification, and observers see each one.
type Outcome uint8

const (
	// OutcomeOK: a complete response with a status below 400.
	OutcomeOK Outcome = iota
	// OutcomeClientError: a 4xx other than 429; the request was refused,
	// which says nothing about the gateway's health.
	OutcomeClientError
	// OutcomeRateLimited: a 429.
	OutcomeRateLimited
	// OutcomeServerError: a 5xx.
	OutcomeServerError
	// OutcomeTransportError: no response (refused, reset, DNS) or a body
	// broken off by the upstream.
	OutcomeTransportError
	// OutcomeStall: no response headers, first byte or next chunk within
	// the transport's limits.
	OutcomeStall
	// OutcomeCanceled: the caller gave up (its context ended, or it closed
	// the body before the end).
	OutcomeCanceled
	// OutcomeClientStall: the caller stopped reading the response for the
	// transport's stall limit while its data waited, and the exchange was
	// ended to free the slot. The gateway was not at fault.
	OutcomeClientStall

	numOutcomes
)

func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeClientError:
		return "client_error"
	case OutcomeRateLimited:
		return "rate_limited"
	case OutcomeServerError:
		return "server_error"
	case OutcomeTransportError:
		return "transport_error"
	case OutcomeStall:
		return "stall"
	case OutcomeCanceled:
		return "canceled"
	case OutcomeClientStall:
		return "client_stall"
	}
	return "unknown"
}

// IsUpstreamError reports whether o points at the upstream: a 429, a
// 5xx, a transport error or a stall. Classification counts these.
func (o Outcome) IsUpstreamError() bool {
	return o == OutcomeRateLimited || o == OutcomeServerError || o == OutcomeTransportError || o == OutcomeStall
}

// Outcomes lists every outcome, in the order of their values.
func Outcomes() []Outcome {
	return []Outcome{OutcomeOK, OutcomeClientError, OutcomeRateLimited, OutcomeServerError,
		OutcomeTransportError, OutcomeStall, OutcomeCanceled, OutcomeClientStall}
}

// Exchange describes one attempt's exchange with the upstream, from the
// moment the request was sent (with its slot held) to the end of the
// response.
//
// Outcome and Retry come first, together, so that an Event (which holds
// an Exchange) stays small: it is copied on the stack of every queued
// call (docs/DESIGN.md, "A queued call's stack").
type Exchange struct {
	Outcome Outcome
	// Retry is true when the client marked the attempt as a retry (for the
	// OpenAI and Anthropic SDKs, X-Stainless-Retry-Count above 0).
	Retry bool
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// FirstByte is the time from sending to the first byte of the response
	// body (for a stream, the first token); 0 when none arrived.
	FirstByte time.Duration
	// Sent is when the request was sent, its slot held.
	Sent time.Time
	// Duration is the time from sending to the end of the response.
	Duration time.Duration
	// RetryAfter is the response's Retry-After, if it had one.
	RetryAfter time.Duration
	// Tokens is what the call was estimated at and what it used.
	Tokens *ExchangeTokens
	// Call is what the transport knew of the call around the exchange, or
	// nil. A pointer, so that an Event, which carries an Exchange by value,
	// stays small (see Event).
	Call *ExchangeCall
}

// ExchangeCall is what a transport knew of an exchange's call.
type ExchangeCall struct {
	// Began is when the call began, before it waited for its slot (zero
	// when not known), so that Sent.Add(Duration).Sub(Began) is the call
	// as its caller saw it, its queue wait included.
	Began time.Time
	// Path is the request's URL path: what the call asked for (the
	// OpenTelemetry bridge names the GenAI operation by it).
	Path string
	// Stream is set when the answer was an event stream; Chunks is how
	// many events it carried, and LastByte the time from sending to the
	// last read that brought any of its body.
	Stream   bool
	Chunks   int64
	LastByte time.Duration
}

// ExchangeTokens is what an exchange's call was estimated at, in tokens,
// and what it used (see Slot.Settle).
type ExchangeTokens struct {
	// Estimate is the estimate at admission; 0 when there was none.
	Estimate int64
	// Used is what the call cost.
	Used Usage
	// FromUsage is set when Used is the answer's own usage; otherwise it
	// was estimated from what the answer carried.
	FromUsage bool
}

// ErrorRatio returns how far the use differed from the estimate, as a
// fraction of the estimate (above 0: it used more), and false when there
// was no estimate.
func (t ExchangeTokens) ErrorRatio() (float64, bool) {
	if t.Estimate <= 0 {
		return 0, false
	}
	return float64(t.Used.Total()-t.Estimate) / float64(t.Estimate), true
}

// isLoss reports whether x tells of the gateway's capacity, for the adaptive
// limit: a 429, a transport error, a stall, or a 502, 503 or 504 (a gateway
// overloaded, or its upstream failing). Another 5xx, a plain 500 above all,
// is the gateway's error about that one request, which a client can
// provoke with the request it sends: it counts in the lane's health
// (IsUpstreamError) but cuts no one's limit.
func (x Exchange) isLoss() bool {
	switch x.Outcome {
	case OutcomeRateLimited, OutcomeTransportError, OutcomeStall:
		return true
	case OutcomeServerError:
		return x.Status == 0 || x.Status == 502 || x.Status == 503 || x.Status == 504
	}
	return false
}

// UpstreamCounts counts a lane's exchanges of the last 5 minutes by outcome,
// and how many of them were SDK retries.
type UpstreamCounts struct {
	OK              int `json:"ok"`
	ClientErrors    int `json:"client_errors"`
	RateLimited     int `json:"rate_limited"`
	ServerErrors    int `json:"server_errors"`
	TransportErrors int `json:"transport_errors"`
	Stalls          int `json:"stalls"`
	Canceled        int `json:"canceled"`
	ClientStalls    int `json:"client_stalls"`
	Retries         int `json:"retries"`
	// LastErrorAge is the time since the latest upstream error (429, 5xx,
	// transport error or stall) of the window; absent when there is none.
	LastErrorAge *Seconds `json:"last_error_age_s,omitempty"`
}

// RecordExchange reports how an exchange in lane key ended. With the
// limiter on and the lane existing, the lane counts it in its 5-minute
// window, shown as the snapshot's extra key "upstream_5m", and observers are
// told with an Exchanged event. It never creates a lane, so what it records
// stays within Config.MaxLanes.
func (l *Limiter) RecordExchange(ctx context.Context, key string, x Exchange) {
	if x.Outcome >= numOutcomes {
		x.Outcome = OutcomeTransportError
	}
	if l.cfg.Load().MaxInflight == 0 {
		return
	}
	ln := l.lockedLane(key)
	if ln == nil {
		return
	}
	now := l.clock.Now()
	ln.stats.Exchange(now, int(x.Outcome), x.Retry, x.Duration, x.Outcome.IsUpstreamError())
	ln.touchLocked(now)
	if x.Status != 0 {
		ln.warmLocked() // an answer: the lane has heard from its gateway
	}
	if cfg := l.cfg.Load(); cfg.Adaptive != nil && x.isLoss() {
		ln.adaptLocked(cfg)
		ln.limit.loss(now, &x)
	}
	ln.mu.Unlock()
	if len(l.observers) > 0 {
		l.emit(ctx, Event{Kind: Exchanged, Lane: key, Priority: PriorityFrom(ctx), Exchange: x})
	}
}

// The statistics count outcomes by index, one for each: numOutcomes is
// stats.Outcomes, or this does not compile (a negative difference overflows
// the Outcome, a positive one the negation).
const _ = -uint(numOutcomes - stats.Outcomes)

// upstreamCounts returns the exchanges of the window v, or nil if none.
func upstreamCounts(v *stats.View) *UpstreamCounts {
	u := v.Upstream()
	if u.Retries == 0 && u.Outcomes == ([numOutcomes]uint32{}) {
		return nil
	}
	c := &UpstreamCounts{
		OK:              int(u.Outcomes[OutcomeOK]),
		ClientErrors:    int(u.Outcomes[OutcomeClientError]),
		RateLimited:     int(u.Outcomes[OutcomeRateLimited]),
		ServerErrors:    int(u.Outcomes[OutcomeServerError]),
		TransportErrors: int(u.Outcomes[OutcomeTransportError]),
		Stalls:          int(u.Outcomes[OutcomeStall]),
		Canceled:        int(u.Outcomes[OutcomeCanceled]),
		ClientStalls:    int(u.Outcomes[OutcomeClientStall]),
		Retries:         int(u.Retries),
	}
	if age, ok := v.LastErrorAge(); ok {
		s := seconds(age.Seconds())
		c.LastErrorAge = &s
	}
	return c
}
