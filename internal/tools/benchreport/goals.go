package main

import (
	"fmt"
	"math"
)

const intro = `## What is measured

- **limiter, AcquireRelease**: one acquire and release of a slot. *uncontended*: one
  goroutine, slots to spare; *parallel*: every CPU on one lane with slots to spare, so
  only the lane's lock is shared; *waiters-N*: N goroutines (classes mixed) contend for
  one slot, so nearly every acquisition queues and every release hands the slot over.
  Anchors: ` + "`golang.org/x/sync/semaphore`" + ` and a buffered-channel semaphore, neither of
  which has classes, aging, reserve, queue timeouts or statistics. With waiters the
  figure is mostly the Go scheduler handing one slot between goroutines (and, at 100,000,
  the garbage collector scanning their stacks), so it moves by tens of percent between
  runs for every implementation. On top of that llmlanes makes its grant decision
  (classes, aging, the wait statistics: the Grant rows) and reads the clock twice; it
  allocates nothing per queued call (waiters are reused, and the lane keeps one
  queue-timeout timer, not one per waiter), its class heaps are written out rather than
  called through ` + "`container/heap`" + `'s interface, and the release path no longer copies a 5 KiB
  histogram onto the stack (it did, and every goroutine that released a slot had to grow
  its stack to 8 KiB, again after each collection shrank it: that cost more than the
  grant decision).
- **limiter, Grant**: the data-structure cost of one grant decision (pick the next waiter
  among the class heaps, dequeue, grant, record the wait) with N calls queued, goroutine
  scheduling left out. The algorithm is O(log n); above a few thousand waiters the heap
  no longer fits in cache and memory latency adds to that. GrantTenants: the same with
  100,000 calls of 1, 10 and 1,000 named tenants, whose shares are then measured (the
  tenants' heads are heaps by service: O(log n) in the tenants too).
- **lanehttp, Overhead**: one model call (a 360-byte chat completion body) through a
  base transport that answers from memory, bare and wrapped in a ` + "`lanehttp.Transport`" + `:
  the difference is what a lane adds to a call (reading and checking the body, finding
  the model, the slot, the timeout guards, the exchange report), free of network noise.
  *lanes-no-timeouts* leaves ResponseHeaderTimeout and StallTimeout unset, which saves
  the cancelable context and the two timers.
- **lanehttp, Estimate**: the token estimate of a chat completion whose user message is 1,
  4 and 16 KiB of English text (` + "`lanehttp.EstimateTokens`" + `, made at admission for every
  model call): per KiB of prompt, as MB/s.
- **lanehttp, Route**: what admission reads of a body: its model (` + "`lanehttp.ModelOf`" + `,
  which also checks it is JSON) and its token estimate, for a 1 MiB body of top-level
  keys (75,000 and 55,000), written plainly (` + "`\"key000001\"`" + `) and with escapes
  (` + "`\"\\u006b000001\"`" + `): a client chooses its body, and its escapes must not make
  admission costly (each key is decoded once, into a fixed buffer).
- **limiter, AcquireRelease/uncontended/llmlanes-budget**: the uncontended acquire and
  release with a ` + "`tokens_per_minute`" + ` budget that never runs out, each call estimated at
  1,000 tokens and settled at 800: the budget's look, charge and settlement.
- **lanehttp, RoundTrip**: the same call over loopback HTTP, for scale: the network
  round trip dwarfs the lane, and its run-to-run noise is larger than the lane's cost.
- **otelbridge, Bridge**: one call's limiter events (acquire, exchange report, release)
  with no observer, with the bridge keeping its metrics (it counts them itself and hands
  them to readers as a Producer, so that an evicted lane's series end with it) and no
  tracing set up, and with the queue-wait and upstream spans inside a sampled call span
  too (span creation dominates).
- **telemetry, Routes**: serving the snapshot, the classification, and a ` + "`/metrics`" + ` scrape
  (OTel exporter, Go and process collectors) with 100 lanes, each with history and a
  queued call: what polling every second, or a 15 s scrape, costs.
- **lanes-exporter, Proxy**: a streamed chat completion against a gateway that answers at
  once, sequentially, direct and through the proxy (lanes on, uncontended): latency
  percentiles, with client, proxy and gateway in the test's process (so the client's
  work hides some of the proxy's; what an operator sees, each in its own process, is in
  the section beside HAProxy below). **ProxyThroughput**: 32 concurrent clients against the simulator (capacity
  32, 10 tokens of 2 ms each), direct and through a lane of 32: calls per second.
  **QueuedMemory**: heap and stacks per call queued behind a held slot, with client and
  proxy in one process (so the client's side is counted too).
- **sharedlane, Shared**: a lane in Redis (a local redis-server, as ` + "`make tools`" + ` installs
  it). *uncontended/acquire-release*: one acquire and release through a limiter on the
  backend, two calls of lane.lua (FCALL: Redis holds it as a function library, loaded
  once); anchor *2xping*: two PINGs, the two round trips the pair cannot do without.
  *acquire-release-tenants-budget*: the same with three tenants taking turns and a
  tokens_per_minute budget (each call estimated at 100 tokens). *interleaved*: the goals'
  ratios, each iteration timing two PINGs, a plain pair and a pair with tenants and a
  budget, the ratios those of the medians, so that the machine's drift (the anchor
  measured apart moved from 58 to 104 µs between runs on this VM) moves all three
  together. Each iteration runs the three in an order of its own (a seeded shuffle):
  on this VM what ran just before a round trip moves it by a fifth. In a fixed order
  (PINGs, plain pair, tenants' pair) the PINGs, after the tenants' pair, took 90 µs and
  the plain pair, after the PINGs, 146; with no tenants' pair in the loop the same two
  took 112 and 124. The fixed order gave 1.51 to 1.61x for the plain pair, the
  shuffled order 1.20 to 1.36x in the same hour. What the pair costs,
  profiled with INFO commandstats and the Go CPU profile: the two round trips (the
  system calls are most of the Go side's CPU, as for the PINGs), then Redis' time in
  lane.lua, then the limiter and the backend in Go. Profiled by hand on 2026-12-07
  (INFO commandstats over 20,000 pairs, MONITOR, on this VM type): a plain pair runs
  13 Redis commands (TIME and one HMGET of the lane's meta hash each; HVALS, ZADD and
  two HSETs and two PEXPIREs to grant; HGET, ZREM and HDEL to release), a pair with
  tenants and a budget 18 (16 and 35 before lane.lua read the meta hash and a
  tenant's fields once a call, wrote the counter and the bucket once, skipped what an
  empty queue makes moot and re-expired only the keys a call may have made). Their own
  time is about a sixth of the FCALLs'. The rest is Lua and the cost of calling Redis
  from it, and it follows the CPU's caches more than the code: the plain pair run
  100,000 times inside one FCALL (caches warm) takes 27 µs; as one FCALL a round trip
  (redis-benchmark, one connection) it takes 71 µs more than a PING. *floor* measures
  the least any script costs here: a logic-free function (` + "`bareScript`" + ` in
  sharedlane/bench_test.go) running the same thirteen commands with the same keys and
  arguments, its pair of FCALLs interleaved with two PINGs and a plain pair as
  *interleaved* does. Its ratio to two PINGs is the part of the goals no order can
  remove on this machine; the plain pair's ratio to it is what lane.lua's order and the
  Go side add. Fewer commands moved the interleaved
  ratios little (runs alternating the two versions of lane.lua, three each: plain
  1.92 to 1.96x before, 1.90 to 1.95x after; tenants and budget 2.26x before, 2.08 to
  2.19x after); Redis' CPU per call is what they save. The Go side's time is its system calls,
  as the PINGs' (49 allocations a pair, down from 85 once the keys and fixed arguments
  of an FCALL were boxed once per lane, and the ratio did not move). What Redis' CPU per pair has beyond the two PINGs' (the
  column) is the FCALL itself (eleven keys and eleven arguments to read into Lua) and
  lane.lua's few commands: Lua's own speed, so this part of the ratio follows the CPU
  (the two PINGs' CPU does not move between machines; the pair's does), and the goals'
  ratios are met on one VM type and not on another. lane.lua run as a
  plain script (EVALSHA, on a Redis without functions) also makes its sixty-odd
  functions on every call, which costs more than the rest of the call: that is why it
  is loaded as a library. *handover*: a release in one process's limiter and the grant of the call
  waiting in another's (script, pub/sub message, claim), timed from the release to the
  grant. Redis' own CPU per 1,000 calls comes from its INFO counters.
- Memory of the 5-minute statistics is bounded by construction: at most 31 step
  histograms of 3.4 KB plus their 3.4 KB sum per lane, about 110 KB, whatever the
  grant rate (` + "`TestWindowMemoryBounded`" + ` records 10,000 grants/s for 6 minutes and checks
  the bound and that recording no longer allocates).
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

var goals = []goal{
	absGoal("limiter off: under 5 ns, 0 allocs", "BenchmarkAcquireRelease/uncontended/llmlanes-off", 5, 0),
	ratioGoal("limiter uncontended: within 2x of x/sync/semaphore, 0 allocs",
		"BenchmarkAcquireRelease/uncontended/llmlanes", "BenchmarkAcquireRelease/uncontended/semaphore", 2, 0),
	ratioGoal("limiter parallel, one lane: within 2x of x/sync/semaphore, 0 allocs",
		"BenchmarkAcquireRelease/parallel/llmlanes", "BenchmarkAcquireRelease/parallel/semaphore", 2, 0),
	ratioGoal("limiter, 1,000 goroutines contending for one slot: within 1.5x of x/sync/semaphore per hand-over (allocations: reported)",
		"BenchmarkAcquireRelease/waiters-1000/llmlanes", "BenchmarkAcquireRelease/waiters-1000/semaphore", 1.5, 1e9),
	ratioGoal("limiter, 100,000 goroutines contending for one slot: within 1.5x of x/sync/semaphore per hand-over (allocations: reported)",
		"BenchmarkAcquireRelease/waiters-100000/llmlanes", "BenchmarkAcquireRelease/waiters-100000/semaphore", 1.5, 1e9),
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
	logGoal("grant cost 1,000 → 100,000 waiters: no worse than logarithmic (x2 allowance for cache misses)",
		"BenchmarkGrant/waiters", 1000, 100000, "", 2),
	ratioGoal("grant, 100,000 waiters of one named tenant (its share measured): within 1.5x of calls that name none",
		"BenchmarkGrantTenants/tenants-1", "BenchmarkGrant/waiters-100000", 1.5, 1e9),
	logGoal("grant, 100,000 waiters of 10 → 1,000 tenants: no worse than logarithmic in the tenants (x2 allowance)",
		"BenchmarkGrantTenants/tenants", 10, 1000, "", 2),
	absGoal("token estimate of a 4 KiB prompt: under 10 µs, 0 allocs", "BenchmarkEstimate/prompt-4KiB", 10000, 0),
	ratioGoal("model and token estimate of a 1 MiB body whose keys are written with escapes: within 2x of one with plain keys, one allocation (the model's name)",
		"BenchmarkRoute/escaped-keys", "BenchmarkRoute/plain-keys", 2, 1),
	ratioGoal("limiter uncontended with a tokens_per_minute budget, each call estimated and settled: cost beside no budget (reported; a budget reads the clock for every grant)",
		"BenchmarkAcquireRelease/uncontended/llmlanes-budget", "BenchmarkAcquireRelease/uncontended/llmlanes", 1e9, 0),
	metricMaxGoal("shared lane (Redis): uncontended acquire and release within 1.5x of two PINGs (its two round trips), interleaved in a shuffled order, medians",
		"BenchmarkShared/uncontended/interleaved", "plain-x-2xping", 1.5),
	metricMaxGoal("shared lane with tenants named and a token budget: acquire and release within 2x of two PINGs, interleaved in a shuffled order, medians",
		"BenchmarkShared/uncontended/interleaved", "tenants-budget-x-2xping", 2),
	ratioGoal("shared lane: uncontended acquire and release beside two PINGs, measured apart, means (reported)",
		"BenchmarkShared/uncontended/acquire-release", "BenchmarkShared/uncontended/2xping", 1e9, 1e9),
	ratioGoal("shared lane with tenants and a budget: beside two PINGs, measured apart, means (reported)",
		"BenchmarkShared/uncontended/acquire-release-tenants-budget", "BenchmarkShared/uncontended/2xping", 1e9, 1e9),
	metricMaxGoal("shared lane: a logic-free script running a plain pair's 13 Redis commands, beside two PINGs, interleaved in a shuffled order, medians (reported: the least any script with a lease, a record and a counter costs on this machine)",
		"BenchmarkShared/uncontended/floor", "bare-x-2xping", 1e9),
	metricMaxGoal("shared lane: the plain pair beside that script, interleaved in the same loop (reported: what lane.lua's order and the Go side add)",
		"BenchmarkShared/uncontended/floor", "plain-x-bare", 1e9),
	metricMaxGoal("shared lane with tenants and a budget: Redis CPU per 1,000 calls (reported)",
		"BenchmarkShared/uncontended/acquire-release-tenants-budget", "redis-cpu-ms/1000calls", 1e9),
	metricRatioMaxGoal("shared lane: a grant with 100 tenants waiting within 2x of one with a single tenant (lane.lua's time per call, INFO commandstats)",
		"BenchmarkShared/grant/tenants-100", "BenchmarkShared/grant/tenants-1", "script-µs/call", 2),
	metricMaxGoal("shared lane: a PING's p99 while 3,000 waiters give up at once, under 20 ms (it was 235 ms)",
		"BenchmarkShared/mass-cancel-3000", "ping-p99-µs", 20000),
	metricMaxGoal("shared lane: hand-over from a release in one process to the grant in another, p50 (reported)",
		"BenchmarkShared/handover", "p50-µs", 1e9),
	metricMaxGoal("shared lane: hand-over p99 (reported)", "BenchmarkShared/handover", "p99-µs", 1e9),
	metricMaxGoal("shared lane: Redis CPU per 1,000 calls (reported; two PINGs: see the table)",
		"BenchmarkShared/uncontended/acquire-release", "redis-cpu-ms/1000calls", 1e9),
}
