package telemetry

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// State is a lane's classification.
type State string

const (
	Healthy         State = "healthy"
	LocalQueue      State = "local_queue"      // the process queues on purpose
	GatewayDegraded State = "gateway_degraded" // the gateway is slow or failing
)

// States lists the states, for metrics.
func States() []State { return []State{Healthy, LocalQueue, GatewayDegraded} }

// Thresholds tune Classify. DefaultThresholds documents the defaults.
type Thresholds struct {
	// WaitP90: a wait p90 (last 5 minutes) above this is a local queue.
	WaitP90 time.Duration `json:"wait_p90"`
	// UpstreamErrors and ErrorRatio: this many upstream errors (429, 5xx,
	// transport errors, stalls) in 5 minutes, making up at least this share
	// of the exchanges, mean a degraded gateway.
	UpstreamErrors int     `json:"upstream_errors"`
	ErrorRatio     float64 `json:"error_ratio"`
	// Retries: this many SDK retries in 5 minutes mean a degraded gateway.
	Retries int `json:"retries"`
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
	}
	return nil
}

// Reasons, as they appear in Classification.Reasons.
const (
	ReasonSaturated      = "saturated"
	ReasonWaitP90        = "wait_p90"
	ReasonQueueTimeouts  = "queue_timeouts"
	ReasonUpstreamErrors = "upstream_errors"
	ReasonRetries        = "retries"
)

// Classification is one lane's state, for pr-reviewer's /queue and board
// holds.
type Classification struct {
	Lane           string           `json:"lane"`
	Target         string           `json:"target,omitempty"` // the lanes-exporter target it came from; "" for this process
	State          State            `json:"state"`
	Reasons        []string         `json:"reasons"`
	LaneQueueDepth int              `json:"lane_queue_depth"`
	LaneWaitP90S   *limiter.Seconds `json:"lane_wait_p90_s"`
	LaneSaturated  bool             `json:"lane_saturated"`
	Counts         Counts           `json:"counts"`
	HoldText       string           `json:"hold_text"`
}

// Counts are the figures behind the reasons.
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
}

// Classify classifies one lane from its snapshot.
func Classify(l limiter.LaneSnapshot, th Thresholds) Classification {
	c := Classification{
		Lane: l.Lane, State: Healthy, Reasons: []string{},
		LaneQueueDepth: l.Queued, LaneWaitP90S: l.WaitP90, LaneSaturated: l.Saturated,
		Counts: Counts{Inflight: l.Inflight, Limit: l.Limit, Queued: l.Queued, QueueTimeouts5m: l.QueueTimeouts5m},
	}
	if u := l.Upstream; u != nil {
		c.Counts.Exchanges5m = u.OK + u.ClientErrors + u.RateLimited + u.ServerErrors + u.TransportErrors + u.Stalls + u.Canceled
		c.Counts.RateLimited, c.Counts.ServerErrors = u.RateLimited, u.ServerErrors
		c.Counts.TransportErrors, c.Counts.Stalls, c.Counts.Retries = u.TransportErrors, u.Stalls, u.Retries
		c.Counts.UpstreamErrors = u.RateLimited + u.ServerErrors + u.TransportErrors + u.Stalls
	}
	local, gateway := false, false
	add := func(r string, isLocal bool) {
		c.Reasons = append(c.Reasons, r)
		local, gateway = local || isLocal, gateway || !isLocal
	}
	if l.Saturated {
		add(ReasonSaturated, true)
	}
	if l.WaitP90 != nil && l.WaitP90.Duration() > th.WaitP90 {
		add(ReasonWaitP90, true)
	}
	if l.QueueTimeouts5m > 0 {
		add(ReasonQueueTimeouts, true)
	}
	n := c.Counts
	if n.UpstreamErrors >= th.UpstreamErrors && float64(n.UpstreamErrors) >= th.ErrorRatio*float64(n.Exchanges5m) {
		add(ReasonUpstreamErrors, false)
	}
	if n.Retries >= th.Retries {
		add(ReasonRetries, false)
	}
	switch {
	case gateway: // a degraded gateway wins: the local queue is its symptom
		c.State = GatewayDegraded
	case local:
		c.State = LocalQueue
	}
	c.HoldText = holdText(c, gateway, local)
	return c
}

func holdText(c Classification, gateway, local bool) string {
	queue := fmt.Sprintf("gate queue: %d %s waiting, p90 wait %s", c.LaneQueueDepth, plural(c.LaneQueueDepth, "call", "calls"), p90(c.LaneWaitP90S))
	if c.Counts.QueueTimeouts5m > 0 {
		queue += fmt.Sprintf(", %d queue %s in 5 min", c.Counts.QueueTimeouts5m, plural(c.Counts.QueueTimeouts5m, "timeout", "timeouts"))
	}
	if !gateway {
		if local {
			return queue
		}
		return fmt.Sprintf("gate healthy: %d of %d slots in use, %d waiting", c.Counts.Inflight, c.Counts.Limit, c.LaneQueueDepth)
	}
	n := c.Counts
	var parts []string
	for _, p := range []struct {
		n         int
		one, many string
	}{{n.RateLimited, "× 429", "× 429"}, {n.ServerErrors, "× 5xx", "× 5xx"}, {n.TransportErrors, "transport error", "transport errors"},
		{n.Stalls, "stall", "stalls"}, {n.Retries, "retry", "retries"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, plural(p.n, p.one, p.many)))
		}
	}
	text := fmt.Sprintf("gateway degraded: %s in 5 min", strings.Join(parts, ", "))
	if local {
		text += "; " + queue
	}
	return text
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
