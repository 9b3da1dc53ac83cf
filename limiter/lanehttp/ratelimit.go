package lanehttp

import (
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
