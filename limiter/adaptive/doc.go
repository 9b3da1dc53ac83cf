// Package adaptive is the adaptive limit of a lane (limiter.Config.Adaptive):
// a Controller whose limit moves between Settings.MinInflight and the
// lane's MaxInflight (the ceiling) from what its calls
// see at the gateway. Priority semantics hold at every limit: class order,
// aging, FIFO, and the reserve, clamped to the current limit (at limit 1
// there is none). A limit that drops never revokes a held slot, and does
// not take the reserve away: while non-interactive calls still hold more
// slots than the lowered limit leaves them, an interactive call may take a
// slot up to the limit before the drop (no more interactive holders than
// the reserve), so the gateway never sees more than it did before the
// drop and the operator's chat does not wait for the background work to
// drain. (With a Backend, grants are decided by the backend, by the
// limit alone.)
//
// # The algorithm
//
// It learns from each attempt, not from whole retry chains, through two
// signals the transport reports:
//
//   - Time to first byte, against the lane's no-load baseline for requests
//     of that size: the smallest first-byte time seen in the last 5 minutes
//     among requests whose body size is within 1/16 of an octave (about
//     4 %) of this one's, because long prompts take longer to their first
//     token even on an idle gateway. A ratio above 1 + tolerance means the
//     gateway is past its capacity: it is slowing every call down. But
//     gateways jitter whatever their load, and the 5-minute minimum is
//     their luckiest call: so the tolerance also grows with the jitter
//     the lane has learned, four times the mean relative difference
//     between first bytes of calls of about one size sent into the same
//     load (the load cannot explain that difference; RFC 6298 bounds
//     round trips the same way, by four mean deviations). A steady gateway
//     keeps the 5 %; one whose first bytes spread uniformly over a third
//     of their value gets about 50 %, and its jitter alone never cuts.
//     The jitter counts once 8 pairs are known; a latency cut made before
//     it is well known (64 pairs) is taken back, within latencyHold, if
//     the jitter learned since explains it.
//   - Loss: a 429, a 502, 503 or 504, a transport error or a stall; a
//     Retry-After holds increases for as long as it asks. (A plain 500, or
//     another 5xx, is the gateway's error about one request, which a
//     client can provoke: the lane counts it, but it cuts no one's limit.)
//
// A sample counts only if its call was sent after the limit last changed:
// calls sent before reflect the old limit. Decisions look at the last
// three fresh samples:
//
//   - Latency above tolerance: when the lower median of at least window
//     fresh samples is past the tolerance, or one sample is past severe
//     (plus the jitter's share)
//     (a quarter over the baseline: a gateway that lost half its capacity
//     may not finish another call for minutes, so no second sample would
//     come), the limit drops toward the point where the gateway stops
//     slowing down, scaled from the load the samples' calls were sent
//     into. limit / ratio is the gradient of Netflix's concurrency-limits
//     and Envoy's adaptive concurrency; here, as only part of a first
//     byte's time grows with load (the tokens, not the prompt's
//     processing), load / (1 + 2(ratio - 1)) (see cut). If the limit had
//     just been raised, the raise was the mistake: it goes no lower than
//     the limit before (in slow start, TCP's return to the last good
//     window). Increases then stop one slot below the limit that
//     was too many for latencyHold (1 minute); past slow start, they stop
//     at that limit for holdOff (see cutAt), so the slot above the
//     capacity is probed every minute and the one above that not at all.
//   - Loss: the limit is multiplied by lossFactor (0.75), and increases
//     stop one slot below the load the lost call was sent into, for
//     holdOff (5 minutes) or the Retry-After if longer, so a gateway that
//     answers 429 above a threshold is probed once every few minutes, not
//     in a retry storm; a loss at that one-slot probe goes straight back to
//     the limit below it. A 429 is the gateway saying what its capacity is;
//     Vector's ARC users found that treating it as noise misbehaves.
//   - Latency within tolerance while the lane uses its slots: the limit
//     grows, doubling from the start until the first cut (slow start, as
//     in TCP), then one slot for each window such first bytes in a row
//     since the last change (additive increase: each slot added is checked
//     by calls it let through). Using its slots means that when the call
//     was sent, the lane held every slot it could (see full) and, when its
//     first byte came, every slot was held or calls waited for one. A lane
//     that does not use its slots learns nothing about more of them, so it
//     does not grow.
//
// Until the lane has a baseline it admits MinInflight calls (the probe),
// so the first first-byte times are no-load ones; then the limit starts at
// Initial. Envoy's filter measures its minimum latency the same way.
//
// # The lane and its controller
//
// The lane calls its Controller with its lock held (a Controller is not
// safe for concurrent use): Limit for the limit in force, FirstByte and Loss
// for the transport's signals, Load and Interactive for what the lane
// itself does. Limit and State change nothing. The lane, not the
// controller, keeps the interactive reserve through a drop (see
// limiter.Adaptive).
package adaptive
