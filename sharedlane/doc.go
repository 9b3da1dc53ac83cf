// Package sharedlane keeps llmlanes lanes in Redis, so that every process
// that names the same Redis and key prefix shares one budget per lane: one
// max_inflight, the interactive reserve, one priority order with aging,
// the tenants' fair shares within a class (package limiter's rules, with
// each tenant's service kept in Redis and measured on its clock), FIFO
// within a tenant, the queue timeout; and the token budgets
// (tokens_per_minute, max_inflight_tokens) and what the provider's
// rate-limit headers said, whichever process's answer carried them, both
// decided with the slot. Plug it into a limiter with limiter.WithBackend;
// lanes-exporter does so with its shared: section.
//
// # How it stays correct
//
// Every grant decision is one Lua script run atomically in Redis, on
// Redis' clock (TIME), so the hosts' clocks (skewed or not) never order
// or grant anything: a caller sends only how long ago its call logically
// arrived. A held slot and a queue place are leases that expire after
// LeaseTTL unless their process renews them (every LeaseTTL/6, and on a
// failure every second until one succeeds, whether or not Redis is taken
// to be down; see renewLoop for the rule): a process
// killed with SIGKILL frees its slots and places within one LeaseTTL (and
// the next look at the lane by anyone: every waiter looks at least every
// PollEvery). A
// process that cannot prove a held slot's lease still held (no renewal
// confirmed for 0.8 LeaseTTL: Redis unreachable, stalled, or partitioned
// away) closes the slot's Lost channel before the lease can lapse in
// Redis, and lanehttp.Transport stops the call then, so the slot is never
// in two hands. A stall shorter than that cuts no call: the renewals sent
// during it are answered when it ends. Waiters learn of a grant
// from a pub/sub message, with a slow poll (PollEvery) as a safety net for
// a message lost with a connection.
//
// # When Redis is down
//
// With OnRedisDown "local" a process falls back to lanes of its own, of
// LocalMaxInflight slots (size it so that the processes' sum stays within
// the gateway's capacity); with "closed" it refuses calls with
// limiter.ErrLaneUnavailable (lanes-exporter answers 503
// lane_unavailable, retryable). Calls waiting when Redis goes down move to
// the fallback. Either way the change is logged, shown in the snapshot
// (shared.state) and in metrics, and undone when Redis answers again:
// calls still running on the fallback are then registered in Redis, so
// they count against the shared limit until they end and no slot is
// counted twice. Held shared slots whose lease cannot be renewed in time
// are lost, as above.
//
// # Deployments
//
// A standalone Redis (redis:// or rediss:// for TLS, with AUTH in the
// URL's user information), Sentinel (?master_name=...&addr=... for more
// sentinels) and Cluster (?addr=... for more seed nodes, or ?cluster=true)
// through go-redis' clients. Every key of one lane carries the same hash
// tag, so a lane lives in one hash slot; the script also makes keys of its
// own from the lane's (a FIFO per class and tenant), which keep the tag.
// Credentials are never logged.
package sharedlane
