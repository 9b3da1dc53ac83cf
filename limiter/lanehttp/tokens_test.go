package lanehttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

func TestEstimateTokens(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       lanehttp.Estimate
	}{
		// A string of b bytes counts (b+3)/4 + 1: "system" 3, "You are
		// terse." 5, "user" 2, "Say hi." 3. Keys and the model are not
		// prompt.
		{"chat", `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi."}],"max_tokens":50}`,
			lanehttp.Estimate{Prompt: 3 + 5 + 2 + 3, Output: 50}},
		{"max_completion_tokens wins", `{"model":"m","input":"abcd","max_tokens":50,"max_completion_tokens":70}`,
			lanehttp.Estimate{Prompt: 2, Output: 70}},
		{"responses api", `{"model":"m","input":"abcdefgh","max_output_tokens":9}`, lanehttp.Estimate{Prompt: 3, Output: 9}},
		{"default output, times n", `{"model":"m","prompt":"abcd","n":3}`, lanehttp.Estimate{Prompt: 2, Output: 3 * 1024, Open: true}},
		// 4 characters of 3 bytes: 12 bytes, 12 more units: 24/4+1.
		{"beyond ascii", `{"model":"m","input":"中文中文"}`, lanehttp.Estimate{Prompt: 7, Output: 1024, Open: true}},
		{"image", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 100_000) + `"}}]}]}`,
			lanehttp.Estimate{Prompt: 2 + 4 + 1000, Output: 1024, Open: true}}, // "user", "image_url", the image
		// The raw string ab\"cd\\ is 8 bytes: escaped quotes and
		// backslashes do not end it.
		{"escapes", `{"model":"m","input":"ab\"cd\\","max_tokens":1}`, lanehttp.Estimate{Prompt: 3, Output: 1}},
		{"stream settings are not prompt", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"input":"ab","max_tokens":null}`,
			lanehttp.Estimate{Prompt: 2, Output: 1024, Open: true, Stream: true}}, // null names no bound
		{"stream false", `{"model":"m","stream":false,"input":"ab","max_tokens":3}`, lanehttp.Estimate{Prompt: 2, Output: 3}},
	} {
		if got := lanehttp.EstimateTokens([]byte(c.body), 1024); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// The rig's gateway answers with the headers and the body a test gives.
func (r *rig) answer(f func(w http.ResponseWriter, r *http.Request)) {
	r.gw.mu.Lock()
	r.gw.handle = func(w http.ResponseWriter, req *http.Request, _ seen) bool { f(w, req); return true }
	r.gw.mu.Unlock()
}

func (r *rig) remaining() int64 {
	r.t.Helper()
	tk := r.snapshot().Tokens
	if tk == nil || tk.Remaining == nil {
		r.t.Fatalf("no tokens remaining in the snapshot: %+v", tk)
	}
	return *tk.Remaining
}

func budgeted(n int, tpm int64) limiter.Config {
	c := on(n)
	c.TokensPerMinute = tpm
	return c
}

// A whole answer settles its call by its usage; the estimate was taken at
// the grant. The fake clock never moves: no refill.
func TestSettleFromUsage(t *testing.T) {
	r := newRig(t, budgeted(2, 100_000))
	r.answer(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],`+
			`"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":0}}}`)
	})
	if _, err := r.client().Chat.Completions.New(callCtx("a", limiter.Default), params()); err != nil {
		t.Fatal(err)
	}
	if got := r.remaining(); got != 100_000-42 {
		t.Fatalf("remaining %d, want %d: settled at the answer's 42 tokens", got, 100_000-42)
	}
	tk := r.snapshot().Tokens
	if tk.Used1m != (limiter.TokenCounts{Prompt: 12, Completion: 30}) || tk.Inflight != 0 {
		t.Fatalf("tokens %+v, want 12 prompt and 30 completion used, none in flight", tk)
	}
}

// A stream with usage (OpenAI's include_usage) settles by it, wherever the
// reads split the body.
func TestSettleFromStreamUsage(t *testing.T) {
	r := newRig(t, budgeted(2, 100_000))
	r.answer(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, chunk := range []string{
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}],"usage":null}` + "\n\n",
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"us`, `age":{"prompt_tokens":7,"comp`, `letion_tokens":5,"total_tokens":12}}` + "\n\n",
			"data: [DONE]\n\n",
		} {
			fmt.Fprint(w, chunk)
			f.Flush()
		}
	})
	s := r.client().Chat.Completions.NewStreaming(callCtx("a", limiter.Default), params())
	if _, err := streamText(s); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if got := r.remaining(); got != 100_000-12 {
		t.Fatalf("remaining %d, want %d", got, 100_000-12)
	}
}

// A stream cut mid-way is settled by what was streamed: the estimated
// prompt, and a token an event.
func TestSettleCutStream(t *testing.T) {
	r := newRig(t, budgeted(2, 100_000))
	r.answer(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range 5 {
			fmt.Fprint(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"}}]}`+"\n\n")
			f.Flush()
		}
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close() // cut, with no end of the chunked body
	})
	p := params()
	p.MaxTokens = openai.Int(500)
	s := r.client().Chat.Completions.NewStreaming(callCtx("a", limiter.Default), p)
	if _, err := streamText(s); err == nil {
		t.Fatal("the cut stream read to its end without an error")
	}
	s.Close()
	// The body the client sent: its estimate's prompt.
	est := lanehttp.EstimateTokens([]byte(`{"messages":[{"content":"hi","role":"user"}],"model":"protolabs/smart","max_tokens":500}`), 1024)
	if want := 100_000 - (est.Prompt + 5); r.remaining() != want {
		t.Fatalf("remaining %d, want %d (the prompt's %d and 5 events)", r.remaining(), want, est.Prompt)
	}
}

// A 429 costs nothing and holds the lane for its Retry-After; the
// provider's headers bound the next grants.
func TestProviderHeaders(t *testing.T) {
	r := newRig(t, on(4))
	var calls atomic.Int32
	r.answer(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("retry-after-ms", "2500")
			w.Header().Set("Retry-After", "3")
			w.Header().Set("x-ratelimit-reset-requests", "2.5s") // a rate limit's, not a concurrency refusal
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`)
			return
		}
		w.Header().Set("x-ratelimit-limit-tokens", "10000")
		w.Header().Set("x-ratelimit-remaining-tokens", "1500")
		w.Header().Set("x-ratelimit-reset-tokens", "6m0s")
		writeCompletion(w, "m", "hi")
	})
	_, err := r.client().Chat.Completions.New(callCtx("a", limiter.Default), params())
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Fatalf("first call: %v, want the gateway's 429", err)
	}
	tk := r.snapshot().Tokens
	if tk == nil || tk.Provider == nil || tk.Provider.RetryAfter != 2.5 || tk.Used1m != (limiter.TokenCounts{}) {
		t.Fatalf("after the 429: %+v, want a 2.5 s hold (retry-after-ms) and nothing used", tk)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.client().Chat.Completions.New(callCtx("b", limiter.Default), params())
		done <- err
	}()
	r.waitEnqueued("b")
	r.clock.Advance(2500 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p := r.snapshot().Tokens.Provider
	// The reset of 6 minutes is taken as the provider's window, 60 s (the
	// default of limiter.Config.ProviderWindow).
	if p.Tokens == nil || p.Tokens.Limit != 10000 || p.Tokens.Remaining != 1500 || p.Tokens.Reset != 60 {
		t.Fatalf("provider tokens %+v, want 1,500 of 10,000, reset in 60 s (6 min capped at the window)", p.Tokens)
	}
	// 1,500 remain: a call estimated at more than that waits.
	big := params()
	big.MaxTokens = openai.Int(1600)
	go func() {
		_, err := r.client().Chat.Completions.New(callCtx("c", limiter.Default), big)
		done <- err
	}()
	r.waitEnqueued("c")
	if w := r.snapshot().Tokens.WaitingFor["default"]; w != limiter.WaitProvider {
		t.Fatalf("c waits for %q, want %q", w, limiter.WaitProvider)
	}
	// 8,500 tokens refill in 60 s: the ~110 missing in under 5 s.
	r.clock.Advance(5 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A call larger than the lane's whole budget is answered 413 at once,
// naming the budget, and never reaches the gateway.
func TestTokenBudgetRefused(t *testing.T) {
	r := newRig(t, budgeted(2, 1000))
	p := params()
	p.MaxTokens = openai.Int(5000)
	_, err := r.client().Chat.Completions.New(callCtx("a", limiter.Default), p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusRequestEntityTooLarge || apiErr.Code != lanehttp.TokenBudgetCode ||
		!strings.Contains(apiErr.Message, "tokens_per_minute (1000)") {
		t.Fatalf("err %v, want a 413 %s naming tokens_per_minute", err, lanehttp.TokenBudgetCode)
	}
	if n := len(r.gw.seen()); n != 0 {
		t.Fatalf("the gateway saw %d calls, want none", n)
	}
}

func TestRateLimitsHeaders(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("anthropic-ratelimit-tokens-limit", "80000")
	h.Set("anthropic-ratelimit-tokens-remaining", "20000")
	h.Set("anthropic-ratelimit-tokens-reset", now.Add(45*time.Second).Format(time.RFC3339))
	h.Set("anthropic-ratelimit-requests-remaining", "49")
	h.Set("Retry-After", "7")
	pl, ok := lanehttp.RateLimits(h, 429, now)
	want := limiter.ProviderLimits{
		Tokens:     limiter.ProviderBudget{Known: true, Limit: 80000, Remaining: 20000, Reset: 45 * time.Second},
		Requests:   limiter.ProviderBudget{Known: true, Remaining: 49, Reset: time.Second},
		RetryAfter: 7 * time.Second,
	}
	if !ok || pl != want {
		t.Fatalf("%+v, want %+v", pl, want)
	}
	h.Set("Retry-After", now.Add(20*time.Second).Format(http.TimeFormat))
	if pl, _ := lanehttp.RateLimits(h, 429, now); pl.RetryAfter != 20*time.Second {
		t.Fatalf("Retry-After as a date: %v, want 20s", pl.RetryAfter)
	}
	if pl, _ := lanehttp.RateLimits(h, 503, now); pl.RetryAfter != 0 {
		t.Fatalf("a 503's Retry-After: %v, want no hold (a 429's only)", pl.RetryAfter)
	}
	if _, ok := lanehttp.RateLimits(http.Header{"X-Ratelimit-Remaining-Tokens": {"lots"}}, 200, now); ok {
		t.Fatal("a remaining count that is no number said something")
	}
}

// FuzzEstimateTokens: any body ModelOf accepts is estimated without a
// panic, at no fewer tokens than it has strings of prompt, and with the
// output bound encoding/json reads.
func FuzzEstimateTokens(f *testing.F) {
	for _, c := range modelCases {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"ab\"c\\"}],"max_tokens":7,"n":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, err := lanehttp.ModelOf(body); err != nil {
			return
		}
		e := lanehttp.EstimateTokens(body, 1024)
		if e.Prompt < 0 || e.Output < 0 {
			t.Fatalf("EstimateTokens(%q) = %+v", body, e)
		}
		// The reference reads the keys exactly, as the gateways do: a
		// struct would match "mAX_tokens" too (encoding/json folds case).
		// A key given twice: the last, in both.
		var v map[string]any
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		if d.Decode(&v) != nil {
			return
		}
		num := func(k string) (json.Number, bool) { x, ok := v[k].(json.Number); return x, ok }
		bound, n := int64(1024), int64(1)
		for _, k := range []string{"max_output_tokens", "max_tokens", "max_completion_tokens"} {
			if f, ok := num(k); ok {
				if x, err := f.Int64(); err == nil && x >= 0 {
					bound = x
				} else if digits(f.String()) {
					bound = math.MaxInt64 // an integer past int64: saturated, not ignored
				}
			}
		}
		if f, ok := num("n"); ok {
			if x, err := f.Int64(); err == nil && x >= 1 {
				n = min(x, 128)
			}
		}
		want := int64(math.MaxInt64)
		if bound <= math.MaxInt64/n {
			want = bound * n
		}
		if e.Output != want {
			t.Fatalf("EstimateTokens(%q).Output = %d, want %d x %d, saturated", body, e.Output, bound, n)
		}
		if e.Total() < e.Output || e.Total() < e.Prompt {
			t.Fatalf("EstimateTokens(%q).Total() = %d: overflowed", body, e.Total())
		}
	})
}

// digits reports whether s is a non-empty run of decimal digits.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}
