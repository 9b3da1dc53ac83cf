package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

const sample = `goos: linux
cpu: Test CPU
BenchmarkAcquireRelease/uncontended/llmlanes-2   	 100	 40.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkAcquireRelease/uncontended/llmlanes-2   	 100	 44.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkAcquireRelease/uncontended/llmlanes-2   	 100	 42.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkAcquireRelease/uncontended/semaphore-2  	 100	 20.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkAcquireRelease/uncontended/llmlanes-off-2	 100	 2.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkProxy/stream/direct-2	 10	 1000 ns/op	 12.5 p50-µs	 64 B/op	 1 allocs/op
BenchmarkAcquireRelease/parallel/llmlanes-2	 100	 30.0 ns/op	 8 B/op	 1 allocs/op
BenchmarkAcquireRelease/parallel/semaphore-2	 100	 20.0 ns/op	 0 B/op	 0 allocs/op
BenchmarkShared/uncontended/acquire-release-tenants-budget-2	 100	 300000 ns/op	 250 redis-cpu-ms/1000calls
BenchmarkShared/uncontended/floor-2	 100	 400000 ns/op	 1.20 plain-x-bare	 1.70 tenants-budget-x-bare
`

func TestParseTakesMedianAndStripsProcs(t *testing.T) {
	res, info := parse(strings.NewReader(sample))
	if info.cpu != "Test CPU" {
		t.Fatalf("cpu %q", info.cpu)
	}
	r := res["BenchmarkAcquireRelease/uncontended/llmlanes"]
	if r == nil || r.metrics["ns/op"] != 42 {
		t.Fatalf("median: %+v", r)
	}
	if v := res["BenchmarkProxy/stream/direct"].metrics["p50-µs"]; v != 12.5 {
		t.Fatalf("custom metric %v", v)
	}
}

// Output rendered again (-in) is dated by when it was measured, which
// the saved output says; without that line, by today.
func TestReportDatedByTheRun(t *testing.T) {
	res, info := parse(strings.NewReader(measuredOn + "2026-11-30\n" + sample))
	var b bytes.Buffer
	report(&b, res, info, "go test", nil)
	if !strings.Contains(b.String(), "`go run ./internal/tools/benchreport`) on 2026-11-30, ") {
		t.Errorf("not dated by the run:\n%.300s", b.String())
	}
	_, info = parse(strings.NewReader(sample))
	if info.date != "" {
		t.Errorf("a date %q from output that has none", info.date)
	}
}

func TestReportRatiosAndGoals(t *testing.T) {
	res, info := parse(strings.NewReader(sample))
	var b bytes.Buffer
	report(&b, res, info, "go test", nil)
	out := b.String()
	for _, want := range []string{
		"| uncontended | llmlanes | 42.0 | 0 | 0 |  | 2.10x semaphore |",
		"| limiter uncontended: 0 allocs (beside x/sync/semaphore: reported) | 42.0 ns vs 20.0 ns = 2.10x, 0 allocs | yes |",
		"| limiter parallel, one lane: 0 allocs (beside x/sync/semaphore: reported) | 30.0 ns vs 20.0 ns = 1.50x, 1 allocs | **no** |",
		"| shared lane with tenants and a budget: at least 5,000 grants a second on one Redis core | 4000 grants/s (250 µs of Redis CPU a call) | **no** |",
		"within 1.25x of a logic-free script running its 13 Redis commands, interleaved in a shuffled order, medians | 1.2 plain-x-bare | yes |",
		"within 1.6x of the same logic-free script, interleaved in the same loop | 1.7 tenants-budget-x-bare | **no** |",
		"| limiter off: under 5 ns, 0 allocs | 2.00 ns, 0 allocs | yes |",
		"| grant cost 1,000 → 100,000 waiters",
		"not run",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q\n%s", want, out)
		}
	}
}

// The proxy's figures beside HAProxy join the goals and get their section,
// with the profile that explains the goals they miss.
func TestReportWithProxy(t *testing.T) {
	res, info := parse(strings.NewReader(sample))
	px := &proxyReport{Markdown: "| added latency p50, µs | 287 | 73.4 | 3.91x | ≤ 1.5x |\n",
		Goals: []proxyGoal{{"beside HAProxy, added latency p50, µs: at most 1.5x HAProxy's", "287 vs 73.4 = 3.91x", false}}}
	var b bytes.Buffer
	report(&b, res, info, "go test", px)
	out := b.String()
	for _, want := range []string{
		"| beside HAProxy, added latency p50, µs: at most 1.5x HAProxy's | 287 vs 73.4 = 3.91x | **no** |",
		"## lanes-exporter beside HAProxy",
		"| added latency p50, µs | 287 |",
		"[notes/proxy-profile.md](notes/proxy-profile.md)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Index(out, "## lanes-exporter beside HAProxy") < strings.Index(out, "| beside HAProxy, added latency") {
		t.Error("the proxy's goals are not in the goals table")
	}
}

// BENCHMARKS.md's hand-written parts state what is measured and how to
// read it: no date (a profile with its date is a note in docs/notes/).
func TestHandWrittenPartsUndated(t *testing.T) {
	dated := regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b|\b(no longer|until 20|it was|used to)\b`)
	for name, text := range map[string]string{"intro": intro, "proxyIntro": proxyIntro, "proxyNotes": proxyNotes} {
		if m := dated.FindString(text); m != "" {
			t.Errorf("%s: dated prose %q", name, m)
		}
	}
}
