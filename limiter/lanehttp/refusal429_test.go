package lanehttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// A 429 is told apart as a gateway's concurrency refusal or a rate limit
// (docs/DESIGN.md, "Behind a real gateway"), from its body's words first,
// then its headers.
func TestConcurrencyRefusal(t *testing.T) {
	litellm := `{"error":{"message":"Max parallel request limit reached Hit Global Limit: Limit=4, current: 4","type":"None","param":"None","code":"429"}}`
	for _, c := range []struct {
		name    string
		headers map[string]string
		body    string
		want    bool
	}{
		{"LiteLLM's max_parallel_requests", map[string]string{"retry-after": "49.934439"}, litellm, true},
		{"LiteLLM's, with its rpm headers at 0", map[string]string{"x-ratelimit-remaining-requests": "0"}, litellm, true},
		{"LiteLLM's older rpm message", nil, `{"error":{"message":"Max parallel request limit reached Hit limit for api_key: x. tpm_limit: 200, current_tpm 80 , rpm_limit: 4 current rpm 4"}}`, false},
		{"no headers, no words", map[string]string{"retry-after": "3"}, `{"error":{"message":"busy"}}`, true},
		{"not JSON", nil, "<html>429 Too Many Requests</html>", true},
		{"OpenAI's rate limit", map[string]string{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"},
			`{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`, false},
		{"a rate limit's headers alone", map[string]string{"x-ratelimit-remaining-tokens": "0"}, "", false},
		{"LiteLLM's -1 past its rpm", map[string]string{"x-ratelimit-remaining-requests": "-1"}, "", false},
		{"a reset alone", map[string]string{"anthropic-ratelimit-tokens-reset": "2026-12-07T09:00:00Z"}, "", false},
		{"Anthropic's rate_limit_error", map[string]string{"retry-after": "1"}, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, false},
	} {
		h := http.Header{}
		for k, v := range c.headers {
			h.Set(k, v)
		}
		if got := lanehttp.IsConcurrencyRefusal(h, []byte(c.body)); got != c.want {
			t.Errorf("%s: concurrency %v, want %v", c.name, got, c.want)
		}
	}
}

// ReadLimits bounds what a 429 says, whatever it says: a Retry-After that
// is fractional is seconds; one that is negative, NaN, not a number or past
// any sense (1e300) holds nothing; one of a day holds MaxRetryAfterHold; a negative remaining
// count is no budget; a gateway's announced limit refuses nothing, a
// provider's does (RefuseAbove); ignore reads no budgets.
func TestReadLimitsBadInput(t *testing.T) {
	now := time.Date(2026, 12, 7, 9, 0, 10, 0, time.UTC)
	for _, c := range []struct {
		retryAfter string
		want       time.Duration
	}{
		{"49.934439", 49934439 * time.Microsecond},
		{"-5", 0}, {"NaN", 0}, {"Inf", 0}, {"soon", 0}, {"", 0},
		{"1e300", 0},
		{"86400", limiter.MaxRetryAfterHold},
	} {
		h := http.Header{"Retry-After": {c.retryAfter}}
		pl, _ := lanehttp.ReadLimits(h, 429, []byte("not json {"), now, lanehttp.HeadersGateway)
		if pl.RetryAfter != c.want || !pl.Concurrency {
			t.Errorf("Retry-After %q: hold %v concurrency %v, want %v as a concurrency refusal", c.retryAfter, pl.RetryAfter, pl.Concurrency, c.want)
		}
	}
	h := http.Header{}
	h.Set("x-ratelimit-limit-tokens", "1000")
	h.Set("x-ratelimit-remaining-tokens", "-1")
	h.Set("x-ratelimit-limit-requests", "10")
	h.Set("x-ratelimit-remaining-requests", "9")
	pl, ok := lanehttp.ReadLimits(h, 200, nil, now, lanehttp.HeadersGateway)
	if !ok || pl.Tokens.Known || !pl.Requests.Known || pl.RefuseAbove || pl.Concurrency {
		t.Fatalf("gateway's headers: %+v, want the requests budget alone (remaining -1 is none) and nothing refused", pl)
	}
	if pl, _ := lanehttp.ReadLimits(h, 200, nil, now, lanehttp.HeadersProvider); !pl.RefuseAbove {
		t.Fatalf("provider's headers: %+v, want RefuseAbove", pl)
	}
	if pl, ok := lanehttp.ReadLimits(h, 200, nil, now, lanehttp.HeadersIgnore); ok || pl.Requests.Known {
		t.Fatalf("ignored headers: %+v %v, want nothing", pl, ok)
	}
	for _, s := range []string{"", "gateway", "provider", "ignore"} {
		if src, err := lanehttp.ParseHeaderSource(s); err != nil || (s != "" && src.String() != s) {
			t.Errorf("ParseHeaderSource(%q): %v %v", s, src, err)
		}
	}
	if _, err := lanehttp.ParseHeaderSource("Provider"); err == nil {
		t.Error("ParseHeaderSource took an unknown word")
	}
}
