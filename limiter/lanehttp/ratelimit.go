package lanehttp

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// noResetFor is how long a provider's remaining budget binds when its
// answer gives no reset time (Azure OpenAI sends the remaining counts
// alone): until the next answer brings a newer count, or for this long.
const noResetFor = time.Second

// RateLimits returns what the rate-limit headers of an answer of status,
// received at now, say of the provider's budgets, and whether they said
// anything. The headers read:
//
//   - OpenAI and Azure OpenAI: x-ratelimit-limit-tokens,
//     x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens (a duration:
//     "6m0s", "1s", "20ms"), and the same for -requests;
//   - Anthropic: anthropic-ratelimit-tokens-limit, -remaining and -reset
//     (an RFC 3339 time), and the same for requests;
//   - for a 429 only: retry-after-ms, else Retry-After (seconds, or an
//     HTTP date).
//
// A remaining count without a reset binds for 1 s. Every value is bounded
// (limiter.BoundProviderLimits with limiter.MaxProviderWindow): a reset
// dated in the year 9999 reads as an hour, and the lane bounds it again to
// its provider window.
func RateLimits(h http.Header, status int, now time.Time) (limiter.ProviderLimits, bool) {
	var pl limiter.ProviderLimits
	pl.Tokens = budget(h, now, "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")
	if !pl.Tokens.Known {
		pl.Tokens = budget(h, now, "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset")
	}
	pl.Requests = budget(h, now, "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")
	if !pl.Requests.Known {
		pl.Requests = budget(h, now, "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset")
	}
	if status == http.StatusTooManyRequests {
		pl.RetryAfter = retryAfter(h, now)
	}
	// Bounded at the widest window a lane takes; the lane bounds it to its
	// own (limiter.Config.ProviderWindow).
	pl = limiter.BoundProviderLimits(pl, limiter.MaxProviderWindow)
	return pl, pl.Tokens.Known || pl.Requests.Known || pl.RetryAfter > 0
}

func budget(h http.Header, now time.Time, limitKey, remainingKey, resetKey string) limiter.ProviderBudget {
	var b limiter.ProviderBudget
	rem, err := strconv.ParseInt(strings.TrimSpace(h.Get(remainingKey)), 10, 64)
	if err != nil || rem < 0 {
		return b
	}
	b.Known, b.Remaining, b.Reset = true, rem, noResetFor
	if l, err := strconv.ParseInt(strings.TrimSpace(h.Get(limitKey)), 10, 64); err == nil && l >= rem {
		b.Limit = l
	}
	if d, ok := resetIn(strings.TrimSpace(h.Get(resetKey)), now); ok {
		b.Reset = d
	}
	return b
}

// resetIn reads a reset header: a Go-style duration (OpenAI), a number of
// seconds, or an RFC 3339 time (Anthropic).
func resetIn(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d, true
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e9 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

func retryAfter(h http.Header, now time.Time) time.Duration {
	if ms, err := strconv.ParseFloat(strings.TrimSpace(h.Get("retry-after-ms")), 64); err == nil && ms > 0 && ms < 1e12 {
		return time.Duration(ms * float64(time.Millisecond))
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 && s < 1e9 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now))
	}
	return 0
}

// HeaderSource says whose rate-limit headers an upstream sends, and so
// what the lane makes of them (Transport.RateLimitHeaders).
type HeaderSource int

const (
	// HeadersGateway, the default, takes the headers for a gateway's own
	// accounting (LiteLLM's rpm and tpm settings): the budgets they
	// announce bind the lane's grants, but a call estimated above the
	// announced token limit is not refused, since the gateway counts what
	// a call used, not what it might use; it waits until the budget is
	// whole instead.
	HeadersGateway HeaderSource = iota
	// HeadersProvider takes them for the provider's own (its API refuses
	// a request larger than its per-minute limit): a call estimated above
	// the announced token limit is also refused at once, for one provider
	// window after the limit was last heard.
	HeadersProvider
	// HeadersIgnore reads no budgets from them; a 429 still holds the
	// lane (a concurrency refusal until a call ends, a rate limit by its
	// Retry-After).
	HeadersIgnore
)

// ParseHeaderSource reads "gateway", "provider" or "ignore" ("" is the
// default, gateway).
func ParseHeaderSource(s string) (HeaderSource, error) {
	switch s {
	case "", "gateway":
		return HeadersGateway, nil
	case "provider":
		return HeadersProvider, nil
	case "ignore":
		return HeadersIgnore, nil
	}
	return 0, fmt.Errorf("rate-limit headers %q: want provider, gateway or ignore", s)
}

func (s HeaderSource) String() string {
	switch s {
	case HeadersProvider:
		return "provider"
	case HeadersIgnore:
		return "ignore"
	}
	return "gateway"
}

// MaxRefusalPeek bounds how much of a 429's body is read to tell a
// concurrency refusal from a rate limit; the caller still gets all of it.
const MaxRefusalPeek = 4 << 10

// ReadLimits returns what an answer of status says of the lane's limits at
// the upstream, as RateLimits reads its headers, from a source of src;
// for a 429 it also tells a concurrency refusal from a rate limit (see
// IsConcurrencyRefusal), from the headers and body, the start of the
// answer's body (at most MaxRefusalPeek bytes).
func ReadLimits(h http.Header, status int, body []byte, now time.Time, src HeaderSource) (limiter.ProviderLimits, bool) {
	pl, ok := RateLimits(h, status, now)
	if src == HeadersIgnore {
		pl.Tokens, pl.Requests = limiter.ProviderBudget{}, limiter.ProviderBudget{}
		ok = pl.RetryAfter > 0
	}
	pl.RefuseAbove = src == HeadersProvider
	if status == http.StatusTooManyRequests && IsConcurrencyRefusal(h, body) {
		pl.Concurrency, ok = true, true
	}
	return pl, ok
}

// IsConcurrencyRefusal reports whether a 429 with headers h and body (its
// start) refused the call for the number of calls at work at the gateway
// rather than for a rate. Its body's words decide first: one that names a
// parallel or concurrency limit (LiteLLM's "Max parallel request limit
// reached") is a concurrency refusal, unless it names a per-minute limit
// too (LiteLLM's older limiter says "parallel" for its rpm and tpm); one
// that names a per-minute limit or calls itself a rate limit (OpenAI's
// rate_limit_exceeded, Anthropic's rate_limit_error) is not. Else the headers do: a rate limit
// gives a remaining count at 0 (or below) or a reset time (OpenAI's
// x-ratelimit-remaining-requests: 0 and x-ratelimit-reset-requests;
// Anthropic's anthropic-ratelimit-*-remaining and -reset), a concurrency
// refusal neither.
func IsConcurrencyRefusal(h http.Header, body []byte) bool {
	switch b := strings.ToLower(string(body[:min(len(body), MaxRefusalPeek)])); {
	case containsAny(b, parallelWords) && !containsAny(b, perMinuteWords):
		return true
	case containsAny(b, rateWords) || containsAny(b, perMinuteWords):
		return false
	}
	for k, vs := range h {
		k = strings.ToLower(k)
		if !strings.Contains(k, "ratelimit") || len(vs) == 0 {
			continue
		}
		if strings.Contains(k, "reset") {
			return false
		}
		if strings.Contains(k, "remaining") {
			if n, err := strconv.ParseFloat(strings.TrimSpace(vs[0]), 64); err == nil && n <= 0 {
				return false
			}
		}
	}
	return true
}

// The words of a 429's body, lower case: a concurrency refusal's, a
// per-minute limit's, and a rate limit's own name for itself.
var (
	parallelWords  = []string{"parallel request", "max_parallel", "concurrent request", "concurrency limit", "too many concurrent"}
	perMinuteWords = []string{"rpm", "tpm", "per min", "requests per", "tokens per"}
	rateWords      = []string{"rate_limit_exceeded", "rate_limit_error", "rate limit reached", "rate limit exceeded"}
)

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
