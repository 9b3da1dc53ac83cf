package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// params are every setting of a run; the report prints them all.
type params struct {
	Rounds            int            `json:"rounds"`
	Calls             int            `json:"calls"`
	Warm              int            `json:"warm"`
	LatencyLimit      int            `json:"latency_limit"`
	ThroughputLimit   int            `json:"throughput_limit"`
	ThroughputCallers int            `json:"throughput_callers"`
	ThroughputMs      int            `json:"throughput_ms"`
	ThroughputSeconds int            `json:"throughput_seconds"`
	PriorityLimit     int            `json:"priority_limit"`
	PriorityBacklog   int            `json:"priority_backlog"`
	PriorityMs        int            `json:"priority_ms"`
	Queued            []int          `json:"queued"`
	QueueRounds       int            `json:"queue_rounds"`
	Variant           string         `json:"variant,omitempty"`
	Overload          overloadParams `json:"overload"`
}

// report is what proxybench prints: the goals, checked, and the section
// of docs/BENCHMARKS.md.
type report struct {
	Params   params  `json:"params"`
	Samples  samples `json:"samples"`
	Goals    []goal  `json:"goals"`
	Markdown string  `json:"markdown"`
}

type goal struct {
	Text     string `json:"text"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// times formats a ratio with two significant digits at least.
func times(r float64) string {
	if r > -0.1 && r < 0.1 {
		return fmt.Sprintf("%.2gx", r)
	}
	return fmt.Sprintf("%.2fx", r)
}

func spread(v []float64) string {
	if len(v) == 0 {
		return "not run"
	}
	f := "%.0f"
	if m := median(v); m < 10 && m > -10 {
		f = "%.2f"
	} else if m < 100 && m > -100 {
		f = "%.1f"
	}
	if len(v) == 1 {
		return fmt.Sprintf(f, v[0])
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", median(v), slices.Min(v), slices.Max(v))
}

// row is a figure compared, reported beside HAProxy's and the Go floor's:
// none of them is a goal (docs/DESIGN.md, "Performance": a few hundred
// microseconds of a proxy are nothing beside a model call of seconds;
// what a user gets under overload is, in overloadSection).
type row struct {
	key, label string
}

// rows are the figures compared, but for memory, whose rows follow the
// numbers of calls queued.
var rows = []row{
	{"p50_added_us", "added latency p50, µs"},
	{"p99_added_us", "added latency p99, µs"},
	{"cpu_us_per_call", "proxy CPU per call, µs"},
	{"calls_per_s", "throughput at the limit, calls/s"},
	{"interactive_wait_ms", "interactive call behind the bulk backlog, ms"},
}

func newReport(p params, s samples) *report {
	r := &report{Params: p, Samples: s}
	var b strings.Builder
	fmt.Fprintf(&b, "Settings: %d interleaved rounds; latency: %d sequential calls on one connection after %d to warm up, "+
		"a lane of %d (never full), the gateway direct in the same round as the reference; throughput: %d callers, a lane of %d, "+
		"calls of %d ms, %d s; priority: a lane of %d full of bulk calls of %d ms and %d more queued, then one interactive call "+
		"(lanes-exporter keeps its default interactive reserve of 1 here, which HAProxy has no equivalent for, and none elsewhere); "+
		"memory: %v calls queued behind the one call holding a lane of 1, a fresh proxy each time, %d rounds. "+
		"Each figure: the median of the rounds (lowest–highest). "+
		"*Go floor*: the least a Go proxy on net/http does for the same lane, measured in the same rounds: a bare "+
		"`httputil.ReverseProxy` (its Transport set as lanes-exporter's) behind a channel semaphore, first come first served, "+
		"HTTP/1.1 and HTTP/2 cleartext, no priorities (so no priority figure), no body checks, statistics or telemetry "+
		"(`internal/tools/proxybench/floor.go`). What it costs beside HAProxy is net/http's; what lanes-exporter costs beside it "+
		"is llmlanes'.\n\n",
		p.Rounds, p.Calls, p.Warm, p.LatencyLimit, p.ThroughputCallers, p.ThroughputLimit, p.ThroughputMs, p.ThroughputSeconds,
		p.PriorityLimit, p.PriorityMs, p.PriorityBacklog, p.Queued, p.QueueRounds)
	fmt.Fprintf(&b, "| measure | lanes-exporter | Go floor | HAProxy | lanes-exporter / HAProxy | Go floor / HAProxy |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: |\n")
	fmt.Fprintf(&b, "| gateway direct: latency p50 / p99, µs | %s / %s | | | | |\n", spread(s["direct/p50_us"]), spread(s["direct/p99_us"]))
	all := slices.Clone(rows)
	for _, n := range p.Queued {
		all = append(all,
			row{fmt.Sprintf("rss_kib_per_queued_http1_%d", n), fmt.Sprintf("RSS per queued call, HTTP/1.1, %d queued, KiB", n)},
			row{fmt.Sprintf("rss_kib_per_queued_h2c_%d", n), fmt.Sprintf("RSS per queued call, HTTP/2, %d queued, KiB", n)})
	}
	for _, x := range all {
		l, h := s["lanes/"+x.key], s["haproxy/"+x.key]
		if len(l) == 0 && len(h) == 0 {
			continue // not measured (-only)
		}
		ratio := median(l) / median(h)
		fl, flRatio := "", ""
		if f := s[floor+"/"+x.key]; len(f) > 0 {
			fl, flRatio = spread(f), times(median(f)/median(h))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", x.label, spread(l), fl, spread(h), times(ratio), flRatio)
		if v := s[variant+"/"+x.key]; len(v) > 0 {
			fmt.Fprintf(&b, "| %s, lanes-exporter with `%s` | %s | | %s | %s | |\n", x.label, p.Variant, spread(v), spread(h), times(median(v)/median(h)))
		}
	}
	if len(s["lanes/noload_p50_ms"]) > 0 {
		b.WriteString(overloadSection(p.Overload, s, r))
	}
	r.Markdown = b.String()
	return r
}

// rerender reads a saved run and renders its figures again.
func rerender(file string) (*report, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return newReport(r.Params, r.Samples), nil
}
