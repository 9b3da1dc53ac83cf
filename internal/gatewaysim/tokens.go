package gatewaysim

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

// TokenLimit is a provider's tokens-per-minute limit, kept as OpenAI and
// Anthropic describe theirs: a bucket of PerMinute tokens that refills
// continuously, PerMinute a minute. A request reserves its prompt plus its
// output bound when it arrives, or is answered 429 with the time until
// the bucket holds that much; when it ends, what it did not use is given
// back (the provider counts usage). It is not safe for concurrent use.
type TokenLimit struct {
	PerMinute int64
	level     float64
	at        time.Time
}

// NewTokenLimit returns a full bucket of perMinute tokens at now.
func NewTokenLimit(perMinute int64, now time.Time) *TokenLimit {
	return &TokenLimit{PerMinute: perMinute, level: float64(perMinute), at: now}
}

// The refill multiplies before it divides, so that whole tokens over
// whole durations come out exact.

func (b *TokenLimit) refill(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.level = math.Min(float64(b.PerMinute), b.level+float64(b.PerMinute)*float64(d)/float64(time.Minute))
		b.at = now
	}
}

// Take reserves cost tokens at now, or says how long until it could: a
// 429's Retry-After.
func (b *TokenLimit) Take(cost int64, now time.Time) (ok bool, retryAfter time.Duration) {
	b.refill(now)
	if b.level >= float64(cost) {
		b.level -= float64(cost)
		return true, 0
	}
	return false, time.Duration(math.Ceil((float64(cost) - b.level) * float64(time.Minute) / float64(b.PerMinute)))
}

// Refund gives n tokens back at now.
func (b *TokenLimit) Refund(n int64, now time.Time) {
	b.refill(now)
	b.level = math.Min(float64(b.PerMinute), b.level+float64(n))
}

// Remaining returns the tokens left at now, and the time until the
// bucket is full again.
func (b *TokenLimit) Remaining(now time.Time) (int64, time.Duration) {
	b.refill(now)
	rem := math.Max(0, b.level)
	return int64(rem), time.Duration(math.Ceil((float64(b.PerMinute) - rem) * float64(time.Minute) / float64(b.PerMinute)))
}

// SetHeaders writes OpenAI's rate-limit headers for the bucket at now:
// x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens and
// x-ratelimit-reset-tokens (a duration, "6m0s", as OpenAI writes it).
func (b *TokenLimit) SetHeaders(h http.Header, now time.Time) {
	rem, reset := b.Remaining(now)
	h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(b.PerMinute, 10))
	h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(rem, 10))
	h.Set("x-ratelimit-reset-tokens", reset.Round(time.Millisecond).String())
}

// SetAnthropicHeaders writes Anthropic's rate-limit headers for the bucket
// at now: anthropic-ratelimit-tokens-limit, -remaining and -reset (when it
// is full again, in RFC 3339).
func (b *TokenLimit) SetAnthropicHeaders(h http.Header, now time.Time) {
	rem, reset := b.Remaining(now)
	h.Set("anthropic-ratelimit-tokens-limit", strconv.FormatInt(b.PerMinute, 10))
	h.Set("anthropic-ratelimit-tokens-remaining", strconv.FormatInt(rem, 10))
	h.Set("anthropic-ratelimit-tokens-reset", now.Add(reset).UTC().Format(time.RFC3339))
}

// request is what the gateway reads of a chat completion request, or of an
// Anthropic Messages request (anthropic: its max_tokens is the bound, its
// messages' text contents the prompt).
type request struct {
	anthropic           bool
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	StreamOptions       struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// PromptTokens is the simulated provider's count of a request's prompt:
// the bytes of its messages' text contents (a string, or text blocks), 4 a
// token, rounded up. (A
// client's estimate that counts every string of the body, roles and
// framing included, is above it.)
func (r *request) PromptTokens() int64 {
	n := 0
	for _, m := range r.Messages {
		var s string
		var blocks []struct {
			Text string `json:"text"`
		}
		switch {
		case json.Unmarshal(m.Content, &s) == nil:
			n += len(s)
		case json.Unmarshal(m.Content, &blocks) == nil: // content blocks, as Anthropic's SDKs send them
			for _, b := range blocks {
				n += len(b.Text)
			}
		}
	}
	return int64((n + 3) / 4)
}

// PromptTokens is the simulated provider's count of the prompt of the
// chat completion request body (see request.PromptTokens); 0 for a body
// that is not one.
func PromptTokens(body []byte) int64 {
	var r request
	if json.Unmarshal(body, &r) != nil {
		return 0
	}
	return r.PromptTokens()
}

// bound returns the request's output bound, or def without one.
func (r *request) bound(def int64) int64 {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	}
	return def
}
