package classify

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Version is the version of the JSON payload, its "version" key. It changes
// only when a key changes meaning or goes away; new keys may appear within
// a version.
const Version = 1

// State is a lane's classification.
type State string

const (
	Idle            State = "idle"             // no call in 5 minutes
	Healthy         State = "healthy"          // calls flow
	LocalQueue      State = "local_queue"      // the process queues on purpose
	GatewayDegraded State = "gateway_degraded" // the gateway is slow or failing
)

// States lists the states, for metrics.
func States() []State { return []State{Idle, Healthy, LocalQueue, GatewayDegraded} }

// Reasons, as they appear in Classification.Reasons.
const (
	ReasonSaturated      = "saturated"
	ReasonWaitP90        = "wait_p90"
	ReasonQueueTimeouts  = "queue_timeouts"
	ReasonUpstreamErrors = "upstream_errors"
	ReasonRetries        = "retries"
	// ReasonTokenBudget: calls are queued for tokens: the lane's
	// tokens_per_minute or max_inflight_tokens has no room for the next
	// one yet. A local reason: the lane queues on purpose, so that the
	// gateway answers no 429.
	ReasonTokenBudget = "token_budget"
	// ReasonProviderLimit: calls are queued because the provider said so:
	// the budget its rate-limit headers announced has no room for the next
	// one, or a 429's Retry-After holds the lane. A local reason too (the
	// lane queues on purpose rather than send calls into 429s), named
	// apart so that an operator looks at the provider's limit, not at
	// tokens_per_minute; the hold text says when it resets.
	ReasonProviderLimit = "provider_limit"
	// ReasonGatewayConcurrency: the gateway refused a call of the lane for
	// concurrency in the last 5 minutes (a 429 from its parallel-request
	// limit): its limit on calls at work is below the lane's, which should
	// come down to it. Local: the lane's calls wait for the gateway's room
	// on purpose (until a call in flight ends).
	ReasonGatewayConcurrency = "gateway_concurrency"
	// ReasonCallersGaveUp: calls left the queue in the last 5 minutes
	// because their callers gave up on them (they went away, or their
	// deadline came or was foreseen before a slot): waits at least as long
	// as the callers would bear. Local while calls are queued, or the lane
	// is full (callers whose deadlines all came at once leave no queue).
	ReasonCallersGaveUp = "callers_gave_up"
	// ReasonSharedDown: the lane is shared (in Redis) and its store is
	// unreachable, so this process uses lanes of its own or refuses calls.
	// It points at neither the queue nor the gateway: it is listed, and
	// the state is decided by the other reasons.
	ReasonSharedDown = "shared_store_down"
	// ReasonLimitCut: the lane's adaptive limit was cut by the gateway's
	// loss signals (429, 5xx, stalls) in the last 5 minutes: a gateway
	// reason.
	ReasonLimitCut = "limit_cut"
)

// Reasons lists every reason, local ones first, for metrics.
func Reasons() []string {
	return []string{ReasonSaturated, ReasonWaitP90, ReasonQueueTimeouts, ReasonCallersGaveUp, ReasonTokenBudget, ReasonProviderLimit, ReasonGatewayConcurrency, ReasonUpstreamErrors, ReasonRetries, ReasonLimitCut, ReasonSharedDown}
}

// IsGatewayReason reports whether reason r points at the gateway rather
// than at the local queue.
func IsGatewayReason(r string) bool {
	return r == ReasonUpstreamErrors || r == ReasonRetries || r == ReasonLimitCut
}

// Thresholds tune Lane. DefaultThresholds documents the defaults.
type Thresholds struct {
	// WaitP90: a wait p90 (last 5 minutes) above this is a local queue.
	WaitP90 time.Duration
	// UpstreamErrors and ErrorRatio: this many upstream errors (429, 5xx,
	// transport errors, stalls) in 5 minutes, making up at least this share
	// of the exchanges, mean a degraded gateway.
	UpstreamErrors int
	ErrorRatio     float64
	// Retries: this many SDK retries in 5 minutes mean a degraded gateway.
	Retries int
	// ClearAfter, when above 0, lets the gateway reasons hold only while
	// the latest upstream error is at most this old, so that a recovered
	// gateway reads as recovered within ClearAfter rather than when its
	// errors (and the retries that followed them) leave the 5-minute
	// window. 0, the default, is the ADR's rule: the window alone.
	ClearAfter time.Duration
}

// DefaultThresholds returns the defaults: p90 wait 30 s, 3 upstream errors
// making up 5% of the exchanges, 3 retries.
func DefaultThresholds() Thresholds {
	return Thresholds{WaitP90: 30 * time.Second, UpstreamErrors: 3, ErrorRatio: 0.05, Retries: 3}
}

// Validate reports thresholds out of range.
func (t Thresholds) Validate() error {
	switch {
	case t.WaitP90 <= 0:
		return fmt.Errorf("wait_p90 is %s: want more than 0", t.WaitP90)
	case t.UpstreamErrors < 1:
		return fmt.Errorf("upstream_errors is %d: want 1 or more", t.UpstreamErrors)
	case t.ErrorRatio < 0 || t.ErrorRatio > 1:
		return fmt.Errorf("error_ratio is %g: want 0 to 1", t.ErrorRatio)
	case t.Retries < 1:
		return fmt.Errorf("retries is %d: want 1 or more", t.Retries)
	case t.ClearAfter < 0:
		return fmt.Errorf("clear_after is %s: want 0 (off) or more", t.ClearAfter)
	}
	return nil
}

// Classification is one lane's state, with the figures behind it.
type Classification struct {
	Version  int    `json:"version"`
	Lane     string `json:"lane"`
	Upstream string `json:"upstream,omitempty"` // the configured upstream's name, when the lane calls one
	Model    string `json:"model"`
	Target   string `json:"target,omitempty"` // the lanes-exporter target it came from; "" for this process
	State    State  `json:"state"`
	// Reasons lists every reason that holds, local ones first; never null.
	Reasons        []string         `json:"reasons"`
	LaneQueueDepth int              `json:"lane_queue_depth"`
	LaneWaitP90S   *limiter.Seconds `json:"lane_wait_p90_s"`
	LaneSaturated  bool             `json:"lane_saturated"`
	// ETA estimates how long a new call of each class would wait now; its
	// entries are null when the lane has no recent hold times to go by
	// (or its snapshot, from another process, has no estimate).
	ETA    limiter.ETA `json:"eta_s"`
	Counts Counts      `json:"counts"`
	// BusiestTenant is the tenant with the most calls queued in the lane,
	// when the lane has seen named tenants and has calls queued; the hold
	// text names it. An extra key.
	BusiestTenant *TenantQueue `json:"busiest_tenant,omitempty"`
	HoldText      string       `json:"hold_text"`
}

// TenantQueue is one tenant's queue in a lane.
type TenantQueue struct {
	Tenant string `json:"tenant"`
	Queued int    `json:"queued"`
}

// Counts are the figures behind the reasons, for the last 5 minutes where
// the name says so.
type Counts struct {
	Inflight        int `json:"inflight"`
	Limit           int `json:"limit"`
	Queued          int `json:"queued"`
	QueueTimeouts5m int `json:"queue_timeouts_5m"`
	Exchanges5m     int `json:"exchanges_5m"`
	UpstreamErrors  int `json:"upstream_errors_5m"`
	RateLimited     int `json:"rate_limited_5m"`
	ServerErrors    int `json:"server_errors_5m"`
	TransportErrors int `json:"transport_errors_5m"`
	Stalls          int `json:"stalls_5m"`
	Retries         int `json:"retries_5m"`
	// ConcurrencyRefusals counts the gateway's concurrency 429s the lane
	// has heard (while the last is at most 5 minutes old), InflightAt429
	// its calls in flight at the last one.
	ConcurrencyRefusals int `json:"concurrency_refusals,omitempty"`
	InflightAt429       int `json:"inflight_at_429,omitempty"`
	// CallersGone and Deadlines count the waits of the last 5 minutes
	// whose callers went away, and those answered at (or foreseen past)
	// their callers' deadlines (limiter.LaneSnapshot.GaveUp5m).
	CallersGone int `json:"callers_gone_5m,omitempty"`
	Deadlines   int `json:"deadlines_5m,omitempty"`
}

// Lane classifies one lane from its snapshot.
func Lane(l limiter.LaneSnapshot, th Thresholds) Classification {
	_, model := limiter.SplitLaneKey(l.Lane)
	c := Classification{
		Version: Version, Lane: l.Lane, Model: model, State: Healthy, Reasons: []string{},
		LaneQueueDepth: l.Queued, LaneWaitP90S: l.WaitP90, LaneSaturated: l.Saturated,
		Counts: Counts{Inflight: l.Inflight, Limit: l.Limit, Queued: l.Queued, QueueTimeouts5m: l.QueueTimeouts5m},
	}
	if l.ETA != nil {
		c.ETA = *l.ETA
	}
	// The snapshot's tenants come busiest first; the summed "other" is
	// last and not one tenant.
	if len(l.Tenants) > 0 && l.Tenants[0].Queued > 0 && l.Tenants[0].Tenant != limiter.OtherTenant {
		c.BusiestTenant = &TenantQueue{Tenant: l.Tenants[0].Tenant, Queued: l.Tenants[0].Queued}
	}
	if u := l.Upstream; u != nil {
		c.Counts.Exchanges5m = u.OK + u.ClientErrors + u.RateLimited + u.ServerErrors + u.TransportErrors + u.Stalls + u.Canceled
		c.Counts.RateLimited, c.Counts.ServerErrors = u.RateLimited, u.ServerErrors
		c.Counts.TransportErrors, c.Counts.Stalls, c.Counts.Retries = u.TransportErrors, u.Stalls, u.Retries
		c.Counts.UpstreamErrors = u.RateLimited + u.ServerErrors + u.TransportErrors + u.Stalls
	}
	// The truth table of docs/DESIGN.md: the lane queues on purpose when it
	// is saturated or its p90 wait is over the threshold. Queue timeouts in
	// the window are listed, but count only while calls are queued now: a
	// timeout minutes ago on a lane that is free now must not hide a
	// gateway that fails every call.
	local, gateway := false, false
	if l.Saturated {
		c.Reasons, local = append(c.Reasons, ReasonSaturated), true
	}
	if l.WaitP90 != nil && l.WaitP90.Duration() > th.WaitP90 {
		c.Reasons, local = append(c.Reasons, ReasonWaitP90), true
	}
	if l.QueueTimeouts5m > 0 {
		c.Reasons = append(c.Reasons, ReasonQueueTimeouts)
		local = local || l.Queued > 0
	}
	if g := l.GaveUp5m; g != nil {
		c.Counts.CallersGone = g.CallerGone.Interactive + g.CallerGone.Default + g.CallerGone.Bulk
		c.Counts.Deadlines = g.Deadline.Interactive + g.Deadline.Default + g.Deadline.Bulk
		c.Reasons = append(c.Reasons, ReasonCallersGaveUp)
		local = local || l.Queued > 0 || l.Limit > 0 && l.Inflight >= l.Limit
	}
	budget, provider := waitsFor(l)
	if budget {
		c.Reasons, local = append(c.Reasons, ReasonTokenBudget), true
	}
	if provider {
		c.Reasons, local = append(c.Reasons, ReasonProviderLimit), true
	}
	if cr := concurrencyRefusal(l); cr != nil {
		c.Reasons = append(c.Reasons, ReasonGatewayConcurrency)
		c.Counts.ConcurrencyRefusals, c.Counts.InflightAt429 = int(cr.Count), cr.InflightAt429
		local = local || l.Queued > 0
	}
	n := c.Counts
	if !recent(l.Upstream, th.ClearAfter) {
		n.UpstreamErrors, n.Retries = 0, 0 // for the reasons only; Counts keeps the figures
	}
	if n.UpstreamErrors >= th.UpstreamErrors && float64(n.UpstreamErrors) >= th.ErrorRatio*float64(n.Exchanges5m) {
		c.Reasons, gateway = append(c.Reasons, ReasonUpstreamErrors), true
	}
	if n.Retries >= th.Retries {
		c.Reasons, gateway = append(c.Reasons, ReasonRetries), true
	}
	if l.Adaptive != nil && l.Adaptive.CutByLoss {
		c.Reasons, gateway = append(c.Reasons, ReasonLimitCut), true
	}
	if l.Shared != nil && l.Shared.State != limiter.BackendOK {
		c.Reasons = append(c.Reasons, ReasonSharedDown)
	}
	switch {
	case local: // the queue is what callers wait on, whatever the gateway does
		c.State = LocalQueue
	case gateway:
		c.State = GatewayDegraded
	case l.Inflight == 0 && l.Queued == 0 && l.WaitP50 == nil && l.Upstream == nil:
		c.State = Idle
	}
	c.HoldText = holdText(c, gateway, providerReset(l))
	if l.Shared != nil && l.Shared.State != limiter.BackendOK {
		c.HoldText += "; shared store unreachable: " + map[string]string{
			limiter.BackendLocalFallback: "this process uses lanes of its own",
			limiter.BackendUnavailable:   "calls are refused until it is back",
		}[l.Shared.State]
	}
	return c
}

// waitsFor reports whether calls of l are queued for the lane's token
// budget, and whether for the provider's word (its budget or a 429's hold).
func waitsFor(l limiter.LaneSnapshot) (budget, provider bool) {
	if l.Tokens == nil {
		return false, false
	}
	for _, w := range l.Tokens.WaitingFor {
		budget = budget || w == limiter.WaitTokens
		provider = provider || w == limiter.WaitProvider || w == limiter.WaitRetryAfter
	}
	return budget, provider
}

// concurrencyRefusal returns the gateway's last concurrency 429 to l, if
// it is at most 5 minutes old.
func concurrencyRefusal(l limiter.LaneSnapshot) *limiter.ConcurrencySnapshot {
	if l.Tokens == nil || l.Tokens.Provider == nil {
		return nil
	}
	c := l.Tokens.Provider.Concurrency
	if c == nil || c.Age.Duration() > 5*time.Minute {
		return nil
	}
	return c
}

// providerReset is how long until the provider's word stops holding l's
// calls, as far as its snapshot tells: the latest of a 429's hold and the
// resets of the budgets it announced (0: unknown).
func providerReset(l limiter.LaneSnapshot) float64 {
	if l.Tokens == nil || l.Tokens.Provider == nil {
		return 0
	}
	p := l.Tokens.Provider
	r := float64(p.RetryAfter)
	for _, b := range []*limiter.ProviderBudgetSnapshot{p.Tokens, p.Requests} {
		if b != nil {
			r = max(r, float64(b.Reset))
		}
	}
	return r
}

// recent reports whether the gateway reasons may hold under ClearAfter d:
// always when d is 0, else only if an upstream error is at most d old.
func recent(u *limiter.UpstreamCounts, d time.Duration) bool {
	if d == 0 {
		return true
	}
	return u != nil && u.LastErrorAge != nil && u.LastErrorAge.Duration() <= d
}

// IdleLane is the classification of a lane that has had no call: key
// names it, limit is the limit it would have.
func IdleLane(key string, limit int, th Thresholds) Classification {
	return Lane(limiter.LaneSnapshot{Lane: key, Limit: limit}, th)
}

func holdText(c Classification, gateway bool, reset float64) string {
	n := c.Counts
	switch c.State {
	case Idle:
		return "gate idle: no call in the last 5 min"
	case Healthy:
		return fmt.Sprintf("gate healthy: %d of %d slots in use, %d waiting", n.Inflight, n.Limit, c.LaneQueueDepth) + timeouts(n)
	}
	var failing []string
	for _, p := range []struct {
		n         int
		one, many string
	}{{n.RateLimited, "× 429", "× 429"}, {n.ServerErrors, "× 5xx", "× 5xx"}, {n.TransportErrors, "transport error", "transport errors"},
		{n.Stalls, "stall", "stalls"}, {n.Retries, "retry", "retries"}} {
		if p.n > 0 {
			failing = append(failing, fmt.Sprintf("%d %s", p.n, plural(p.n, p.one, p.many)))
		}
	}
	if c.State == GatewayDegraded {
		return fmt.Sprintf("gateway degraded: %s in 5 min", strings.Join(failing, ", ")) + timeouts(n)
	}
	from := ""
	if b := c.BusiestTenant; b != nil {
		from = fmt.Sprintf(" (%d from %s)", b.Queued, b.Tenant)
	}
	text := fmt.Sprintf("gate queue: %d %s waiting%s, p90 wait %s", c.LaneQueueDepth, plural(c.LaneQueueDepth, "call", "calls"), from, p90(c.LaneWaitP90S)) + timeouts(n)
	if slices.Contains(c.Reasons, ReasonTokenBudget) {
		text += "; waiting for the token budget to refill"
	}
	if slices.Contains(c.Reasons, ReasonProviderLimit) {
		text += "; waiting for the provider's rate limit"
		if reset > 0 {
			text += fmt.Sprintf(" (resets in %d s)", int(math.Ceil(reset)))
		}
	}
	if slices.Contains(c.Reasons, ReasonGatewayConcurrency) {
		text += fmt.Sprintf("; the gateway's concurrency limit is below the lane's (%d in flight at its 429)", n.InflightAt429)
	}
	if gateway {
		text += fmt.Sprintf("; gateway failing too: %s in 5 min", strings.Join(failing, ", "))
	}
	return text
}

// timeouts names the queue timeouts of the window, and the callers who gave
// up, if any, for a hold text.
func timeouts(n Counts) string {
	var s string
	if n.QueueTimeouts5m > 0 {
		s += fmt.Sprintf(", %d queue %s in 5 min", n.QueueTimeouts5m, plural(n.QueueTimeouts5m, "timeout", "timeouts"))
	}
	if n.CallersGone > 0 {
		s += fmt.Sprintf(", %d %s gave up waiting", n.CallersGone, plural(n.CallersGone, "caller", "callers"))
	}
	if n.Deadlines > 0 {
		s += fmt.Sprintf(", %d %s answered at their deadline", n.Deadlines, plural(n.Deadlines, "call", "calls"))
	}
	return s
}

func p90(s *limiter.Seconds) string {
	if s == nil {
		return "n/a"
	}
	return fmt.Sprintf("%d s", int(math.Round(float64(*s))))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
