package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A short run against the real parts (lanes-exporter and Debian's
// haproxy, as make tools installs it): every figure is there for both
// proxies and the Go floor, all three hold the lane's limit, both proxies
// serve the interactive call first, and the goals are checked. The figures themselves are make
// bench's: here the machine is busy with other tests.
func TestQuickRun(t *testing.T) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Fatal("haproxy is not installed: run make tools (Debian's haproxy package)")
	}
	dir := t.TempDir()
	for _, pkg := range []string{"../../../cmd/lanes-exporter", "."} {
		if out, err := exec.Command("go", "build", "-o", dir, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "proxybench"), "-quick", "-lanes", filepath.Join(dir, "lanes-exporter"), "-variant", "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("proxybench: %v", err)
	}
	var r report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	p := r.Params
	one := func(key string) float64 {
		t.Helper()
		v := r.Samples[key]
		if len(v) != p.Rounds {
			t.Fatalf("%s: %d figures, want one per round (%d)", key, len(v), p.Rounds)
		}
		return v[0]
	}
	one("direct/p50_us")
	for _, px := range []string{"lanes", "haproxy", variant, floor} {
		if cpu := one(px + "/cpu_us_per_call"); cpu <= 0 {
			t.Errorf("%s: CPU per call %v", px, cpu)
		}
		one(px + "/p50_added_us")
		one(px + "/p99_added_us")
	}
	// Unbounded, the callers would make twice the calls: a rate within the
	// lane's bound says the proxy held it.
	bound := float64(p.ThroughputLimit) * 1000 / float64(p.ThroughputMs)
	for _, px := range withFloor {
		if v := one(px + "/calls_per_s"); v <= 0 || v > 1.05*bound {
			t.Errorf("%s: %.0f calls/s with a lane of %d and calls of %d ms (bound %.0f)", px, v, p.ThroughputLimit, p.ThroughputMs, bound)
		}
		for _, n := range p.Queued {
			for _, proto := range []string{"http1", "h2c"} {
				if v := r.Samples[px+"/rss_kib_per_queued_"+proto+"_"+strconv.Itoa(n)]; len(v) != p.QueueRounds || v[0] <= 0 || v[0] > 1024 {
					t.Errorf("%s: RSS per queued call over %s: %v KiB", px, proto, v)
				}
			}
		}
	}
	// Served first: in the order of arrival it would wait for the whole
	// backlog, (backlog/limit) x ms = 25 s. lanes-exporter's reserve
	// serves it at once; HAProxy's priority class, at the next free slot.
	if w := one("lanes/interactive_wait_ms"); w > float64(p.PriorityMs)/2 {
		t.Errorf("lanes-exporter: the interactive call waited %.0f ms", w)
	}
	if w := one("haproxy/interactive_wait_ms"); w > 2*float64(p.PriorityMs) {
		t.Errorf("HAProxy: the interactive call waited %.0f ms: are its priority classes set?", w)
	}
	// Under overload the lane holds the gateway to its capacity, and the
	// callers it cannot serve in time are answered, not left to time out
	// at the gateway; with no limiter the gateway takes every caller.
	o := p.Overload
	for _, l := range o.Levels {
		pre := "/overload_" + levelKey(l) + "_"
		for _, path := range overloadPaths {
			if v := one(path + pre + "calls_per_min"); v <= 0 || v > 1.05*o.capacityPerMin() {
				t.Errorf("%s at %s: %.0f calls a minute from a gateway that completes %.0f", path, levelKey(l), v, o.capacityPerMin())
			}
		}
		for _, path := range []string{"lanes", "haproxy"} {
			if v := one(path + pre + "max_at_gateway"); v > float64(o.Capacity) {
				t.Errorf("%s at %s: %.0f calls at the gateway at once, a lane of %d", path, levelKey(l), v, o.Capacity)
			}
		}
		if v := one("none" + pre + "max_at_gateway"); v <= float64(o.Capacity) {
			t.Errorf("no limiter at %s: at most %.0f calls at the gateway; the load does not overload it", levelKey(l), v)
		}
		if v := one("lanes" + pre + "failed_pct"); v <= 0 {
			t.Errorf("lanes at %s: no caller answered early; the load does not overload the lane", levelKey(l))
		}
	}
	if len(r.Goals) != 3*len(o.Levels) {
		t.Errorf("%d goals checked", len(r.Goals))
	}
	for _, want := range []string{"| added latency p50, µs |", "| RSS per queued call, HTTP/2, " + strconv.Itoa(p.Queued[0]) + " queued, KiB |", "`GOMAXPROCS=1`", "| Go floor / HAProxy |", "### Goodput under overload", "| 3x | calls answered a minute |"} {
		if !strings.Contains(r.Markdown, want) {
			t.Errorf("the section lacks %q", want)
		}
	}
}
