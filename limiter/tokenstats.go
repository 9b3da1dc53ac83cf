package limiter

// TokenSnapshot is a lane's token accounting, in the snapshot's "tokens":
// set once a call of the lane carried an estimate, a budget was set, or
// the provider's headers said something.
type TokenSnapshot struct {
	// TokensPerMinute and MaxInflightTokens are the budgets in force (0:
	// none).
	TokensPerMinute   int64 `json:"tokens_per_minute"`
	MaxInflightTokens int64 `json:"max_inflight_tokens"`
	// Inflight is what the calls holding slots were estimated at.
	Inflight int64 `json:"inflight"`
	// Remaining is the room left now: the tokens_per_minute budget's, or
	// else what the provider's headers say remains; null with neither.
	Remaining *int64 `json:"remaining"`
	// Used1m and Used5m count the tokens of the calls settled in the last
	// minute and 5 minutes (at least 60 s and 300 s, at most 10 s more:
	// the statistics' steps).
	Used1m TokenCounts `json:"used_1m"`
	Used5m TokenCounts `json:"used_5m"`
	// EstimateError5m is how far the settled calls of the last 5 minutes
	// used more (above 0) or less than they were estimated at, as a
	// fraction of the estimates; null with none.
	EstimateError5m *float64 `json:"estimate_error_5m"`
	// Provider is what its rate-limit headers last said; nil if never.
	Provider *ProviderSnapshot `json:"provider,omitempty"`
	// WaitingFor says, for each class with calls queued, what they wait
	// for: WaitSlot, WaitTokens, WaitProvider or WaitRetryAfter.
	WaitingFor map[string]string `json:"waiting_for,omitempty"`
}

// TokenCounts counts tokens by kind.
type TokenCounts struct {
	Prompt     int64 `json:"prompt"`
	Completion int64 `json:"completion"`
}

// ProviderSnapshot is what the provider's rate-limit headers last said.
type ProviderSnapshot struct {
	// Age is how long ago they said it.
	Age Seconds `json:"age_s"`
	// Tokens and Requests are the budgets it announced, as they stand now
	// (nil when not announced or past their reset).
	Tokens   *ProviderBudgetSnapshot `json:"tokens"`
	Requests *ProviderBudgetSnapshot `json:"requests"`
	// RetryAfter is how much longer a 429's Retry-After holds the lane.
	RetryAfter Seconds `json:"retry_after_s"`
	// TokenLimit is the token limit the provider announced as its own,
	// while it refuses calls estimated above it; nil otherwise.
	TokenLimit *AnnouncedLimitSnapshot `json:"token_limit,omitempty"`
	// Concurrency is the gateway's last concurrency 429; nil if none
	// was heard.
	Concurrency *ConcurrencySnapshot `json:"concurrency,omitempty"`
}

// AnnouncedLimitSnapshot is a limit the provider announced, while it binds.
type AnnouncedLimitSnapshot struct {
	Limit int64 `json:"limit"`
	// Binds is how much longer it binds: one provider window after it was
	// last heard.
	Binds Seconds `json:"binds_s"`
}

// ConcurrencySnapshot is what the lane knows of a gateway's concurrency
// 429s (limiter.ProviderLimits.Concurrency): the gateway's own limit on
// calls at work is below the lane's.
type ConcurrencySnapshot struct {
	// InflightAt429 is how many calls the lane had in flight at the last
	// one, the refused call included: the gateway's limit is below it.
	InflightAt429 int `json:"inflight_at_429"`
	// Age is how long ago the last one was heard; Count how many were.
	Age   Seconds `json:"age_s"`
	Count int64   `json:"count"`
	// Hold is how much longer it holds the lane's grants at most (0: not
	// now); a call in flight that ends ends it.
	Hold Seconds `json:"hold_s"`
}

// ProviderBudgetSnapshot is one provider budget now.
type ProviderBudgetSnapshot struct {
	Limit     int64   `json:"limit"`
	Remaining int64   `json:"remaining"`
	Reset     Seconds `json:"reset_s"`
	// Binds is how much longer it binds the lane's grants: to its reset,
	// and past it until it has refilled to its limit.
	Binds Seconds `json:"binds_s"`
}
