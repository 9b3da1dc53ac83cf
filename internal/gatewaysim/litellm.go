package gatewaysim

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// LiteLLM makes the gateway answer as a LiteLLM proxy (1.7x) in front of
// its backend does, as LiteLLM's docs and source (its parallel-request
// limiter hook, proxy/hooks/parallel_request_limiter*.py) describe it:
//
//   - max_parallel_requests: a call that arrives while MaxParallel calls
//     are in progress at the proxy is answered 429 at once, with
//     retry-after the fractional seconds to the next minute
//     ("49.934439") and the body
//     {"error":{"message":"Max parallel request limit reached Hit Global
//     Limit: Limit=4, current: 4","type":"None","param":"None","code":"429"}};
//   - a client that disconnects leaves the proxy's count at once, while
//     the backend goes on with the call (Config.PropagateDisconnect is
//     false for it): LiteLLM does not cancel the backend's work;
//   - rpm and tpm: every answer carries x-ratelimit-limit-requests,
//     x-ratelimit-remaining-requests, x-ratelimit-limit-tokens and
//     x-ratelimit-remaining-tokens, and no reset header; the counts are
//     per calendar minute, tokens counted as the calls used them (not as
//     estimated), so a call larger than TPM is served while the minute
//     has room; past a limit a call is answered 429 with remaining -1.
//
// It is a model, not LiteLLM: what it does not name, it does not do.
type LiteLLM struct {
	MaxParallel int   `json:"max_parallel_requests"`
	RPM         int64 `json:"rpm"`
	TPM         int64 `json:"tpm"`
}

// liteState is the LiteLLM proxy's counters; guarded by its mu.
type liteState struct {
	mu       sync.Mutex
	inflight int       // calls in progress at the proxy
	minute   time.Time // the calendar minute of the counts
	requests int64
	tokens   int64
}

// liteAdmit runs the LiteLLM proxy's checks for a call arriving at now. It
// returns false after answering it 429, or a release that drops the call
// from the proxy's count (at the call's end or its client's leaving,
// whichever is first) and a charge that counts the tokens it used.
func (g *Gateway) liteAdmit(w http.ResponseWriter, r *http.Request, c *LiteLLM, now time.Time) (ok bool, charge func(int64)) {
	s := &g.lite
	s.mu.Lock()
	if m := now.Truncate(time.Minute); !m.Equal(s.minute) {
		s.minute, s.requests, s.tokens = m, 0, 0
	}
	toNext := s.minute.Add(time.Minute).Sub(now).Seconds()
	refuse := func(msg string) {
		s.mu.Unlock()
		g.count(func(st *Stats) { st.RateLimited++ })
		w.Header().Set("retry-after", strconv.FormatFloat(toNext, 'f', 6, 64))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"None","param":"None","code":"429"}}`, msg)
	}
	switch {
	case c.MaxParallel > 0 && s.inflight >= c.MaxParallel:
		g.count(func(st *Stats) { st.ConcurrencyRefused++ })
		refuse(fmt.Sprintf("Max parallel request limit reached Hit Global Limit: Limit=%d, current: %d", c.MaxParallel, s.inflight))
		return false, nil
	case c.RPM > 0 && s.requests >= c.RPM, c.TPM > 0 && s.tokens >= c.TPM:
		s.setHeaders(w.Header(), c, -1)
		refuse(fmt.Sprintf("Rate limit exceeded. rpm_limit: %d, current rpm: %d; tpm_limit: %d, current tpm: %d", c.RPM, s.requests, c.TPM, s.tokens))
		return false, nil
	}
	s.inflight++
	s.requests++
	s.setHeaders(w.Header(), c, 0)
	s.mu.Unlock()
	var once sync.Once
	context.AfterFunc(r.Context(), func() { // the client left, or the call ended
		once.Do(func() {
			s.mu.Lock()
			s.inflight--
			s.mu.Unlock()
		})
	})
	return true, func(used int64) {
		s.mu.Lock()
		s.tokens += used
		s.mu.Unlock()
	}
}

// setHeaders writes the rate-limit headers LiteLLM sends for its rpm and
// tpm, with remaining -1 past a limit (over set); s.mu is held.
func (s *liteState) setHeaders(h http.Header, c *LiteLLM, over int64) {
	if c.RPM > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(c.RPM, 10))
		rem := max(c.RPM-s.requests, 0)
		if over < 0 {
			rem = -1
		}
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(rem, 10))
	}
	if c.TPM > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(c.TPM, 10))
		rem := c.TPM - s.tokens
		if over < 0 {
			rem = -1
		}
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(max(rem, -1), 10))
	}
}
