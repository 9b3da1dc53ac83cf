package gatewaysim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// A tokens-per-minute limit answers as OpenAI's does: every answer says
// what remains, a request that does not fit gets a 429 with the time until
// it would, and what a request did not use comes back when it ends.
func TestTokensPerMinute(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	c := fast()
	c.TokensPerMinute = 600 // 10 tokens a second
	g := New(c)
	g.SetClock(clock.Now)
	srv := newServer(t, g)
	// "abcdefgh": 2 prompt tokens; max_tokens 300: 302 reserved, 10 used.
	body := `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":300}`
	res, b := postBody(t, srv, body)
	if res.StatusCode != 200 || res.Header.Get("x-ratelimit-limit-tokens") != "600" || res.Header.Get("x-ratelimit-remaining-tokens") != "298" ||
		res.Header.Get("x-ratelimit-reset-tokens") != "30.2s" || !strings.Contains(b, `"usage":{"prompt_tokens":2,"completion_tokens":10,"total_tokens":12}`) {
		t.Fatalf("first answer %d %v: %s", res.StatusCode, res.Header, b)
	}
	// It used 12 of 302: 290 came back, so 588 remain. Ask for 2+590.
	big := `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":590}`
	res, b = postBody(t, srv, big)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "1" || res.Header.Get("retry-after-ms") != "400" ||
		res.Header.Get("x-ratelimit-remaining-tokens") != "588" {
		t.Fatalf("over the limit: %d %v: %s; want a 429 with Retry-After 1 (4 tokens in 0.4 s)", res.StatusCode, res.Header, b)
	}
	clock.Advance(400 * time.Millisecond)
	if res, b = postBody(t, srv, big); res.StatusCode != 200 {
		t.Fatalf("after the Retry-After: %d %s", res.StatusCode, b)
	}
	if s := g.Stats(); s.TokenLimited != 1 || s.RateLimited != 1 || s.TokensUsed != 24 {
		t.Fatalf("stats %+v, want one 429 past the limit and 24 tokens used", s)
	}
}

// A stream that asks for usage gets it in its last chunk.
func TestStreamUsage(t *testing.T) {
	c := fast()
	c.Tokens = 3
	srv := newServer(t, New(c))
	_, b := postBody(t, srv, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"abcd"}]}`)
	if !strings.Contains(b, `"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}`+"\n\ndata: [DONE]") {
		t.Fatalf("stream %s", b)
	}
}

func newServer(t *testing.T, g *Gateway) string {
	srv := httptestServer(g)
	t.Cleanup(func() { g.Close(); srv.Close() })
	return srv.URL + "/v1/chat/completions"
}

func postBody(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func httptestServer(h http.Handler) *httptest.Server { return httptest.NewServer(h) }
