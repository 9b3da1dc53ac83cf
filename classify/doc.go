// Package classify tells a lane that queues on purpose from a lane whose
// gateway is failing: the classification of DESIGN.md, its
// versioned JSON payload, and a Client for programs that poll it, such as
// a review bot deciding whether "the gate is throttling" or "the gate is
// dead".
//
// # States
//
// Lane classifies one lane from its snapshot (limiter.LaneSnapshot, which
// carries the lane's upstream outcomes of the last 5 minutes). It is a pure
// function, and the one definition behind the classification route, the
// {p}_llm_lane_state and {p}_llm_lane_reason gauges, the status page, the
// alert rules and the dashboards of lanes-exporter:
//
//   - local_queue: the process queues on purpose: the lane is "saturated"
//     (the queue has been non-empty for 60 s) or its "wait_p90" (the
//     5-minute p90 wait) is over Thresholds.WaitP90. "queue_timeouts" (a
//     call waited the whole queue timeout in the last 5 minutes) is listed
//     whenever it holds, but makes the lane local_queue only while calls
//     are queued now: alone, on a lane that is free now, it must not hide a
//     gateway that fails every call.
//   - gateway_degraded: the gateway is slow or failing while the lane is
//     not local_queue. Reasons "upstream_errors" (429, 5xx, transport
//     errors and stalls reaching Thresholds.UpstreamErrors and
//     Thresholds.ErrorRatio of the exchanges), "retries" (SDK retries
//     reaching Thresholds.Retries) and "limit_cut" (an adaptive limit cut
//     by the gateway's loss signals).
//   - When reasons of both kinds hold, the state is local_queue and the
//     gateway's reasons are still listed (and named in the hold text): the
//     queue is what a caller waits on, and its depth is what an ETA must use.
//   - idle: no call in flight, none queued, and no wait or exchange in the
//     last 5 minutes, including a lane of a configured upstream that has had
//     no call yet.
//   - healthy otherwise.
//
// docs/DESIGN.md has the whole truth table; TestTruthTable tests each row.
//
// # Payload
//
// The route's answers are versioned (Version, "version": 1): a Report for
// every lane, or one Classification for a lane looked up by key
// (?lane=<key>) or by configured upstream and model
// (?upstream=<name>&model=<id>). A lane of a configured upstream that has
// had no call answers 200 with state idle; an unknown upstream or lane is a
// 404. With the limiter off the answer is {"version": 1, "enabled": false}.
// Each classification carries the lane's queue depth, p90 wait and
// saturation (lane_queue_depth, lane_wait_p90_s, lane_saturated), the
// counts behind each reason, eta_s (how long a new call of each class would
// wait now) and a one-line hold text such as "gate queue: 9 calls waiting,
// p90 wait 171 s".
package classify
