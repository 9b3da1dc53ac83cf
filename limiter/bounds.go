package limiter

import (
	"log/slog"
	"time"
)

// Bounds on the numbers that come from outside the process: a call's
// max_tokens and n, the usage its answer reports, and the counts and
// resets of a provider's rate-limit headers. A client or a gateway can
// send any number; none of them may stop a lane for longer than a
// provider's window, whatever it says (docs/DESIGN.md, "Bounds on what
// callers and gateways say").

// MaxCallTokens is the most one call may be estimated at, and the most
// each of its usage counts may settle at: a billion tokens, a hundred times
// the largest context window offered today. A call estimated above it is
// refused at once (a *TokenBudgetError naming "max_call_tokens"), budget or
// none: no model could serve it, and an estimate that large, charged to a
// lane that follows the provider's headers, would stop the lane.
const MaxCallTokens int64 = 1_000_000_000

// DefaultProviderWindow is Config.ProviderWindow's default: the minute over
// which OpenAI's and Anthropic's token and request limits refill.
const DefaultProviderWindow = 60 * time.Second

// MaxProviderWindow is the largest Config.ProviderWindow.
const MaxProviderWindow = time.Hour

// providerWindow returns the window in force.
func (c *Config) providerWindow() time.Duration {
	if c.ProviderWindow == 0 {
		return DefaultProviderWindow
	}
	return c.ProviderWindow
}

// BoundProviderLimits returns pl with every number bounded for a lane
// whose provider refills its budgets over window (0: the default): a
// count at least 0 and at most 2^53 (exact in a float64, as Redis' Lua
// keeps numbers), a reset at most window, a Retry-After at most
// MaxRetryAfterHold. Limiter.RecordLimits applies it; a Backend receives
// pl bounded.
func BoundProviderLimits(pl ProviderLimits, window time.Duration) ProviderLimits {
	if window <= 0 {
		window = DefaultProviderWindow
	}
	window = min(window, MaxProviderWindow)
	pl.Tokens = pl.Tokens.bound(window)
	pl.Requests = pl.Requests.bound(window)
	pl.RetryAfter = min(max(pl.RetryAfter, 0), MaxRetryAfterHold)
	return pl
}

// maxCount is the largest count a provider's header may carry here.
const maxCount = 1 << 53

func (b ProviderBudget) bound(window time.Duration) ProviderBudget {
	if !b.Known {
		return ProviderBudget{}
	}
	b.Remaining = min(max(b.Remaining, 0), maxCount)
	b.Limit = min(max(b.Limit, 0), maxCount)
	if b.Limit < b.Remaining {
		b.Limit = 0 // not a limit of this count: unknown
	}
	b.Reset = min(max(b.Reset, 0), window)
	return b
}

// BoundUsage returns u with each count between 0 and MaxCallTokens, and the
// total at most ceiling when ceiling is above 0 (a lane's largest budget:
// no call can cost the lane more than a whole budget), and whether it
// changed anything. A usage that large is a gateway's error or a lie, and
// charging it would stop the lane for years.
func BoundUsage(u Usage, ceiling int64) (Usage, bool) {
	b := Usage{Prompt: min(max(u.Prompt, 0), MaxCallTokens), Completion: min(max(u.Completion, 0), MaxCallTokens)}
	if ceiling > 0 && b.Total() > ceiling {
		b.Prompt = min(b.Prompt, ceiling)
		b.Completion = ceiling - b.Prompt
	}
	return b, b != u
}

// usageCeiling returns the largest of cfg's budgets and the provider's last
// announced token limit (0: none), for BoundUsage.
func usageCeiling(cfg *Config, provLimit int64) int64 {
	return max(cfg.TokensPerMinute, cfg.MaxInflightTokens, provLimit)
}

// warnUsage logs, once per lane, that a usage was beyond what a call can
// cost and was bounded: the gateway misreports, or a client sends answers
// of its own.
func (l *lane) warnUsage(u, b Usage) {
	if l.usageWarned.Swap(true) {
		return
	}
	l.lim.log.Warn("limiter: a call's usage is beyond what one call can cost; it is counted bounded (logged once per lane)",
		slog.String("lane", l.key), slog.Int64("prompt", u.Prompt), slog.Int64("completion", u.Completion),
		slog.Int64("counted", b.Total()))
}
