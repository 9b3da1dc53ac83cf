// Package telemetry serves a limiter's lanes over HTTP: Prometheus metrics
// (the OpenTelemetry bridge's instruments through the OpenTelemetry
// Prometheus exporter, with Go and process collectors, OpenMetrics on
// request), the lane snapshot (docs/DESIGN.md, "The snapshot"), and a classification of each lane as
// idle, healthy, local_queue or gateway_degraded.
//
// Routes (all read-only: GET and HEAD; anything else is 405):
//
//	/metrics                                     Prometheus exposition
//	/api/telemetry/llm-lanes                     the lane snapshot; {"enabled": false} when off
//	/api/telemetry/llm-lanes/classification      every lane's classification (classify.Report)
//	/api/telemetry/llm-lanes/classification?lane=K   one lane's (404 if unknown)
//	/api/telemetry/llm-lanes/classification?upstream=U&model=M   one lane's, idle if it had no call
//	/healthz                                     "ok"
//
// They read memory only; nothing is fetched to serve them.
//
// # Classification
//
// The classification route, the lane-state gauges (p_llm_lane_state{lane,
// state} and p_llm_lane_reason{lane,reason}) and the hold-text info series
// all come from package classify's one definition; see its documentation
// for the states, the reasons, their precedence, and the versioned payload.
// SetUpstreams lets the route look lanes up by ?upstream=&model= and answer
// idle for a configured upstream's lane that has had no call.
package telemetry
