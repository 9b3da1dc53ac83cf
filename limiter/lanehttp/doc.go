// Package lanehttp puts the model calls of an HTTP client through the lanes
// of a limiter.Limiter: wrap the client's transport in a Transport, and each
// POST to a model endpoint (/chat/completions, /completions, /responses,
// /messages) waits for a slot in the lane "<base URL>|<model>" before it is
// sent, and holds the slot until its response body is over: read to the
// end, broken, or closed. For a stream that is when the stream ends, because
// the gateway is busy for the whole generation, not just until the first
// byte. Other requests (embeddings, images, audio, files, listings) pass
// through without a lane.
//
// # A caller that leaves
//
// A slot stands for work at the backend. A gateway that does not stop a
// call's work when its client goes (LiteLLM does not) still has the call at
// work after its caller left, so by default the Transport sends each call
// on a context its caller's end does not cancel: a caller whose context
// ends before the headers gets its error at once, and a caller that closes
// the body early (or stops reading it for StallTimeout) is let go; in both
// cases the Transport reads the rest of the answer and discards it (its
// usage still settles the call's tokens), within StallTimeout between
// reads and at most ResponseHeaderTimeout plus StallTimeout from the send,
// and only then gives the slot back. Meanwhile the slot is
// marked abandoned (limiter.Slot.Abandon; the snapshot's
// abandoned_inflight). A read of the body already waiting when its caller's
// context ends returns with the next bytes, or at StallTimeout: the
// upstream request no longer ends with that context. Set
// Transport.CancelPropagates for an upstream that stops the work: the
// request is then canceled and the slot freed at once.
//
// # A gateway's word
//
// A 429 is a gateway's concurrency refusal or a rate limit
// (IsConcurrencyRefusal, from the first MaxRefusalPeek bytes of its body
// and its headers): the first holds the lane's grants only until one of
// its calls in flight ends, the second until its Retry-After. The
// rate-limit headers are read as Transport.RateLimitHeaders says (see
// HeaderSource).
//
// # Timeouts
//
// Transport.ResponseHeaderTimeout and Transport.StallTimeout start only once
// the slot is held, so time spent queueing never counts toward them. A stall
// ends the exchange with a *StallError (errors.Is ErrStall), which is not a
// queue timeout. http.Client.Timeout and an SDK's request timeout
// (option.WithRequestTimeout in openai-go) do include the queue wait: leave
// them unset, or set them above limiter.Config.QueueTimeout plus the longest
// call, and let the lane and these two limits bound the call instead.
//
// # Queue timeouts and SDK retries
//
// A queue timeout must not be retried: a retry joins the same queue again,
// which is the retry storm the lanes exist to stop. SDKs retry transport
// errors unconditionally, so by default a queue timeout is answered with a
// synthesized response that the official OpenAI and Anthropic SDKs do not
// retry: status 503, header x-should-retry: false, a Retry-After header
// (whole seconds: how long a new call of the same class would wait now, from
// the lane's recent service rate), and an OpenAI-style JSON error whose code
// is "lane_queue_timeout", naming the lane, the wait, the position and the
// settings to change. QueueTimeoutFrom recovers the
// *limiter.QueueTimeoutError from such a response (for openai-go, from
// (*openai.Error).Response). With Transport.ReturnErrors set, RoundTrip
// returns the typed errors instead, for direct http.Client users.
//
// # Retries keep their place
//
// Each attempt of an SDK's retry loop is a separate RoundTrip: it releases
// its slot when the SDK closes the failed response, before the backoff, and
// acquires again for the next attempt. The retry keeps its call's place in
// line and its age, with no code in the caller (docs/DESIGN.md, "Semantics of a lane"): the
// Transport remembers, for Transport.RetryWindow (30 s by default, an SDK's
// backoff) after an attempt that reached the gateway and failed, the first
// arrival of its call, under a fingerprint of its lane, credentials
// (Authorization, X-Api-Key, Api-Key), Idempotency-Key, query string and
// body. An attempt with the fingerprint of such a call, while no other
// attempt of it is in progress, is its retry: it queues with that arrival
// and counts as a retry in the lane's signals. An attempt whose caller gave
// up while it queued (a client whose timeout counts the wait) leaves a
// place for a resend its SDK marks as a retry (X-Stainless-Retry-Count
// above 0), within the window: it keeps the time it waited, not the time
// away (its arrival moves on by that), and is not counted as a retry. An
// attempt that timed out in the queue or was refused leaves no place. The
// memory is bounded (10,000 calls, a tenth of them per caller), expires,
// keeps no credential or body (only a seeded hash), and is never fed by
// the client alone: a retry header for a call never seen, or for one that
// gave up without waiting, gains nothing, and identical requests sent side
// by side are separate calls. Transports that share a Recall share the memory (lanes-exporter's
// survives its reloads). A caller that
// puts limiter.WithArrival in the request's context decides the arrival
// itself. Streams that break before any content are reconnected the same
// way by Reconnect.
//
// # Tokens
//
// Every model call is estimated (EstimateTokens: its prompt and its output
// bound) and carries the estimate to its lane (limiter.WithTokens), unless
// the caller set one. Its answer is read as it passes for what the call
// cost: the usage object of a whole answer or of a stream's chunks, else
// the events streamed; the slot is settled with it (limiter.Slot.Settle)
// when the exchange ends, and the exchange report carries the estimate and
// the use. The answer's rate-limit headers (RateLimits) are reported to
// the lane as they arrive, with the call's slot (limiter.Limiter.RecordLimits,
// limiter.ProviderLimits.Slot: a shared lane's store takes them through
// it); the answer's first byte warms a lane under limiter.Config.ColdStart.
// A call estimated
// above a whole budget is answered 413 token_budget_exceeded.
//
// # Bad requests
//
// A model call whose body is larger than MaxBodyBytes, is not JSON, or names
// no model fails before anything is sent: with a synthesized 413 or 400
// (code "request_too_large", "invalid_json" or "missing_model"), or with a
// *RequestError when ReturnErrors is set.
//
// # Proxies: waiting at the top
//
// A proxy built on httputil.ReverseProxy reaches RoundTrip deep in its
// handler, so a call that queues there parks a goroutine with a grown stack
// and the reverse proxy's copy of the request. Transport.Admit does the
// waiting at the top of the handler instead and attaches the outcome to the
// request; the round trip of that request (or of the reverse proxy's
// outgoing copy) sends it with its slot, or returns its refusal, as
// RoundTrip would have. Abandon gives back a slot no round trip took.
// lanes-exporter's docs/DESIGN.md, "A queued call's stack", says what
// that keeps and why.
//
// # Signals
//
// Every exchange of a model call ends with limiter.Limiter.RecordExchange:
// its outcome (ok, 4xx, 429, 5xx, transport error, stall, canceled; a
// successful body closed early counts as canceled only if the caller's
// context ended or no body had arrived, since SDKs close a stream at its
// end marker before the transport sees EOF), whether
// the SDK marked it as a retry (X-Stainless-Retry-Count above 0), and its
// time to first byte. They feed the lane's 5-minute upstream counts and the
// limiter's observers.
//
// With the limiter off the Transport passes every request straight through.
package lanehttp
