// Package gatewaysim is a simulated OpenAI-compatible LLM gateway on
// loopback, for the lanes-exporter demo, the incident replay and tests.
//
// It answers POST .../chat/completions (streamed or not) with generated
// tokens, and POST .../messages as Anthropic's Messages API does: its
// server-sent events, usage as input_tokens and output_tokens, errors as
// {"type": "error", ...}, and with TokensPerMinute the
// anthropic-ratelimit-tokens-* headers and a 429 with retry-after. Its capacity is shared among the requests in progress like a
// processor: up to Capacity requests each get a token every TokenTime; past
// that, every request slows down in proportion (processor sharing), so
// latency grows with load as a real gateway's does. Faults can be switched
// on at any time: a share of 429s, of 5xx, of stalls (headers then
// silence) and of connection resets mid-stream.
//
// A client that disconnects is noticed at once when PropagateDisconnect is
// set; otherwise the gateway goes on generating the abandoned answer to the
// end, as a gateway that does not propagate disconnects does, and counts
// that work as wasted.
package gatewaysim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config sets the gateway's behaviour. It can be changed while it runs with
// SetConfig.
type Config struct {
	// Capacity is how many requests proceed at full speed at once (at least 1).
	Capacity int `json:"capacity"`
	// TokenTime is the time per token at full speed.
	TokenTime time.Duration `json:"token_time"`
	// Tokens is the length of an answer, in tokens.
	Tokens int `json:"tokens"`
	// FirstTokenDelay is added before the first token (prompt processing),
	// and PromptTime more per KiB of request body: a long prompt takes
	// longer to its first token even on an idle gateway.
	FirstTokenDelay time.Duration `json:"first_token_delay"`
	PromptTime      time.Duration `json:"prompt_time"`
	// Jitter adds to each request's first token a delay that does not
	// depend on the load: uniform in [0, Jitter), or, with Bimodal, 0 or
	// Jitter, equally likely. Real gateways jitter whatever their load.
	Jitter  time.Duration `json:"jitter"`
	Bimodal bool          `json:"bimodal"`
	// Faults, as shares of requests from 0 to 1.
	RateLimited float64 `json:"rate_limited"`
	ServerError float64 `json:"server_error"`
	Stall       float64 `json:"stall"`
	Reset       float64 `json:"reset"`
	// PropagateDisconnect makes an abandoned request stop at once; without
	// it the gateway finishes the work and counts it as wasted.
	PropagateDisconnect bool `json:"propagate_disconnect"`
	// RejectAbove, when above 0, answers 429 at once to a request that
	// arrives with this many in progress: a gateway's parallel-request
	// limit (LiteLLM-style), the alternative the ADR rejects.
	RejectAbove int `json:"reject_above"`
	// TokensPerMinute, when above 0, limits the tokens the gateway serves
	// a minute as OpenAI does (see TokenLimit): a request that does not
	// fit is answered 429 with Retry-After, and every answer carries
	// x-ratelimit-*-tokens headers.
	TokensPerMinute int64 `json:"tokens_per_minute"`
	// LiteLLM, when set, puts a LiteLLM-like proxy in front of the
	// backend (see LiteLLM).
	LiteLLM *LiteLLM `json:"litellm,omitempty"`
	// Seed makes the fault draws repeatable (0: random).
	Seed uint64 `json:"seed"`
}

// DefaultConfig is a gateway of capacity 8 answering 20 tokens of 20 ms.
func DefaultConfig() Config {
	return Config{Capacity: 8, TokenTime: 20 * time.Millisecond, Tokens: 20, FirstTokenDelay: 50 * time.Millisecond}
}

// TokenDelay is the time a token takes with active requests in progress:
// TokenTime up to Capacity of them, and in proportion past it (processor
// sharing). Each token's time is set when it starts.
func (c *Config) TokenDelay(active int) time.Duration {
	return time.Duration(float64(c.TokenTime) * max(1, float64(active)/float64(max(1, c.Capacity))))
}

// FirstTokenAfter is the wait before the first token of a request of
// bodyBytes, at no load: FirstTokenDelay plus PromptTime per KiB.
func (c *Config) FirstTokenAfter(bodyBytes int) time.Duration {
	return c.FirstTokenDelay + time.Duration(float64(c.PromptTime)*float64(bodyBytes)/1024)
}

// JitterOf returns the jitter of a request's first token for a draw x
// uniform in [0, 1) (see Config.Jitter).
func (c *Config) JitterOf(x float64) time.Duration {
	switch {
	case c.Jitter <= 0:
		return 0
	case c.Bimodal:
		if x < 0.5 {
			return 0
		}
		return c.Jitter
	}
	return time.Duration(x * float64(c.Jitter))
}

// Stats are the gateway's counters since it started.
type Stats struct {
	Active          int   `json:"active"`           // requests in progress
	Peak            int   `json:"peak"`             // most requests in progress at once
	Received        int64 `json:"received"`         // requests received
	Completed       int64 `json:"completed"`        // answers delivered to the end
	Abandoned       int64 `json:"abandoned"`        // clients gone before the end
	RateLimited     int64 `json:"rate_limited"`     // 429s sent
	ServerErrors    int64 `json:"server_errors"`    // 5xx sent
	Stalls          int64 `json:"stalls"`           // stalls started
	Resets          int64 `json:"resets"`           // connections reset
	TokensGenerated int64 `json:"tokens_generated"` // all work done
	TokensWasted    int64 `json:"tokens_wasted"`    // work done for clients already gone
	RetriesSeen     int64 `json:"retries_seen"`     // requests with X-Stainless-Retry-Count above 0
	TokenLimited    int64 `json:"token_limited"`    // 429s past TokensPerMinute (counted in RateLimited too)
	TokensUsed      int64 `json:"tokens_used"`      // prompt and completion tokens served under TokensPerMinute
	// ConcurrencyRefused counts the LiteLLM proxy's max_parallel_requests
	// 429s (counted in RateLimited too).
	ConcurrencyRefused int64 `json:"concurrency_refused"`
}

// Gateway is the simulated gateway; it is an http.Handler.
type Gateway struct {
	cfg  atomic.Pointer[Config]
	mu   sync.Mutex
	rng  *rand.Rand
	st   Stats
	stop chan struct{}
	once sync.Once
	now  func() time.Time // the clock of TokensPerMinute
	tpm  *TokenLimit      // with TokensPerMinute, guarded by mu
	lite liteState        // the LiteLLM proxy's counters (Config.LiteLLM)
}

// SetClock makes the gateway's tokens-per-minute bucket read time from
// now instead of the system clock (for a test on a fake clock); a bucket
// in use starts again, full, at now().
func (g *Gateway) SetClock(now func() time.Time) {
	g.mu.Lock()
	g.now = now
	if g.tpm != nil {
		g.tpm = NewTokenLimit(g.tpm.PerMinute, now())
	}
	g.mu.Unlock()
}

// New returns a gateway with configuration c.
func New(c Config) *Gateway {
	g := &Gateway{stop: make(chan struct{}), now: time.Now}
	g.SetConfig(c)
	return g
}

// SetConfig changes the gateway's behaviour for requests from now on.
func (g *Gateway) SetConfig(c Config) {
	c.Capacity = max(1, c.Capacity)
	c.Tokens = max(1, c.Tokens)
	g.mu.Lock()
	seed := c.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	g.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	switch {
	case c.TokensPerMinute <= 0:
		g.tpm = nil
	case g.tpm == nil || g.tpm.PerMinute != c.TokensPerMinute:
		g.tpm = NewTokenLimit(c.TokensPerMinute, g.now())
	}
	g.mu.Unlock()
	g.cfg.Store(&c)
}

// Config returns the configuration in force.
func (g *Gateway) Config() Config { return *g.cfg.Load() }

// Stats returns the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st
}

// Close makes every request in progress end at once (for shutdown).
func (g *Gateway) Close() { g.once.Do(func() { close(g.stop) }) }

func (g *Gateway) count(f func(*Stats)) {
	g.mu.Lock()
	f(&g.st)
	g.mu.Unlock()
}

// draw picks a fault for a request, or "" for none.
func (g *Gateway) draw(c *Config) string {
	g.mu.Lock()
	x := g.rng.Float64()
	g.mu.Unlock()
	for _, f := range []struct {
		p    float64
		name string
	}{{c.RateLimited, "429"}, {c.ServerError, "5xx"}, {c.Stall, "stall"}, {c.Reset, "reset"}} {
		if x < f.p {
			return f.name
		}
		x -= f.p
	}
	return ""
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	anthropic := strings.HasSuffix(path, "/messages")
	if r.Method != http.MethodPost || !anthropic && !strings.HasSuffix(path, "/chat/completions") {
		http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error","code":"not_found"}}`, http.StatusNotFound)
		return
	}
	var req request
	body, _ := io.ReadAll(r.Body)
	if json.Unmarshal(body, &req) != nil || req.Model == "" {
		http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error","code":"invalid_json"}}`, http.StatusBadRequest)
		return
	}
	req.anthropic = anthropic
	c := g.cfg.Load()
	g.count(func(s *Stats) {
		s.Received++
		if v := r.Header.Get("X-Stainless-Retry-Count"); v != "" && v != "0" {
			s.RetriesSeen++
		}
	})
	if c.RejectAbove > 0 {
		g.mu.Lock()
		full := g.st.Active >= c.RejectAbove
		g.mu.Unlock()
		if full {
			g.count(func(s *Stats) { s.RateLimited++ })
			req.writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "parallel request limit reached")
			return
		}
	}
	var liteCharge func(int64)
	if c.LiteLLM != nil {
		var ok bool
		if ok, liteCharge = g.liteAdmit(w, r, c.LiteLLM, g.now()); !ok {
			return
		}
	}
	fault := g.draw(c)
	switch fault {
	case "429":
		g.count(func(s *Stats) { s.RateLimited++ })
		req.writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "simulated rate limit")
		return
	case "5xx":
		g.count(func(s *Stats) { s.ServerErrors++ })
		req.writeError(w, http.StatusBadGateway, "upstream_error", "simulated upstream failure")
		return
	case "stall":
		g.count(func(s *Stats) { s.Stalls++ })
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-g.stop:
		}
		return
	case "reset":
		g.count(func(s *Stats) { s.Resets++ })
	}
	var charged int64
	if c.TokensPerMinute > 0 {
		var ok bool
		if charged, ok = g.takeTokens(w, &req, c); !ok {
			return
		}
	}
	used := g.generate(w, r, &req, len(body), c, fault == "reset", charged)
	if liteCharge != nil {
		liteCharge(used)
	}
}

// takeTokens reserves the request's prompt and output bound under the
// tokens-per-minute limit, and writes the rate-limit headers; past the
// limit it answers 429 with Retry-After itself and returns ok false.
func (g *Gateway) takeTokens(w http.ResponseWriter, req *request, c *Config) (charged int64, ok bool) {
	cost := req.PromptTokens() + req.bound(int64(c.Tokens))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tpm == nil {
		return 0, true // turned off meanwhile
	}
	now := g.now()
	ok, after := g.tpm.Take(cost, now)
	if req.anthropic {
		g.tpm.SetAnthropicHeaders(w.Header(), now)
	} else {
		g.tpm.SetHeaders(w.Header(), now)
	}
	if !ok {
		g.st.RateLimited++
		g.st.TokenLimited++
		if !req.anthropic { // Anthropic sends retry-after alone
			w.Header().Set("retry-after-ms", strconv.FormatInt(max(1, after.Milliseconds()), 10))
		}
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(after.Seconds()))), 10))
		req.writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", fmt.Sprintf("Rate limit reached for tokens per min (TPM): Limit %d, Requested %d", c.TokensPerMinute, cost))
		return 0, false
	}
	return cost, true
}

// settleTokens gives back what a request reserved beyond the prompt and
// the tokens it was sent.
func (g *Gateway) settleTokens(charged, prompt, sent int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.st.TokensUsed += prompt + sent
	if g.tpm != nil {
		g.tpm.Refund(charged-prompt-sent, g.now())
	}
}

// writeError answers an error as the request's API does: OpenAI's
// {"error": {...}}, or Anthropic's {"type": "error", "error": {"type", "message"}}.
func (r *request) writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if r.anthropic {
		kind := "api_error"
		if status == http.StatusTooManyRequests {
			kind = "rate_limit_error"
		}
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%q}}`, kind, msg)
		return
	}
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"server_error","code":%q,"param":null}}`, msg, code)
}

// generate produces an answer token by token, sharing the capacity with the
// other requests in progress. With reset it breaks the connection halfway.
//
// With a tokens-per-minute limit, charged is what the request reserved:
// what it did not use is given back when it ends. It writes at most its
// output bound, and the usage (prompt_tokens from PromptTokens) in a whole
// answer, or in a stream's last chunk when stream_options.include_usage
// asks for it.
//
// It returns the tokens the call used: its prompt and what was generated.
func (g *Gateway) generate(w http.ResponseWriter, r *http.Request, req *request, bodyBytes int, c *Config, reset bool, charged int64) (used int64) {
	model, stream := req.Model, req.Stream
	prompt, answer := req.PromptTokens(), min(int64(c.Tokens), req.bound(int64(c.Tokens)))
	var sent int64
	defer func() { used = prompt + sent }()
	settled := charged == 0
	settle := func() { // before the answer's end reaches the client, which may send again at once
		if !settled {
			settled = true
			g.settleTokens(charged, prompt, sent)
		}
	}
	defer settle()
	g.count(func(s *Stats) {
		s.Active++
		s.Peak = max(s.Peak, s.Active)
	})
	defer g.count(func(s *Stats) { s.Active-- })
	gone := false
	wait := func(d time.Duration) bool { // false when the gateway stops, or the client left and that propagates
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-g.stop:
			return false
		case <-r.Context().Done():
			if !gone {
				gone = true
				g.count(func(s *Stats) { s.Abandoned++ })
			}
			if c.PropagateDisconnect {
				return false
			}
			select { // keep working for nobody
			case <-t.C:
				return true
			case <-g.stop:
				return false
			}
		}
	}
	slow := func() time.Duration {
		g.mu.Lock()
		active := g.st.Active
		g.mu.Unlock()
		return c.TokenDelay(active)
	}
	if stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	event := func(name, data string) { // an Anthropic stream's event
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		w.(http.Flusher).Flush()
	}
	jitter := time.Duration(0)
	if c.Jitter > 0 {
		g.mu.Lock()
		jitter = c.JitterOf(g.rng.Float64())
		g.mu.Unlock()
	}
	if !wait(c.FirstTokenAfter(bodyBytes) + jitter + slow()) {
		return
	}
	if stream && req.anthropic {
		event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_sim","type":"message","role":"assistant","model":%q,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":1}}}`, model, prompt))
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	}
	var text strings.Builder
	for i := 0; i < int(answer); i++ {
		if i > 0 && !wait(slow()) {
			return
		}
		tok := fmt.Sprintf("tok%d ", i)
		text.WriteString(tok)
		sent++
		g.count(func(s *Stats) {
			s.TokensGenerated++
			if gone {
				s.TokensWasted++
			}
		})
		if reset && i == int(answer)/2 {
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
				}
			}
			return
		}
		switch {
		case stream && !gone && req.anthropic:
			event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, tok))
		case stream && !gone:
			fmt.Fprintf(w, "data: {\"id\":\"sim\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", model, tok)
			w.(http.Flusher).Flush()
		}
	}
	if gone {
		return
	}
	settle()
	switch {
	case stream && req.anthropic:
		event("content_block_stop", `{"type":"content_block_stop","index":0}`)
		event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, sent))
		event("message_stop", `{"type":"message_stop"}`)
	case req.anthropic:
		fmt.Fprintf(w, `{"id":"msg_sim","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":%d}}`,
			model, strings.TrimSpace(text.String()), prompt, sent)
	case stream:
		fmt.Fprintf(w, "data: {\"id\":\"sim\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", model)
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"id\":\"sim\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", model, prompt, sent, prompt+sent)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
	default:
		fmt.Fprintf(w, `{"id":"sim","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			model, strings.TrimSpace(text.String()), prompt, sent, prompt+sent)
	}
	g.count(func(s *Stats) { s.Completed++ })
	return
}
