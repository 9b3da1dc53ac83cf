package limiter

import (
	"math"
	"strconv"
	"time"
)

// Snapshot is the state of every lane of a limiter, in the D8 shape of
// DESIGN.md. Its JSON encoding is that shape, key for key; with the limiter
// off (the zero Snapshot) it is exactly {"enabled":false}. Limiter.Snapshot
// always sets GeneratedAt and a non-nil Lanes when on, so both keys are
// there, "lanes": [] included.
type Snapshot struct {
	Enabled     bool           `json:"enabled"`
	GeneratedAt time.Time      `json:"generated_at,omitzero"`
	Lanes       []LaneSnapshot `json:"lanes,omitzero"`
}

// LaneSnapshot is the state of one lane.
type LaneSnapshot struct {
	Lane             string           `json:"lane"`
	Limit            int              `json:"limit"`
	Reserve          int              `json:"reserve"` // the reserve in force, clamped
	Inflight         int              `json:"inflight"`
	Queued           int              `json:"queued"`
	QueuedByPriority QueuedByPriority `json:"queued_by_priority"`
	// OldestWait is how long the longest-waiting call has waited in this
	// acquisition; 0 with an empty queue.
	OldestWait Seconds `json:"oldest_wait_s"`
	// WaitP50 and WaitP90 are percentiles of the waits that ended in the
	// last 5 minutes, in a grant (an immediate grant counts as 0) or in a
	// queue timeout (its whole wait); nil when none did. A wait its caller
	// canceled is not a sample: its length was the caller's choice.
	WaitP50         *Seconds `json:"wait_p50_s_5m"`
	WaitP90         *Seconds `json:"wait_p90_s_5m"`
	QueueTimeouts5m int      `json:"queue_timeouts_5m"`
	// Saturated is true when the queue has been non-empty for 60 s or more
	// without a break.
	Saturated bool `json:"saturated"`
	// Upstream counts the lane's exchanges with the gateway in the last 5
	// minutes, as reported with RecordExchange; nil (and the key left out)
	// when there were none. It is an extra key beside the D8 ones.
	Upstream *UpstreamCounts `json:"upstream_5m,omitempty"`
	// ETA estimates how long a call of each class arriving now would wait
	// (see ETA). An extra key; Limiter.Snapshot always sets it.
	ETA *ETA `json:"eta_s,omitempty"`
	// Shared is set for a lane kept by a Backend (shared across
	// processes): then Inflight, Queued, QueuedByPriority, OldestWait and
	// Saturated are the lane's global figures, and Shared gives this
	// process's share and who holds the slots. An extra key.
	Shared *Shared `json:"shared,omitempty"`
	// ColdStart is true while the lane, made under Config.ColdStart, has
	// not heard from its gateway: Limit is 1 until it does. An extra key.
	ColdStart bool `json:"cold_start,omitempty"`
	// Tenants is the lane's share per tenant, busiest first (by queued,
	// then in flight): the first SnapshotTenantsShown, then the rest summed
	// as OtherTenant. nil (and the key left out) while the lane has seen
	// no named tenant. With a Backend, these are this process's calls.
	// An extra key.
	Tenants []TenantSnapshot `json:"tenants,omitempty"`
	// AllTenants is every tenant the lane tracks, sorted as Tenants, for
	// metrics: their series must not move between tenants as the top
	// ten changes. Not in the JSON.
	AllTenants []TenantSnapshot `json:"-"`
	// Tokens is the lane's token accounting (see Config.TokensPerMinute):
	// nil (and the key left out) until one of its calls carried an
	// estimate, a budget was set, or the provider's rate-limit headers
	// said something. An extra key.
	Tokens *TokenSnapshot `json:"tokens,omitempty"`
	// Adaptive is set for a lane with an adaptive limit: then Limit and
	// Reserve are the ones in force now. An extra key.
	Adaptive *AdaptiveState `json:"adaptive,omitempty"`
}

// Shared is the sharing of a lane kept by a Backend.
type Shared struct {
	// State is BackendOK, BackendLocalFallback or BackendUnavailable; with
	// either of the latter the global figures are this process's own.
	State string `json:"state"`
	// ProcessInflight and ProcessQueued are this process's share of the
	// lane: its calls holding a slot, and waiting by class. The lane's
	// metrics ({p}_llm_inflight, {p}_llm_queue_depth) report these, so
	// that summing them across processes gives the lane's figures.
	ProcessInflight int              `json:"process_inflight"`
	ProcessQueued   QueuedByPriority `json:"process_queued_by_priority"`
	// Holders counts the slots held, by process name; null when unknown.
	Holders map[string]int `json:"holders"`
	// FiguresAge is how old the global figures are: 0 when they were read
	// for this snapshot (or its scrape); more when the store did not answer
	// within SharedStateTimeout and the last figures read are shown.
	FiguresAge Seconds `json:"figures_age_s"`
}

// QueuedByPriority counts waiters by their own class.
type QueuedByPriority struct {
	Interactive int `json:"interactive"`
	Default     int `json:"default"`
	Bulk        int `json:"bulk"`
}

// Seconds is a time in seconds, rounded to 0.1 and encoded in JSON with one
// decimal (38.0, 212.4).
type Seconds float64

func seconds(s float64) Seconds { return Seconds(math.Round(s*10) / 10) }

// Duration returns s as a time.Duration.
func (s Seconds) Duration() time.Duration { return time.Duration(float64(s) * float64(time.Second)) }

// MarshalJSON encodes s with exactly one decimal.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(seconds(float64(s))), 'f', 1, 64), nil
}
