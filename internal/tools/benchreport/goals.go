package main

import (
	"fmt"
	"math"
)

const intro = `## How to read

Each goal is checked in this run and says *yes* or **no**; a row marked *reported* has no
bar and is there for scale. Goals are what a user gets: no allocation and grants
logarithmic in the waiters and tenants in process; a shared lane's pair close to the least
any Redis script costs on the same machine, and the grants one Redis core serves; and how
many calls a gateway answers under overload, through lanes-exporter beside HAProxy and no
limiter (docs/DESIGN.md, "Performance"). Ratios to ` + "`x/sync/semaphore`" + ` and to two PINGs
are reported: a lane's tens of nanoseconds or a shared pair's few hundred microseconds are
nothing beside a model call of seconds, and on a given VM the floor of any Redis script
moves the ratio to PINGs more than the code does. Timings on a shared VM move by 10-20%
between runs: read ratios measured in the same run. Profiles taken by hand, with their
dates, are in [notes/](notes/).

## What is measured

- **limiter, AcquireRelease**: one acquire and release of a slot. *uncontended*: one
  goroutine, slots to spare; *parallel*: every CPU on one lane with slots to spare;
  *waiters-N*: N goroutines (classes mixed) contend for one slot, so nearly every
  acquisition queues and every release hands the slot over (mostly the Go scheduler's
  work, and at 100,000 the garbage collector's). *llmlanes-budget*: uncontended with a
  ` + "`tokens_per_minute`" + ` budget that never runs out, each call estimated at 1,000 tokens
  and settled at 800. *llmlanes-off*: the limiter switched off. Anchors:
  ` + "`golang.org/x/sync/semaphore`" + ` and a buffered-channel semaphore, which have no classes,
  aging, reserve, timeouts or statistics.
- **limiter, Grant**: one grant decision (pick the next waiter among the class heaps,
  dequeue, grant, record the wait) with N calls queued, scheduling left out.
  **GrantTenants**: the same with 100,000 calls of 1, 10 and 1,000 named tenants.
- **lanehttp, Overhead**: one model call (a 360-byte chat completion) through a base
  transport that answers from memory, bare and wrapped in a ` + "`lanehttp.Transport`" + `: what a
  lane adds to a call. *lanes-no-timeouts* leaves ResponseHeaderTimeout and StallTimeout
  unset. **RoundTrip**: the same over loopback HTTP, for scale.
- **lanehttp, Estimate**: the token estimate of a chat completion whose user message is 1,
  4 and 16 KiB of English text. **Route**: the model and token estimate of a 1 MiB body
  of top-level keys, written plainly and with escapes (a client chooses its body).
- **otelbridge, Bridge**: one call's limiter events with no observer, with the bridge's
  metrics and no tracing, and with the queue-wait and upstream spans too.
- **telemetry, Routes**: the snapshot, the classification and a ` + "`/metrics`" + ` scrape with 100
  lanes, each with history and a queued call.
- **lanes-exporter, Proxy**: a streamed chat completion against a gateway that answers at
  once, direct and through the proxy, client, proxy and gateway in one process.
  **ProxyThroughput**: 32 clients against the simulator, direct and through a lane of 32.
  **QueuedMemory**: heap and stacks per call queued behind a held slot.
- **sharedlane, Shared**: a lane in Redis (a local redis-server). *acquire-release*: one
  acquire and release, two FCALLs of lane.lua; *-tenants-budget*: three tenants taking
  turns and a ` + "`tokens_per_minute`" + ` budget. *floor*: the goals' loop: each iteration runs,
  in a shuffled order, two PINGs, a pair of a logic-free script running the plain pair's
  13 Redis commands with the same keys and arguments (` + "`bareScript`" + ` in
  sharedlane/bench_test.go), a plain pair and a pair with tenants and a budget; the
  ratios are of the medians, so the machine's drift moves them all alike. *interleaved*:
  the same loop without the script. *grant/tenants-N*: lane.lua's time per call with N
  tenants waiting (INFO commandstats). *mass-cancel-3000*: a PING's latency while 3,000
  waiters give up at once. *handover*: from a release in one process to the grant of a
  call waiting in another. Redis' CPU comes from its INFO counters; *grants a second on
  one Redis core* is 1 s over Redis' CPU per call.
`

type goal struct {
	text  string
	check func(map[string]*result) (string, bool)
}

func metric(res map[string]*result, name, unit string) (float64, bool) {
	r, ok := res[name]
	if !ok {
		return 0, false
	}
	v, ok := r.metrics[unit]
	return v, ok
}

// ratioGoal: name's ns/op is at most max times anchor's, with at most
// allocs allocations.
func ratioGoal(text, name, anchor string, maxRatio, allocs float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, name, "ns/op")
		b, ok2 := metric(res, anchor, "ns/op")
		al, _ := metric(res, name, "allocs/op")
		if !ok1 || !ok2 {
			return "not run", false
		}
		return fmt.Sprintf("%.1f ns vs %.1f ns = %.2fx, %g allocs", a, b, a/b, al), a/b <= maxRatio && al <= allocs
	}}
}

func absGoal(text, name string, maxNs, allocs float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok := metric(res, name, "ns/op")
		al, _ := metric(res, name, "allocs/op")
		if !ok {
			return "not run", false
		}
		return fmt.Sprintf("%s, %g allocs", dur(a), al), a <= maxNs && al <= allocs
	}}
}

// logGoal: going from n1 to n2 waiters, the cost grows by at most
// log(n2)/log(n1) times slack.
func logGoal(text, base string, n1, n2 int, suffix string, slack float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, fmt.Sprintf("%s-%d%s", base, n1, suffix), "ns/op")
		b, ok2 := metric(res, fmt.Sprintf("%s-%d%s", base, n2, suffix), "ns/op")
		if !ok1 || !ok2 {
			return "not run", false
		}
		lr := math.Log(float64(n2)) / math.Log(float64(n1))
		return fmt.Sprintf("%.0f ns → %.0f ns: %.2fx for %dx the waiters (log ratio %.2f)", a, b, b/a, n2/n1, lr), b/a <= lr*slack
	}}
}

// addedGoal: name adds at most maxNs and maxAllocs to anchor.
func addedGoal(text, name, anchor string, maxNs, maxAllocs float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, name, "ns/op")
		b, ok2 := metric(res, anchor, "ns/op")
		aa, _ := metric(res, name, "allocs/op")
		ba, _ := metric(res, anchor, "allocs/op")
		if !ok1 || !ok2 {
			return "not run", false
		}
		return fmt.Sprintf("+%.2f µs, +%g allocs", (a-b)/1000, aa-ba), a-b <= maxNs && aa-ba <= maxAllocs
	}}
}

// dur formats nanoseconds in the unit that reads best.
func dur(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.1f ms", ns/1e6)
	case ns >= 1e4:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.2f ns", ns)
}

// metricDiffGoal: name's unit metric exceeds anchor's by at most max.
func metricDiffGoal(text, name, anchor, unit string, maxDiff float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, name, unit)
		b, ok2 := metric(res, anchor, unit)
		if !ok1 || !ok2 {
			return "not run", false
		}
		return fmt.Sprintf("%.0f vs %.0f %s: +%.0f", a, b, unit, a-b), a-b <= maxDiff
	}}
}

// metricRatioGoal: name's unit metric is at least min times anchor's.
func metricRatioGoal(text, name, anchor, unit string, minRatio float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, name, unit)
		b, ok2 := metric(res, anchor, unit)
		if !ok1 || !ok2 {
			return "not run", false
		}
		return fmt.Sprintf("%.0f vs %.0f %s = %.0f%%", a, b, unit, 100*a/b), a/b >= minRatio
	}}
}

// metricRatioMaxGoal: name's unit metric is at most maxRatio times anchor's.
func metricRatioMaxGoal(text, name, anchor, unit string, maxRatio float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok1 := metric(res, name, unit)
		b, ok2 := metric(res, anchor, unit)
		if !ok1 || !ok2 {
			return "not run", false
		}
		return fmt.Sprintf("%.1f vs %.1f %s = %.2fx", a, b, unit, a/b), a/b <= maxRatio
	}}
}

// metricMaxGoal: name's unit metric is at most max.
func metricMaxGoal(text, name, unit string, maxV float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		a, ok := metric(res, name, unit)
		if !ok {
			return "not run", false
		}
		f := "%.3g %s" // three figures: 1.53 (a ratio), 44.0
		if a >= 1000 {
			f = "%.0f %s"
		}
		return fmt.Sprintf(f, a, unit), a <= maxV
	}}
}

// perCoreGoal: one Redis core serves at least minPerS grants a second,
// from name's Redis CPU per 1,000 calls (ms).
func perCoreGoal(text, name string, minPerS float64) goal {
	return goal{text, func(res map[string]*result) (string, bool) {
		ms, ok := metric(res, name, "redis-cpu-ms/1000calls")
		if !ok || ms <= 0 {
			return "not run", false
		}
		perS := 1e6 / ms
		return fmt.Sprintf("%.0f grants/s (%.0f µs of Redis CPU a call)", perS, ms), perS >= minPerS
	}}
}

// goals are what a user gets (docs/DESIGN.md, "Performance"): no
// allocation and logarithmic grants in process, a shared pair close to
// the least any script costs, the grants one Redis core serves. The
// ratios to x/sync/semaphore and to two PINGs are reported beside them.
var goals = []goal{
	absGoal("limiter off: under 5 ns, 0 allocs", "BenchmarkAcquireRelease/uncontended/llmlanes-off", 5, 0),
	ratioGoal("limiter uncontended: 0 allocs (beside x/sync/semaphore: reported)",
		"BenchmarkAcquireRelease/uncontended/llmlanes", "BenchmarkAcquireRelease/uncontended/semaphore", 1e9, 0),
	ratioGoal("limiter parallel, one lane: 0 allocs (beside x/sync/semaphore: reported)",
		"BenchmarkAcquireRelease/parallel/llmlanes", "BenchmarkAcquireRelease/parallel/semaphore", 1e9, 0),
	ratioGoal("limiter, 1,000 goroutines contending for one slot: 0 allocs per hand-over (beside x/sync/semaphore: reported)",
		"BenchmarkAcquireRelease/waiters-1000/llmlanes", "BenchmarkAcquireRelease/waiters-1000/semaphore", 1e9, 0),
	ratioGoal("limiter, 100,000 goroutines contending for one slot: 0 allocs per hand-over (beside x/sync/semaphore: reported)",
		"BenchmarkAcquireRelease/waiters-100000/llmlanes", "BenchmarkAcquireRelease/waiters-100000/semaphore", 1e9, 0),
	ratioGoal("limiter uncontended with a tokens_per_minute budget, each call estimated and settled: 0 allocs (beside no budget: reported)",
		"BenchmarkAcquireRelease/uncontended/llmlanes-budget", "BenchmarkAcquireRelease/uncontended/llmlanes", 1e9, 0),
	logGoal("grant cost 1,000 → 100,000 waiters: no worse than logarithmic (x2 allowance for cache misses)",
		"BenchmarkGrant/waiters", 1000, 100000, "", 2),
	ratioGoal("grant, 100,000 waiters of one named tenant (its share measured): within 1.5x of calls that name none",
		"BenchmarkGrantTenants/tenants-1", "BenchmarkGrant/waiters-100000", 1.5, 1e9),
	logGoal("grant, 100,000 waiters of 10 → 1,000 tenants: no worse than logarithmic in the tenants (x2 allowance)",
		"BenchmarkGrantTenants/tenants", 10, 1000, "", 2),
	addedGoal("transport, uncontended, both timeouts on: adds under 20 µs per call (allocations: reported)",
		"BenchmarkOverhead/call/lanes", "BenchmarkOverhead/call/bare", 20000, 1e9),
	addedGoal("transport with the limiter off: adds nothing measurable (under 0.5 µs, 0 allocs)",
		"BenchmarkOverhead/call/lanes-off", "BenchmarkOverhead/call/bare", 500, 0),
	addedGoal("OpenTelemetry bridge keeping its metrics, no tracing: under 1 µs per call, 0 allocs",
		"BenchmarkBridge/events/otel-metrics", "BenchmarkBridge/events/none", 1000, 0),
	addedGoal("OpenTelemetry bridge with metrics and spans: added per call (reported)",
		"BenchmarkBridge/events/otel-metrics-and-spans", "BenchmarkBridge/events/none", 1e9, 1e9),
	absGoal("snapshot route, 100 lanes: cheap enough to poll every second (under 5 ms)",
		"BenchmarkRoutes/lanes-100/api/telemetry/llm-lanes", 5e6, 1e9),
	absGoal("/metrics scrape, 100 lanes: under 100 ms", "BenchmarkRoutes/lanes-100/metrics", 1e8, 1e9),
	metricDiffGoal("proxy, client in its process: adds under 200 µs at p50 to a streamed call (loopback)",
		"BenchmarkProxy/latency/proxy", "BenchmarkProxy/latency/direct", "p50-µs", 200),
	metricDiffGoal("proxy, client in its process: added p99 (reported)", "BenchmarkProxy/latency/proxy", "BenchmarkProxy/latency/direct", "p99-µs", 1e9),
	metricRatioGoal("proxy: throughput at least 90% of direct (32 clients, simulated gateway)",
		"BenchmarkProxyThroughput/calls/proxy", "BenchmarkProxyThroughput/calls/direct", "calls/s", 0.9),
	metricMaxGoal("proxy: under 64 KiB per queued call, 10,000 queued over HTTP/2 (client side included)",
		"BenchmarkQueuedMemory/h2c-10000", "KiB/queued", 64),
	metricMaxGoal("proxy: under 64 KiB per queued call, 4,000 queued over HTTP/1.1 (client side and connections included)",
		"BenchmarkQueuedMemory/http1-4000", "KiB/queued", 64),
	absGoal("token estimate of a 4 KiB prompt: under 10 µs, 0 allocs", "BenchmarkEstimate/prompt-4KiB", 10000, 0),
	ratioGoal("model and token estimate of a 1 MiB body whose keys are written with escapes: within 2x of one with plain keys, one allocation (the model's name)",
		"BenchmarkRoute/escaped-keys", "BenchmarkRoute/plain-keys", 2, 1),
	metricMaxGoal("shared lane: the plain acquire and release within 1.25x of a logic-free script running its 13 Redis commands, interleaved in a shuffled order, medians",
		"BenchmarkShared/uncontended/floor", "plain-x-bare", 1.25),
	metricMaxGoal("shared lane with tenants named and a token budget: acquire and release within 1.6x of the same logic-free script, interleaved in the same loop",
		"BenchmarkShared/uncontended/floor", "tenants-budget-x-bare", 1.6),
	perCoreGoal("shared lane with tenants and a budget: at least 5,000 grants a second on one Redis core",
		"BenchmarkShared/uncontended/acquire-release-tenants-budget", 5000),
	metricRatioMaxGoal("shared lane: a grant with 100 tenants waiting within 2x of one with a single tenant (lane.lua's time per call, INFO commandstats)",
		"BenchmarkShared/grant/tenants-100", "BenchmarkShared/grant/tenants-1", "script-µs/call", 2),
	metricMaxGoal("shared lane: a PING's p99 while 3,000 waiters give up at once, under 20 ms",
		"BenchmarkShared/mass-cancel-3000", "ping-p99-µs", 20000),
	metricMaxGoal("shared lane: the logic-free script beside two PINGs (reported: the least any script costs on this machine)",
		"BenchmarkShared/uncontended/floor", "bare-x-2xping", 1e9),
	metricMaxGoal("shared lane: the plain pair beside two PINGs, interleaved (reported)",
		"BenchmarkShared/uncontended/interleaved", "plain-x-2xping", 1e9),
	metricMaxGoal("shared lane with tenants and a budget beside two PINGs, interleaved (reported)",
		"BenchmarkShared/uncontended/interleaved", "tenants-budget-x-2xping", 1e9),
	metricMaxGoal("shared lane: hand-over from a release in one process to the grant in another, p50 (reported)",
		"BenchmarkShared/handover", "p50-µs", 1e9),
	metricMaxGoal("shared lane: hand-over p99 (reported)", "BenchmarkShared/handover", "p99-µs", 1e9),
	metricMaxGoal("shared lane: Redis CPU per 1,000 plain calls (reported)",
		"BenchmarkShared/uncontended/acquire-release", "redis-cpu-ms/1000calls", 1e9),
}
