package replay

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
)

// Classes are the call classes, in report order.
var Classes = []string{"interactive", "default", "bulk"}

// Report is one scenario's outcome; every duration is simulated time.
type Report struct {
	Scenario string
	Options  Options
	Classes  map[string]*ClassStats
	// Panels and PanelsDone count the review panels and those whose every
	// finder call completed; PanelsFinishedAt is when the last of them did,
	// 0 unless all did.
	Panels           int
	PanelsDone       int
	PanelsFinishedAt time.Duration
	PanelTimes       []PanelTime   // each panel, in start order
	IdleTTFT         time.Duration // first-token time of one call to the idle gateway
	Retries          int           // retries the clients sent
	RequestTimeouts  int           // attempts abandoned on a timeout
	// FastFails counts failed calls that ended in the queue without
	// reaching the gateway; FailedAfterGateway, the others.
	FastFails          int
	FailedAfterGateway int
	Gateway            gatewaysim.Stats
	Samples            []Sample // every PollEvery
	Chats              []Point  // each completed chat turn's time to first token, by start
	Grants             []Grant  // every acquisition's end, in order
	// Tokens are the figures against the gateway's tokens-per-minute
	// limit, with Options.TokensPerMinute.
	Tokens *TokenFigures
}

// ClassStats are one class's figures.
type ClassStats struct {
	Calls, Completed int
	Failed           map[string]int // by reason: queue timeout, request timeout, 429, 5xx, broken stream
	// Queue waits (granted and timed out; with lanes only) and times to
	// first token (from the call's start, over its retries; completed
	// calls only).
	WaitP50, WaitP99, TTFTP50, TTFTP99 time.Duration
	waits, ttfts                       []time.Duration
}

// Sample is the state at one poll.
type Sample struct {
	At      time.Duration
	Gateway int                      // calls in progress at the gateway
	Queued  limiter.QueuedByPriority // waiting in the lanes, by own class
	// OldestWait is how long the longest-waiting call has waited (0 if
	// none waits), from the replay's own record.
	OldestWait time.Duration
	State      classify.State // the classification route's answer ("" without lanes)
	// GatewayVerdict: the route listed a gateway reason; Fault: the
	// gateway was failing (the ground truth).
	GatewayVerdict bool
	Fault          bool
	// Limit is the lane's limit in force (0 without lanes); Capacity the
	// gateway's.
	Limit, Capacity int
}

// PanelTime is one review panel: whose (the agent, or board), when it
// started, and how long until its last finder completed (0 unless all did).
type PanelTime struct {
	Agent int
	Start time.Duration
	Took  time.Duration  // 0 if not all its finders finished
	Lost  map[string]int // its finders that failed, by reason
}

// Point is a value at a simulated time.
type Point struct {
	At    time.Duration
	Value float64
}

// Grant is how one acquisition ended: granted or timed out.
type Grant struct {
	Class                 string
	Arrival, Asked, Ended time.Duration // the call's start, this attempt's request for a slot, the end of the wait
	Granted               bool
}

func newReport(scenario string, o Options) *Report {
	r := &Report{Scenario: scenario, Options: o, Classes: map[string]*ClassStats{}}
	for _, c := range Classes {
		r.Classes[c] = &ClassStats{Failed: map[string]int{}}
	}
	return r
}

func (r *Report) class(c string) *ClassStats { return r.Classes[c] }

func (r *Report) finish(panels []panel, st gatewaysim.Stats) {
	for _, c := range r.Classes {
		c.WaitP50, c.WaitP99 = pct(c.waits, 0.5), pct(c.waits, 0.99)
		c.TTFTP50, c.TTFTP99 = pct(c.ttfts, 0.5), pct(c.ttfts, 0.99)
	}
	r.Panels = len(panels)
	last := time.Duration(0)
	for _, p := range panels {
		pt := PanelTime{Agent: p.agent, Start: p.start, Lost: p.failed}
		if p.left == 0 && len(p.failed) == 0 {
			r.PanelsDone++
			last = max(last, p.finished)
			pt.Took = p.finished - p.start
		}
		r.PanelTimes = append(r.PanelTimes, pt)
	}
	if r.PanelsDone == r.Panels {
		r.PanelsFinishedAt = last
	}
	r.Gateway = st
}

// Failed counts the calls that failed, of every class.
func (r *Report) Failed() int {
	n := 0
	for _, c := range r.Classes {
		for _, k := range c.Failed {
			n += k
		}
	}
	return n
}

// pct is the nearest-rank percentile p of xs.
func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// sideBySide writes the header of a Markdown table of rs side by side,
// one column a report, and returns what writes a row.
func sideBySide(w io.Writer, rs []Report) func(name string, f func(Report) string) {
	fmt.Fprint(w, "| |")
	for _, r := range rs {
		fmt.Fprintf(w, " **%s** |", r.Scenario)
	}
	fmt.Fprint(w, "\n| --- |")
	for range rs {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	return func(name string, f func(Report) string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, r := range rs {
			fmt.Fprintf(w, " %s |", f(r))
		}
		fmt.Fprintln(w)
	}
}

// Table writes the scenarios side by side as a Markdown table.
func Table(w io.Writer, rs []Report) {
	row := sideBySide(w, rs)
	lanes := func(r Report) bool { return len(r.Grants) > 0 }
	for _, c := range Classes {
		row(c+": calls / completed", func(r Report) string {
			return fmt.Sprintf("%d / %d", r.Classes[c].Calls, r.Classes[c].Completed)
		})
		row(c+": failed, by reason", func(r Report) string { return reasons(r.Classes[c].Failed) })
		row(c+": queue wait p50 / p99", func(r Report) string {
			if !lanes(r) {
				return "no queue"
			}
			return secs(r.Classes[c].WaitP50) + " / " + secs(r.Classes[c].WaitP99)
		})
		row(c+": time to first token p50 / p99", func(r Report) string {
			if r.Classes[c].Completed == 0 {
				return "none completed"
			}
			return secs(r.Classes[c].TTFTP50) + " / " + secs(r.Classes[c].TTFTP99)
		})
	}
	row("idle gateway's time to first token", func(r Report) string { return secs(r.IdleTTFT) })
	row("review panels finished", func(r Report) string {
		if r.PanelsFinishedAt == 0 {
			return fmt.Sprintf("%d of %d", r.PanelsDone, r.Panels)
		}
		return fmt.Sprintf("all %d, by %s", r.Panels, r.PanelsFinishedAt.Round(time.Second))
	})
	row("request timeouts", func(r Report) string { return fmt.Sprint(r.RequestTimeouts) })
	row("retries sent", func(r Report) string { return fmt.Sprint(r.Retries) })
	row("failed fast in the queue / after reaching the gateway", func(r Report) string {
		return fmt.Sprintf("%d / %d", r.FastFails, r.FailedAfterGateway)
	})
	row("gateway work wasted on abandoned calls (tokens)", func(r Report) string { return fmt.Sprint(r.Gateway.TokensWasted) })
	row("peak concurrency at the gateway", func(r Report) string { return fmt.Sprint(r.Gateway.Peak) })
}

func reasons(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
