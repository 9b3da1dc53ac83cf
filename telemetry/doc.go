// Package telemetry serves a limiter's lanes over HTTP: Prometheus metrics
// (the OpenTelemetry bridge's instruments through the OpenTelemetry
// Prometheus exporter, with Go and process collectors, OpenMetrics on
// request), the D8 snapshot, and a classification of each lane as
// healthy, local_queue or gateway_degraded.
//
// Routes (all read-only: GET and HEAD; anything else is 405):
//
//	/metrics                                     Prometheus exposition
//	/api/telemetry/llm-lanes                     the D8 snapshot; {"enabled": false} when off
//	/api/telemetry/llm-lanes/classification      every lane's classification
//	/api/telemetry/llm-lanes/classification?lane=K   one lane's (404 if unknown)
//	/healthz                                     "ok"
//
// They read memory only; nothing is fetched to serve them.
//
// # Classification
//
// Classify is a pure function of a lane's snapshot (which includes its
// upstream counts of the last 5 minutes) and Thresholds. Its reasons:
//
//   - local_queue: "saturated" (queue non-empty for 60 s), "wait_p90" (wait
//     p90 over Thresholds.WaitP90), "queue_timeouts" (any in 5 minutes);
//   - gateway_degraded: "upstream_errors" (429, 5xx, transport errors and
//     stalls reaching Thresholds.UpstreamErrors and Thresholds.ErrorRatio of
//     the exchanges), "retries" (SDK retries reaching Thresholds.Retries).
//
// Every reason that holds is listed. When reasons of both kinds hold, the
// state is gateway_degraded: a failing gateway holds slots longer and sends
// retries back into the queue, so the local queue is its symptom, and the
// gateway is what an operator must look at. The hold text then names both.
package telemetry
