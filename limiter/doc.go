// Package limiter puts model calls into bounded, priority-ordered lanes, one
// per (endpoint, model), so that callers beyond a lane's limit wait in a
// local queue that everyone can see instead of piling onto a slow gateway.
//
// # Lanes
//
// A lane is named by a key, conventionally "<resolved base URL>|<model id>"
// (for example "https://gw/v1|protolabs/smart"). Lanes are created on first
// use and share the limiter's Config. A call takes a Slot with Acquire and
// gives it back with Release once its work at the gateway is over; for a
// stream that is when the stream ends, not when the first byte arrives.
//
// # Order
//
// Waiters are served in three steps. Which class: each class (Interactive,
// Default, Bulk; see Priority) with waiters is represented by its oldest
// waiter, whose effective class rises one step for every 60 s it has
// waited, counted from its logical arrival; the highest effective class
// goes first, then the earliest arrival. Whose call within that class: the
// tenant that has received the least service (see Tenants). Which of its
// calls: first come, first served. The class rides in the context
// (WithPriority), so goroutines started with it inherit it, and a retry
// keeps its logical arrival by carrying it in the context (WithArrival),
// so bulk work is never starved. With one tenant this is the ADR's order,
// class then arrival. Every grant decision, the reserve check included, is
// made under the lane's lock.
//
// # Tenants
//
// A call may name a tenant (WithTenant; a board, a team, a credential).
// Within the class chosen, a lane serves the tenant that has received the
// least service first, whatever its calls' ages, and each tenant's calls
// first come, first served. Aging lifts a class, never one tenant's calls
// over another's: a tenant whose calls have waited long raises its class
// against the other classes, not its calls against the other tenants' in
// it. The reserve goes to interactive calls only, as without tenants, and
// a lane whose calls name no tenant orders them exactly as class, then
// arrival.
//
// Service is slot-time divided by the tenant's weight (Fairness.Weights),
// or, in a lane whose calls carry token estimates (WithTokens), tokens:
// the estimate at the grant, settled to what the call used at the
// release; the lane turns to tokens at its first estimated grant, and
// every tenant's service starts again then.
// The algorithm is start-time fair queuing (Goyal, Vin and Cheng, 1996)
// over slot-time, as VTC (Sheng et al., "Fairness in Serving Large
// Language Models", OSDI 2024) applies it to model calls: a grant is
// charged an estimate, the mean slot-time of the tenant's calls (before one
// has ended, the lane's), and the difference to the real slot-time is
// settled when the slot is released; a tenant that starts waiting in a
// class is raised to the settled service (less the charges of its calls
// in flight) of the tenant served next in that class (or, with none
// waiting there, of the tenant granted last), so being idle banks no
// credit for a burst later.
//
// The bound: while tenants are continuously backlogged in one class, the
// slot-time each has received, divided by its weight, differs from
// another's at every moment by at most L times the longest single call's,
// in a lane of L slots. This is VTC's bound, whose M, the work in flight,
// is here L calls: each call in flight was charged an estimate its real
// length may exceed by up to the longest call (TestFairnessBound checks it
// at L = 1, 2 and 4, with 2 and 5 tenants and weights 2:1, and logs the
// worst spread it sees; TestFairnessLateTenant, that a late tenant gets
// its share from its first call and no catch-up burst).
//
// Newcomers: a tenant not yet granted a call is lifted to at least the
// lane's newcomers' mark, which it moves on by what its grant will be
// charged, and which its first call's release settles as its service: the
// newcomers are served as one tenant, so a caller that makes up a name
// per call gets one share, not one per name. Tenants that start waiting
// together as newcomers are staggered by one charge each, which adds, for
// them, one charge per newcomer before them to the bound above.
//
// Fairness.MaxInflightPerTenant caps the slots one tenant holds at once;
// Fairness.MaxTenants bounds the tenants a lane tracks by name, beyond
// which calls share OtherTenant. A tenant with nothing queued or in
// flight that had no call granted or ended for TenantIdle is forgotten
// (looked for at a newcomer's call, at most once a minute), so the bound
// counts the tenants active at once. A lane measures slot-time (reads the
// clock at grant and release) only once a call has named a tenant.
//
// # Token budgets
//
// A call may carry an estimate of its tokens (WithTokens; package
// lanehttp estimates every model call from its body). Config.TokensPerMinute
// is each lane's budget, a token bucket a minute deep that refills
// continuously, and Config.MaxInflightTokens bounds the estimates in
// flight: a call is granted only when both have room for its estimate,
// and waits in the queue, in the lane's order, until they do (the first in
// line holds it: smaller calls behind it do not pass). Slot.Settle
// replaces the estimate with what the call used, at once. A call estimated
// above a whole budget is refused with a *TokenBudgetError. RecordLimits
// reports what a provider's rate-limit headers said: the lane grants no
// more than they say remains (less the calls in flight that the
// provider's count may not hold), refilling towards the limit until that bucket is whole, and a
// 429's Retry-After holds its grants. Config.ColdStart makes a new lane
// grant one call until it has heard from its gateway.
// A lane whose calls carry estimates and no budget binds reads no clock
// for them.
//
// The queue keeps one FIFO per tenant and class, and per class two heaps of
// its tenants' FIFOs, by head arrival (the class's oldest waiter) and by
// service: a grant reads three tops and one more, and is O(log n) in the
// waiters and O(log t) in the class's tenants.
//
// # Reserve
//
// Config.InteractiveReserve (clamped to MaxInflight-1) is counted against
// non-interactive holders: calls whose own class is not Interactive may
// hold at most MaxInflight minus the reserve slots at once, and Interactive
// calls may take any free slot. So non-interactive work always has at least
// one slot (limit 2, reserve 1, one interactive call in flight: a bulk call
// still gets the other slot at once), and with limit 3, reserve 1 and two
// bulk calls in flight a third bulk call waits while an interactive one is
// granted at once. Aging changes the serving order, never this cap.
//
// # Waiting
//
// A wait ends with a slot, with a *QueueTimeoutError (errors.Is
// ErrQueueTimeout) after Config.QueueTimeout, or with the context's error if
// the context is canceled first. A call's deadline (WithDeadline, else the
// context's) never runs out in the queue: Config.DeadlineMargin before it
// the wait ends with a *QueueTimeoutError whose Cause is CauseDeadline,
// and under Config.Deadline AnswerEarly a call whose estimated wait is
// longer than its time left gets one (CauseEstimate) as it queues. A
// waiter that gives up leaves nothing behind, and a cancellation that
// races a grant passes the slot on.
//
// # Off
//
// MaxInflight 0 turns the limiter off: Acquire returns at once, creates no
// lane, and costs one branch. Configuration can change at any time
// (SetConfig); it applies to later grants and never revokes a held slot.
//
// # Seeing the queue
//
// Snapshot reports every lane in the shape of docs/DESIGN.md, "The snapshot" (inflight,
// queue by class, oldest wait, wait percentiles and queue timeouts of the
// last 5 minutes, saturation), plus two extra keys: the lane's upstream
// outcomes of the last 5 minutes and an estimate, per class, of how long a
// call arriving now would wait (ETA).
//
// A wait sample is taken when a wait ends in a grant (0 for an immediate
// grant) or in a queue timeout (its whole wait), so a lane that times its
// callers out can never look fast. A wait its caller canceled is not a
// sample, since its length was the caller's choice; observers see it as a
// Canceled event.
// Observers (WithObserver) receive an Event for every enqueue, grant,
// release, cancellation and timeout, which is how packages such as
// otelbridge feed metrics and spans without this package importing them.
//
// # Reading changes nothing
//
// Snapshot, and everything built on it (the ETAs, the telemetry routes and
// metrics), reads the lanes as they stand: it never moves their
// statistics or changes their adaptive limit, so a lane that is read often
// behaves exactly as one that is never read.
//
// # Adaptive limits
//
// With Config.Adaptive, each lane's limit is learned from its gateway by a
// controller of package limiter/adaptive, which documents the algorithm;
// the lane asks it for the limit in force and tells it of first bytes,
// losses and its own load.
//
// # Time
//
// All time is read from a Clock, the system clock by default. Tests inject
// the fake clock of package limitertest and drive aging, timeouts,
// saturation and the 5-minute windows step by step, without sleeping.
//
// The package imports nothing outside the standard library.
package limiter
