package replay

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// AdaptiveBase is the incident's load on a gateway of capacity 6 that the
// lane is not told of, with prompts of three sizes (the gateway takes 20 ms
// per KiB of prompt before the first token, so a finder's first token
// comes 0.5 s later than a chat's even when idle), and the limit sampled
// every second.
func AdaptiveBase() Options {
	o := Incident()
	o.PollEvery = time.Second
	o.ChatBytes, o.CoderBytes, o.FinderBytes = 2048, 8192, 24576
	o.PromptJitter, o.PromptTime = 0.1, 20*time.Millisecond
	return o
}

// adaptiveFrom sets an adaptive limit between 2 (a third of the capacity)
// and 12 (twice it), starting at initial.
func adaptiveFrom(o Options, initial int) Options {
	o.Limit = 12
	o.Adaptive = &limiter.Adaptive{MinInflight: 2, Initial: initial}
	return o
}

func fixed(o Options, limit int) Options {
	o.Limit, o.Adaptive = limit, nil
	return o
}

// The scenarios' changes: the capacity halves at HalvesAt and comes back
// at HalvesBack; the 429 gateway answers 429 above RejectAt in progress.
const (
	HalvesAt   = 4 * time.Minute
	HalvesBack = 7 * time.Minute
	RejectAt   = 6
)

// AdaptiveRun is one run of the adaptive report.
type AdaptiveRun struct {
	Name string
	Report
}

// AdaptiveBundle is every run of docs/ADAPTIVE.md.
type AdaptiveBundle struct {
	Steady    []AdaptiveRun // the incident: fixed limits, the best fixed, adaptive from each bound, no priorities
	BestFixed int
	Halves    []AdaptiveRun // capacity 6 → 3 at 4 min, back at 7 min
	Rejects   []AdaptiveRun // a gateway that answers 429 above 6 in progress (and never slows)
}

// RunAdaptive runs every scenario of the adaptive report.
func RunAdaptive() (AdaptiveBundle, error) {
	var b AdaptiveBundle
	base := AdaptiveBase()
	run := func(name string, o Options) (AdaptiveRun, error) {
		r, err := Run("lanes", o)
		r.Scenario = name
		return AdaptiveRun{name, r}, err
	}
	// The best fixed limit, by calls completed.
	best, bestDone := 0, -1
	for limit := 1; limit <= 12; limit++ {
		r, err := run("", fixed(base, limit))
		if err != nil {
			return b, err
		}
		if n := r.completed(); n > bestDone {
			best, bestDone = limit, n
		}
	}
	b.BestFixed = best
	noPrio := adaptiveFrom(base, 0)
	noPrio.NoPriorities = true
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"fixed 12 (2x capacity)", fixed(base, 12)},
		{"fixed 2 (capacity/3)", fixed(base, 2)},
		{fmt.Sprintf("fixed %d (the best fixed)", best), fixed(base, best)},
		{"adaptive from 2", adaptiveFrom(base, 0)},
		{"adaptive from 12", adaptiveFrom(base, 12)},
		{"adaptive, no priorities", noPrio},
	} {
		r, err := run(c.name, c.o)
		if err != nil {
			return b, err
		}
		b.Steady = append(b.Steady, r)
	}
	halves := base
	halves.CapacityChanges = []CapacityChange{{HalvesAt, 3}, {HalvesBack, 6}}
	for _, c := range []struct {
		name string
		o    Options
	}{{"capacity halves: adaptive", adaptiveFrom(halves, 0)}, {"capacity halves: fixed 6", fixed(halves, 6)}} {
		r, err := run(c.name, c.o)
		if err != nil {
			return b, err
		}
		b.Halves = append(b.Halves, r)
	}
	rejects := base
	rejects.Capacity, rejects.RejectAbove = 100, RejectAt
	for _, c := range []struct {
		name string
		o    Options
	}{{"429 above 6: adaptive", adaptiveFrom(rejects, 0)}, {"429 above 6: fixed 12", fixed(rejects, 12)}} {
		r, err := run(c.name, c.o)
		if err != nil {
			return b, err
		}
		b.Rejects = append(b.Rejects, r)
	}
	return b, nil
}

func (r Report) completed() int {
	n := 0
	for _, c := range r.Classes {
		n += c.Completed
	}
	return n
}

// Track follows the limit against a target from from to to (0: the end
// of the load): Reached is how long after from the limit first came
// within one slot of the target (-1 if it never did); Outside is how long,
// after that, it was further away; Lo and Hi are the limits seen after
// Reached.
type Track struct {
	Reached, Outside time.Duration
	Lo, Hi           int
}

// Follow tracks the limit against target(s) between from and to.
func (r Report) Follow(from, to time.Duration, target func(Sample) int) Track {
	if to == 0 {
		to = r.Options.Duration
	}
	t := Track{Reached: -1, Lo: math.MaxInt}
	var prev time.Duration
	for _, s := range r.Samples {
		if s.At < from || s.At >= to {
			continue
		}
		near := abs(s.Limit-target(s)) <= 1
		switch {
		case t.Reached < 0 && near:
			t.Reached = s.At - from
		case t.Reached >= 0 && !near:
			t.Outside += s.At - prev
		}
		if t.Reached >= 0 {
			t.Lo, t.Hi = min(t.Lo, s.Limit), max(t.Hi, s.Limit)
		}
		prev = s.At
	}
	return t
}

func capacity(s Sample) int { return s.Capacity }

// Above is how long the limit was above n.
func (r Report) Above(n int) time.Duration {
	var d, prev time.Duration
	for _, s := range r.Samples {
		if s.At > r.Options.Duration {
			break
		}
		if s.Limit > n {
			d += s.At - prev
		}
		prev = s.At
	}
	return d
}

func (t Track) String() string {
	if t.Reached < 0 {
		return "never"
	}
	return fmt.Sprintf("after %s; then %s outside (limits %d–%d)", t.Reached.Round(time.Second), t.Outside.Round(time.Second), t.Lo, t.Hi)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// adaptiveTable writes runs side by side.
func adaptiveTable(w io.Writer, runs []AdaptiveRun, extra ...extraRow) {
	var rs []Report
	for _, r := range runs {
		rs = append(rs, r.Report)
	}
	row := func(name string, f func(Report) string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, r := range rs {
			fmt.Fprintf(w, " %s |", f(r))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, "| |")
	for _, r := range rs {
		fmt.Fprintf(w, " **%s** |", r.Scenario)
	}
	fmt.Fprint(w, "\n| --- |")
	for range rs {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	row("calls completed", func(r Report) string { return fmt.Sprint(r.completed()) })
	row("chat: queue wait p99", func(r Report) string { return secs(r.Classes["interactive"].WaitP99) })
	row("chat: time to first token p50 / p99", func(r Report) string {
		return secs(r.Classes["interactive"].TTFTP50) + " / " + secs(r.Classes["interactive"].TTFTP99)
	})
	row("idle gateway's time to first token (a chat's prompt)", func(r Report) string { return secs(r.IdleTTFT) })
	row("review panels finished", func(r Report) string {
		if r.PanelsFinishedAt == 0 {
			return fmt.Sprintf("%d of %d", r.PanelsDone, r.Panels)
		}
		return fmt.Sprintf("all %d, by %s", r.Panels, r.PanelsFinishedAt.Round(time.Second))
	})
	row("failed: queue timeouts / after the gateway", func(r Report) string { return fmt.Sprintf("%d / %d", r.FastFails, r.FailedAfterGateway) })
	row("request timeouts / retries", func(r Report) string { return fmt.Sprintf("%d / %d", r.RequestTimeouts, r.Retries) })
	row("429s from the gateway", func(r Report) string { return fmt.Sprint(r.Gateway.RateLimited) })
	row("peak concurrency at the gateway", func(r Report) string { return fmt.Sprint(r.Gateway.Peak) })
	for _, x := range extra {
		row(x.name, func(r Report) string {
			if r.Options.Adaptive == nil {
				return "fixed"
			}
			return x.f(r)
		})
	}
}

type extraRow struct {
	name string
	f    func(Report) string
}

// LimitChart draws the limit, the gateway's capacity and the calls in
// progress at the gateway over time.
func LimitChart(w io.Writer, r Report) {
	const width, pw, ph, left = 760, 660, 200, 60
	end, top := 60.0, 4.0
	for _, s := range r.Samples {
		end = math.Max(end, s.At.Seconds())
		top = math.Max(top, float64(max(s.Limit, s.Capacity, s.Gateway)))
	}
	top = math.Min(top, 16)
	x := func(sec float64) float64 { return left + sec/end*pw }
	y := func(v float64) float64 { return 40 + ph - math.Min(v, top)/top*ph }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, ph+90)
	fmt.Fprintln(w, `<rect width="100%" height="100%" fill="white"/>`)
	fmt.Fprintf(w, `<text x="%d" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", left, r.Scenario)
	fmt.Fprintf(w, `<rect x="%d" y="40" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, pw, ph)
	fmt.Fprintf(w, `<text x="%d" y="50" text-anchor="end">%.0f</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n", left-4, top, left-4, 40+ph)
	for m := 0.0; m <= end; m += 120 {
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%.0f min</text>`+"\n", x(m), 40+ph+14, m/60)
	}
	for i, l := range []struct {
		name, color string
		v           func(Sample) int
	}{
		{"capacity", "#c33", func(s Sample) int { return s.Capacity }},
		{"lane limit", "#393", func(s Sample) int { return s.Limit }},
		{"in progress at the gateway", "#36c", func(s Sample) int { return s.Gateway }},
	} {
		var b strings.Builder
		for _, s := range r.Samples {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(s.At.Seconds()), y(float64(l.v(s))))
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", l.color, strings.TrimSpace(b.String()))
		fmt.Fprintf(w, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", left+i*200, 40+ph+32, l.color, l.name)
	}
	fmt.Fprintln(w, "</svg>")
}

// Files renders docs/ADAPTIVE.md and its charts, by file name.
func (b AdaptiveBundle) Files() map[string][]byte {
	files := map[string][]byte{}
	var md bytes.Buffer
	b.Markdown(&md)
	files["ADAPTIVE.md"] = md.Bytes()
	for _, rs := range [][]AdaptiveRun{b.Steady, b.Halves, b.Rejects} {
		for _, r := range rs {
			if r.Options.Adaptive == nil {
				continue
			}
			var svg bytes.Buffer
			LimitChart(&svg, r.Report)
			files[limitChartName(r.Name)] = svg.Bytes()
		}
	}
	return files
}

func limitChartName(name string) string {
	return strings.Replace(SVGName(Report{Scenario: name}), "incident-replay-", "adaptive-", 1)
}

// Markdown writes docs/ADAPTIVE.md.
func (b AdaptiveBundle) Markdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("%s", mdAdaptiveIntro)
	AdaptiveBase().Parameters(w)
	p("\n## Finding the capacity, and keeping the priority queue\n\n")
	p("Fixed limits of 12 (twice the capacity), 2 (a third of it) and %d (the best of every fixed limit from 1 to 12, by calls completed), beside the adaptive limit between 2 and 12 starting at either bound, and the same adaptive limit without priorities (every call in one FIFO class, no reserve): a plain gradient limiter.\n\n", b.BestFixed)
	adaptiveTable(w, b.Steady, extraRow{"limit within one slot of the capacity", func(r Report) string { return r.Follow(0, 0, capacity).String() }})
	p("\n%s", mdAdaptiveSteady)
	for _, r := range b.Steady {
		if r.Options.Adaptive != nil {
			p("![%s](%s)\n", r.Name, limitChartName(r.Name))
		}
	}
	p("\n## The gateway's capacity halves mid-run\n\nCapacity 6 → 3 at 4 minutes, back to 6 at 7 minutes.\n\n")
	adaptiveTable(w, b.Halves,
		extraRow{"limit within one slot of 3, from 4 min to 7 min", func(r Report) string { return r.Follow(HalvesAt, HalvesBack, capacity).String() }},
		extraRow{"limit within one slot of 6, from 7 min", func(r Report) string { return r.Follow(HalvesBack, 0, capacity).String() }})
	p("\n%s", mdAdaptiveHalves)
	p("![%s](%s)\n", b.Halves[0].Name, limitChartName(b.Halves[0].Name))
	p("\n## A gateway that answers 429 above its limit\n\nThe gateway never slows down (capacity 100) but answers 429 at once to a call that arrives with 6 in progress; the SDK retries a 429.\n\n")
	adaptiveTable(w, b.Rejects, extraRow{"time with the limit above 6 (a 429 above 6 in progress)", func(r Report) string { return r.Above(RejectAt).Round(time.Second).String() }})
	p("\n%s", mdAdaptiveRejects)
	p("![%s](%s)\n", b.Rejects[0].Name, limitChartName(b.Rejects[0].Name))
	p("\n## The goals, measured\n\n")
	b.Goals(w)
	p("\n%s", mdAdaptiveOutro)
}

// Goals measures the goals the adaptive limit was built to: settling from
// either bound within 60 s and staying within one slot; following a
// halved capacity within 30 s with no request timeout or retry, and
// recovering; settling at or below a 429 threshold with few retries;
// throughput and the chat's time to first token against the fixed limits.
func (b AdaptiveBundle) Goals(w io.Writer) []Goal {
	var gs []Goal
	add := func(goal string, met bool, format string, args ...any) {
		gs = append(gs, Goal{Text: goal, Figure: fmt.Sprintf(format, args...), Met: met})
	}
	best := b.Steady[2].completed()
	for _, r := range b.Steady[3:5] {
		t := r.Follow(0, 0, capacity)
		add(r.Name+": within one slot of the capacity in at most 60 s, and stays there", t.Reached >= 0 && t.Reached <= time.Minute && t.Outside == 0,
			"%s", t)
		add(r.Name+": at least 90 % of the best fixed limit's calls completed", r.completed()*10 >= best*9, "%d of %d", r.completed(), best)
		ttft := r.Classes["interactive"].TTFTP99
		add(r.Name+": chat p99 time to first token at most 1.5× the idle gateway's", ttft <= r.IdleTTFT*3/2, "%s against %s", secs(ttft), secs(r.IdleTTFT))
	}
	np := b.Steady[5]
	add("without priorities, the chat is not put first (shown for contrast)", np.Classes["interactive"].TTFTP99 > np.IdleTTFT*3/2,
		"chat p99 time to first token %s", secs(np.Classes["interactive"].TTFTP99))
	h := b.Halves[0]
	down, up := h.Follow(HalvesAt, HalvesBack, capacity), h.Follow(HalvesBack, 0, capacity)
	add("capacity halves: within one slot of it in at most 30 s, no request timeout, no retry", down.Reached >= 0 && down.Reached <= 30*time.Second && h.RequestTimeouts == 0 && h.Retries == 0,
		"%s; %d request timeouts, %d retries", down, h.RequestTimeouts, h.Retries)
	add("capacity returns: the limit recovers", up.Reached >= 0, "%s", up)
	rj, fx := b.Rejects[0], b.Rejects[1]
	last := rj.Samples[len(rj.Samples)-1].Limit
	add("429 above 6: the limit settles at or below 6, far fewer retries than a fixed limit", last <= RejectAt && rj.Retries*10 <= fx.Retries,
		"ends at %d; %d retries (fixed 12: %d)", last, rj.Retries, fx.Retries)
	if w != nil {
		fmt.Fprintln(w, "| goal | measured | met |\n| --- | --- | --- |")
		for _, g := range gs {
			met := "yes"
			if !g.Met {
				met = "**no**"
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", g.Text, g.Figure, met)
		}
	}
	return gs
}

const mdAdaptiveIntro = `# Adaptive lane limits

Regenerate with ` + "`make replay`" + ` (the simulated runs are exact: the same inputs give this file
byte for byte). The algorithm is documented on ` + "`limiter.Adaptive`" + `; this page shows it
against the gateway simulator in the replay's deterministic time (the real limiter on a
fake clock, the transport's signals reported as ` + "`lanehttp`" + ` reports them), the gateway's
capacity hidden from the lane. Settings for every run below (the incident of
docs/INCIDENT-REPLAY.md, with prompts of three sizes):

`

const mdAdaptiveSteady = `
Two things the table shows. The adaptive limit completes as many calls as the best fixed
limit, which an operator would have to know the capacity to choose; and the priority queue
is kept at every limit: the operator's chat keeps its reserved slot and about the idle
gateway's time to first token. The same controller without priorities finds the same
limit, but the chat waits in line behind the finders and coders. The limit oscillates
between the capacity and one slot above it: past the capacity first bytes slow down only
when every slot is used, which with the reserve free means when a chat is in flight, so
the slot above is found too many only then.

`

const mdAdaptiveHalves = `
When the capacity halves, the first calls sent after it see their first bytes slow down by
more than a quarter and the limit drops at once (Severe): waiting for a second sample would
take minutes, because long generations hold their slots and nothing new is sent. No call
times out at the gateway and none is retried (a lowered limit never revokes a held slot: the
calls in flight finish, slower), but the backlog grows at half the capacity and some calls
time out in the queue, fast, where the fixed limit kept serving them slowly (past its
capacity, a processor-sharing gateway serves as much in total, only later). When the
capacity returns, the limit grows back one slot per window of good first bytes sent with
every slot in use; the increases wait for those windows, which is why recovery takes minutes,
not seconds.

`

const mdAdaptiveRejects = `
A 429 is a loss signal: the limit drops by a quarter, and increases stop one slot below the
load the rejected call was sent into, for 5 minutes (or Retry-After); then the lane tries one
slot more once, and a 429 there takes it straight back. A fixed limit of 12 runs into the
gateway's limit over and over, and the SDK's retries with it. The time above 6 is slow start
overshooting at the beginning and one probe.

`

const mdAdaptiveOutro = `## With shared lanes (Redis)

The adaptive limit is per process: each process learns the lane's limit from its own
calls' signals, and a grant is decided in Redis with the limit (and the reserve clamped to
it) of the process whose call decides it: its own acquisition, or a release or poll that
hands slots to the queue. So a process whose limit was cut does not take slots above its
own limit for its new calls, while a process with a higher limit, releasing, may grant a
waiter of the first one up to its own. Processes that see the same gateway learn similar
limits. (` + "`sharedlane`" + `'s TestAdaptiveLimitIsPerProcess: a process that learned 2 waits
with 2 held; another one's call, with a fixed 8, grants it.)

## What it does not do

- It learns from first bytes and losses only; a gateway whose first token is fast but
  whose streams crawl is seen only through its stalls.
- The baselines are per request size (1/16 of an octave) and per process; a lane whose
  requests are all of new sizes learns each size's baseline from its first call.
- Past the gateway's capacity a processor-sharing gateway serves as much in total, only
  later; so a limit that follows a capacity cut does not win throughput back, it keeps the
  calls that are served fast and lets the rest fail fast in the queue. Whether that is the
  trade an operator wants is the queue timeout's choice.
- Starting from the ceiling, the limit once ran two slots above the capacity for 34 s late
  in the run (the goals table's one **no**): two first bytes of calls sent at one slot
  above it met a lull as other calls ended. A check that would stop it (a higher bar past a
  limit latency cut recently) also stopped the recovery after the capacity came back, in
  the halving scenario; it is left open.
`
