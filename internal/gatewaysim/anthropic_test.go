package gatewaysim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The Messages API as Anthropic speaks it: a whole answer with usage as
// input_tokens and output_tokens, a stream of Anthropic's events, the
// anthropic-ratelimit-tokens-* headers, and a 429 with retry-after and
// Anthropic's error body past the tokens per minute.
func TestAnthropicMessages(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	g := New(Config{Capacity: 4, TokenTime: time.Millisecond, Tokens: 3, TokensPerMinute: 1000, Seed: 1})
	g.SetClock(func() time.Time { return now })
	srv := httptest.NewServer(g)
	defer srv.Close()
	defer g.Close()
	post := func(body string) *http.Response {
		res, err := http.Post(srv.URL+"/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := post(`{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"12345678"}]}]}`)
	var m struct {
		Type    string
		Content []struct{ Type, Text string }
		Usage   struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		}
	}
	err := json.NewDecoder(res.Body).Decode(&m)
	res.Body.Close()
	if err != nil || m.Type != "message" || len(m.Content) != 1 || m.Usage.InputTokens != 2 || m.Usage.OutputTokens != 3 {
		t.Fatalf("whole answer: %+v %v", m, err)
	}
	if h := res.Header; h.Get("anthropic-ratelimit-tokens-limit") != "1000" || h.Get("anthropic-ratelimit-tokens-remaining") != "898" ||
		h.Get("anthropic-ratelimit-tokens-reset") == "" || h.Get("x-ratelimit-limit-tokens") != "" {
		t.Fatalf("rate-limit headers %v", h)
	}

	res = post(`{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"12345678"}]}`)
	var events []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if e, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, e)
		}
	}
	res.Body.Close()
	if want := "message_start content_block_start content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"; strings.Join(events, " ") != want {
		t.Fatalf("stream events %q, want %q", events, want)
	}

	res = post(`{"model":"claude","max_tokens":2000,"messages":[{"role":"user","content":"x"}]}`)
	var e struct {
		Type  string
		Error struct{ Type string }
	}
	json.NewDecoder(res.Body).Decode(&e)
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("retry-after") == "" || res.Header.Get("retry-after-ms") != "" || e.Type != "error" || e.Error.Type != "rate_limit_error" {
		t.Fatalf("past the limit: %d %v %+v", res.StatusCode, res.Header, e)
	}
}
