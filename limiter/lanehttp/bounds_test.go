package lanehttp

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// FuzzRateLimits: whatever a gateway's rate-limit headers say, RateLimits
// does not panic and returns values within their bounds: counts from 0 to
// 2^53, a limit of 0 (unknown) or at least the remaining count, a reset
// from 0 to limiter.MaxProviderWindow, a Retry-After from 0 to
// limiter.MaxRetryAfterHold.
func FuzzRateLimits(f *testing.F) {
	for _, c := range [][6]string{
		{"6000", "2988", "30.12s", "", "", ""},
		{"60000", "0", "999999h", "", "", ""},
		{"60000", "0", "1e8", "", "", "9999999999"},
		{"100", "999999999999999999999", "-5s", "2500", "3", ""},
		{"", "12", "2026-12-01T12:00:30Z", "", "Wed, 21 Oct 2015 07:28:00 GMT", ""},
		{"1", "1", "9999-12-31T23:59:59Z", "1e300", "NaN", "-1"},
	} {
		f.Add(c[0], c[1], c[2], c[3], c[4], c[5])
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, limit, remaining, reset, retryMS, retry, requests string) {
		for _, p := range []string{"x-ratelimit-%s-tokens", "anthropic-ratelimit-tokens-%s"} {
			h := http.Header{}
			set := func(k, v string) {
				if v != "" {
					h.Set(strings.ReplaceAll(p, "%s", k), v)
				}
			}
			set("limit", limit)
			set("remaining", remaining)
			set("reset", reset)
			h.Set("x-ratelimit-remaining-requests", requests)
			h.Set("x-ratelimit-reset-requests", reset)
			h.Set("retry-after-ms", retryMS)
			h.Set("Retry-After", retry)
			pl, _ := RateLimits(h, http.StatusTooManyRequests, now)
			for _, b := range []limiter.ProviderBudget{pl.Tokens, pl.Requests} {
				if b.Remaining < 0 || b.Remaining > 1<<53 || b.Limit < 0 || b.Limit > 1<<53 ||
					(b.Limit != 0 && b.Limit < b.Remaining) || b.Reset < 0 || b.Reset > limiter.MaxProviderWindow {
					t.Fatalf("headers %v: budget %+v out of bounds", h, b)
				}
			}
			if pl.RetryAfter < 0 || pl.RetryAfter > limiter.MaxRetryAfterHold {
				t.Fatalf("headers %v: Retry-After %s out of bounds", h, pl.RetryAfter)
			}
		}
	})
}

// FuzzUsage: whatever a response body says (split anywhere between two
// reads), the usage read from it does not panic, and each count it settles
// is from 0 to limiter.MaxCallTokens.
func FuzzUsage(f *testing.F) {
	for _, c := range []string{
		`{"usage":{"prompt_tokens":999999999999999999,"completion_tokens":999999999999999999}}`,
		`data: {"usage":{"input_tokens":99999999999999999999999999}}` + "\n\ndata: [DONE]\n\n",
		`{"usage":{"prompt_tokens":-5,"completion_tokens":1e30}}`,
		`{"usage": {"prompt_tokens": 12, "completion_tokens": 30, "details": {"x": "}"}}}`,
		`{"usage":null,"x":"usage"}`,
	} {
		f.Add([]byte(c), uint16(len(c)/2), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, stream bool) {
		u := newUsageScan()
		i := min(int(cut), len(body))
		u.feed(body[:i])
		u.feed(body[i:])
		for _, status := range []int{200, 429} {
			got, _ := u.settle(Estimate{Prompt: 10, Output: 100}, status, stream)
			if got.Prompt < 0 || got.Prompt > limiter.MaxCallTokens || got.Completion < 0 || got.Completion > limiter.MaxCallTokens {
				t.Fatalf("body %q: usage %+v out of bounds", body, got)
			}
		}
	})
}
