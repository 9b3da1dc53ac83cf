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

type namedOptions struct {
	name string
	o    Options
}

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
	Sweep     []SweepRun    // other capacities and seeds
	Jitter    []JitterRun   // gateways that jitter whatever their load
}

// JitterRun is one run on a gateway that jitters, beside a fixed limit
// (the ceiling where the gateway never slows down, the capacity where it
// does) with the same load and seed.
type JitterRun struct {
	Gateway         string
	Seed            uint64
	Adaptive, Fixed Report
}

// Jittery returns a gateway that never slows down with load (capacity 100)
// but whose first bytes jitter, under 12 clients in a closed loop, with an
// adaptive limit between 1 and 8: first bytes of first+[0, jitter) (or
// first or first+jitter, equally likely, with bimodal) plus one 50 ms
// token.
func Jittery(seed uint64, first, jitter time.Duration, bimodal bool) Options {
	o := Incident()
	o.Seed, o.Duration, o.PollEvery = seed, 5*time.Minute, time.Second
	o.Capacity, o.Tokens, o.TokenTime, o.FirstTokenDelay = 100, 20, 50*time.Millisecond, first
	o.Jitter, o.Bimodal = jitter, bimodal
	o.CoderBytes, o.Clients = 4096, 12
	o.Limit, o.Adaptive = 8, &limiter.Adaptive{MinInflight: 1}
	return o
}

// The jittery gateways of the report: the two of the jitter issue, which
// never slow down, and the incident's gateway with jitter added.
var (
	jitterSeeds    = []uint64{1, 2, 3}
	jitterGateways = []struct {
		name          string
		first, jitter time.Duration
		bimodal       bool
	}{
		{"first byte uniform in [300, 400) ms", 250 * time.Millisecond, 100 * time.Millisecond, false},
		{"first byte 50 or 90 ms", 0, 40 * time.Millisecond, true},
	}
	incidentJitters = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}
)

// Settled returns when the limit came to n for good (it stays there to
// the end of the load), and when it first did; -1 if it never did.
func (r Report) Settled(n int) (settled, first time.Duration) {
	settled, first = -1, -1
	for _, s := range r.Samples {
		if s.At > r.Options.Duration {
			break
		}
		switch {
		case s.Limit != n:
			settled = -1
		case settled < 0:
			settled = s.At
			if first < 0 {
				first = s.At
			}
		}
	}
	return settled, first
}

// SweepRun is one adaptive run of the sweep beside the fixed limit set to
// the capacity, with the same load and seed.
type SweepRun struct {
	Capacity, Initial int
	Seed              uint64
	Adaptive, Fixed   Report
}

// The sweep: capacities other than the headline's 6, each with three
// seeds of the same load, the adaptive limit from its floor (2) and from
// its ceiling (twice the capacity).
var (
	sweepCapacities = []int{3, 4, 8, 10}
	sweepSeeds      = []uint64{1, 2, 3}
)

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
	halves := base
	halves.CapacityChanges = []CapacityChange{{HalvesAt, 3}, {HalvesBack, 6}}
	rejects := base
	rejects.Capacity, rejects.RejectAbove = 100, RejectAt
	for _, set := range []struct {
		into *[]AdaptiveRun
		runs []namedOptions
	}{
		{&b.Steady, []namedOptions{
			{"fixed 12 (2x capacity)", fixed(base, 12)},
			{"fixed 2 (capacity/3)", fixed(base, 2)},
			{fmt.Sprintf("fixed %d (the best fixed)", best), fixed(base, best)},
			{"adaptive from 2", adaptiveFrom(base, 0)},
			{"adaptive from 12", adaptiveFrom(base, 12)},
			{"adaptive, no priorities", noPrio},
		}},
		{&b.Halves, []namedOptions{{"capacity halves: adaptive", adaptiveFrom(halves, 0)}, {"capacity halves: fixed 6", fixed(halves, 6)}}},
		{&b.Rejects, []namedOptions{{"429 above 6: adaptive", adaptiveFrom(rejects, 0)}, {"429 above 6: fixed 12", fixed(rejects, 12)}}},
	} {
		for _, c := range set.runs {
			r, err := run(c.name, c.o)
			if err != nil {
				return b, err
			}
			*set.into = append(*set.into, r)
		}
	}
	for _, g := range jitterGateways {
		for _, seed := range jitterSeeds {
			o := Jittery(seed, g.first, g.jitter, g.bimodal)
			a, err := Run("lanes", o)
			if err != nil {
				return b, err
			}
			fx, err := Run("lanes", fixed(o, o.Limit))
			if err != nil {
				return b, err
			}
			b.Jitter = append(b.Jitter, JitterRun{Gateway: g.name, Seed: seed, Adaptive: a, Fixed: fx})
		}
	}
	for _, j := range incidentJitters {
		o := base
		o.Jitter = j
		fx, err := Run("lanes", fixed(o, o.Capacity))
		if err != nil {
			return b, err
		}
		for _, initial := range []int{0, 12} {
			a, err := Run("lanes", adaptiveFrom(o, initial))
			if err != nil {
				return b, err
			}
			b.Jitter = append(b.Jitter, JitterRun{Gateway: fmt.Sprintf("the incident's (capacity 6), first bytes up to %s later, from %d", j, max(2, initial)), Seed: o.Seed, Adaptive: a, Fixed: fx})
		}
	}
	for _, capacity := range sweepCapacities {
		for _, seed := range sweepSeeds {
			o := base
			o.Capacity, o.Seed = capacity, seed
			fx, err := Run("lanes", fixed(o, capacity))
			if err != nil {
				return b, err
			}
			for _, initial := range []int{0, 2 * capacity} {
				a := o
				a.Limit, a.Adaptive = 2*capacity, &limiter.Adaptive{MinInflight: 2, Initial: initial}
				r, err := Run("lanes", a)
				if err != nil {
					return b, err
				}
				b.Sweep = append(b.Sweep, SweepRun{Capacity: capacity, Initial: max(2, initial), Seed: seed, Adaptive: r, Fixed: fx})
			}
		}
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
// of the load): Settled is how long after from the limit came within one
// slot of the target for good (it stays there to the end), -1 if it ends
// outside; Outside is how long, after it first came within one slot, it
// was further away; Lo and Hi are the limits seen from then on.
type Track struct {
	Settled, Outside time.Duration
	Lo, Hi           int
}

// Follow tracks the limit against target(s) between from and to.
func (r Report) Follow(from, to time.Duration, target func(Sample) int) Track {
	if to == 0 {
		to = r.Options.Duration
	}
	t := Track{Settled: -1, Lo: math.MaxInt}
	var prev time.Duration
	entered := false
	for _, s := range r.Samples {
		if s.At < from || s.At >= to {
			continue
		}
		near := abs(s.Limit-target(s)) <= 1
		switch {
		case near && t.Settled < 0:
			t.Settled = s.At - from
		case !near:
			t.Settled = -1
			if entered {
				t.Outside += s.At - prev
			}
		}
		entered = entered || near
		if entered {
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
	if t.Settled < 0 {
		return fmt.Sprintf("not settled (limits %d–%d)", t.Lo, t.Hi)
	}
	return fmt.Sprintf("settled after %s (%s outside before that; limits %d–%d)", t.Settled.Round(time.Second), t.Outside.Round(time.Second), t.Lo, t.Hi)
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
	row := sideBySide(w, rs)
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
	p("\n%s", mdAdaptiveSweep)
	b.SweepTable(w)
	p("\n%s", mdAdaptiveJitter)
	b.JitterTable(w)
	p("\n%s", mdAdaptiveJitterAfter)
	p("\n%s", mdAdaptiveOutro)
}

// SweepTable writes the sweep, run by run, and how many runs meet each
// goal.
func (b AdaptiveBundle) SweepTable(w io.Writer) {
	settled, throughput, chat := 0, 0, 0
	fmt.Fprintln(w, "| capacity | seed | from | limit within one slot of the capacity | calls completed (fixed at the capacity) | chat p99 time to first token (idle; fixed at the capacity) |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | --- | ---: | ---: |")
	for _, x := range b.Sweep {
		t := x.Adaptive.Follow(0, 0, capacity)
		ok := t.Settled >= 0 && t.Settled <= time.Minute
		tp := x.Adaptive.completed()*10 >= x.Fixed.completed()*9
		ttft := x.Adaptive.Classes["interactive"].TTFTP99
		fast := ttft <= x.Adaptive.IdleTTFT*3/2
		settled, throughput, chat = settled+b2i(ok), throughput+b2i(tp), chat+b2i(fast)
		fmt.Fprintf(w, "| %d | %d | %d | %s%s | %d (%d)%s | %s (%s; %s)%s |\n", x.Capacity, x.Seed, x.Initial, t, mark(ok),
			x.Adaptive.completed(), x.Fixed.completed(), mark(tp), secs(ttft), secs(x.Adaptive.IdleTTFT), secs(x.Fixed.Classes["interactive"].TTFTP99), mark(fast))
	}
	n := len(b.Sweep)
	fmt.Fprintf(w, "\nOf %d runs: within one slot in at most 60 s and there to the end in %d; at least 90 %% of the fixed limit's calls in %d; chat p99 time to first token within 1.5× the idle gateway's in %d. (**no** marks a run that misses.)\n", n, settled, throughput, chat)
	fmt.Fprint(w, mdAdaptiveSweepAfter)
}

// JitterTable writes the runs on jittery gateways.
func (b AdaptiveBundle) JitterTable(w io.Writer) {
	fmt.Fprintln(w, "| gateway | seed | load | the adaptive limit | calls completed (fixed limit) | chat p99 time to first token (fixed limit) |")
	fmt.Fprintln(w, "| --- | ---: | --- | --- | ---: | ---: |")
	for _, x := range b.Jitter {
		a, o := x.Adaptive, x.Adaptive.Options
		limit, load, chat, fchat := "", "the incident's", secs(a.Classes["interactive"].TTFTP99), secs(x.Fixed.Classes["interactive"].TTFTP99)
		if o.Clients > 0 {
			settled, first := a.Settled(o.Limit)
			limit = fmt.Sprintf("between 1 and %d: at %d for good after %s (first at %d after %s)", o.Limit, o.Limit, settledText(settled), o.Limit, settledText(first))
			load, chat, fchat = fmt.Sprintf("%d clients, closed loop", o.Clients), "—", "—"
		} else {
			limit = "between 2 and 12: within one slot of the capacity: " + a.Follow(0, 0, capacity).String()
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d (%d) | %s (%s) |\n", x.Gateway, x.Seed, load, limit, a.completed(), x.Fixed.completed(), chat, fchat)
	}
}

func settledText(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Second).String()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func mark(ok bool) string {
	if ok {
		return ""
	}
	return " **no**"
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
		add(r.Name+": within one slot of the capacity in at most 60 s, and there to the end", t.Settled >= 0 && t.Settled <= time.Minute,
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
	add("capacity halves: within one slot of it in at most 30 s (and there until it returns), no request timeout, no retry", down.Settled >= 0 && down.Settled <= 30*time.Second && h.RequestTimeouts == 0 && h.Retries == 0,
		"%s; %d request timeouts, %d retries", down, h.RequestTimeouts, h.Retries)
	add("capacity returns: the limit recovers (within one slot of it to the end)", up.Settled >= 0, "%s", up)
	for _, g := range jitterGateways {
		var figs []string
		ok := true
		for _, x := range b.Jitter {
			if x.Gateway != g.name {
				continue
			}
			settled, _ := x.Adaptive.Settled(x.Adaptive.Options.Limit)
			ok = ok && settled >= 0 && settled <= time.Minute
			figs = append(figs, fmt.Sprintf("seed %d: %s", x.Seed, settledText(settled)))
		}
		add("jitter alone, "+g.name+", never slower with load: at the ceiling (8) in at most 60 s and there to the end", ok, "%s", strings.Join(figs, "; "))
	}
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
The adaptive limit completes as many calls as the best fixed limit, which an operator would
have to know the capacity to choose, and the priority queue is kept at every limit: the
operator's chat keeps its reserved slot and about the idle gateway's time to first token.
The same controller without priorities finds the same limit, but the chat waits in line
behind the finders and coders. The limit settles at the capacity and probes one slot above
it now and then; with interactive calls about, the lane counts as using its slots only when
every slot is held, reserve included, so that the reserved slot stays inside what the
gateway serves. The peak of 8 at the gateway is slow start's overshoot in the first seconds
and the calls that a cut leaves in flight (a lowered limit revokes no slot, and keeps the
reserve for interactive calls while the rest drain).

`

const mdAdaptiveHalves = `
When the capacity halves, the first calls sent after it see their first bytes slow down by
more than a quarter and the limit drops at once (Severe): waiting for a second sample would
take minutes, because long generations hold their slots and nothing new is sent. No call
times out and none is retried: a lowered limit never revokes a held slot (the calls in
flight finish, slower), and the chat keeps its reserve while they drain. When the capacity
returns, the limit grows back one slot per two good first bytes sent with every slot in use.
A fixed limit of 6 keeps sending 6 calls to a gateway that can serve 3 (a processor-sharing
gateway serves as much in total past its capacity, only slower for everyone: the fixed
limit loses little here, and the adaptive one gains the chat's time to first token).

`

const mdAdaptiveRejects = `
A 429 is a loss signal: the limit drops by a quarter, and increases stop one slot below the
load the rejected call was sent into, for 5 minutes (or Retry-After); then the lane tries one
slot more once, and a 429 there takes it straight back. A fixed limit of 12 runs into the
gateway's limit over and over, and the SDK's retries with it.

`

const mdAdaptiveSweep = `## Beyond the headline: other capacities and seeds

The goals above are measured on one gateway (capacity 6) and one seed of the load, the
scenario the controller was tuned on. The same controller, unchanged, on gateways of
capacity 3, 4, 8 and 10 with three seeds each (the adaptive limit between 2 and twice the
capacity, from either bound), beside the fixed limit set to the capacity, the same load:

`

const mdAdaptiveSweepAfter = `
Throughput and the chat hold almost everywhere; settling does not, for two reasons the
table shows. At capacity 10 one call more is 10 % more load, and a first byte grows by
about half of that (the prompt's part does not grow): under the 5 % tolerance, so the
limit sits one or two slots above the capacity, which the latency signal cannot tell
apart; the resolution is about a tenth of the capacity. And from the floor, slow start's
doubling overshoots to twice the capacity when the step before it happened to fit (8 to 16
at capacity 8), and with long generations the overshoot takes up to a minute to be seen.
`

const mdAdaptiveJitter = `## Gateways that jitter

Real gateways' first bytes vary whatever their load: the network, the batch a call lands
in, the cache. The lane learns that jitter (the mean relative difference between first
bytes of calls of about one size sent into the same load, which the load cannot explain)
and lets its ratios go four times that far above the baseline before they count as past
the capacity. Below, the two gateways of the jitter issue, which never slow down with load
(capacity 100) under 12 clients in a closed loop, beside a fixed limit at the ceiling; and
the incident's gateway (capacity 6) with jitter added to its first bytes, beside a fixed
limit at the capacity:

`

const mdAdaptiveJitterAfter = `
On the gateways that never slow down, the limit reaches the ceiling within seconds and
stays: a cut made in the first seconds, before the lane has seen 8 pairs of first bytes and
knows the jitter, is taken back once it does. On the incident's gateway the lane learns its
jitter slowly: with calls of 46 s and prompts of many sizes, pairs of first bytes of one
size sent into one load come a few a minute. With 200 ms of jitter (about 10 % of a first
byte) throughput holds and the limit stays within a few slots of the capacity; with 500 ms
(about 25 %) the cuts the jitter causes before it is learned hold the limit near its floor
and half the calls are lost. That is this controller's weak spot: on a gateway that
jitters by a quarter and serves few, long calls, use a fixed limit (or a higher
min_inflight). The resolution of the latency signal is the gateway's jitter: the limit
finds the capacity only as well as the first bytes tell it.
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
- Its resolution is about a tenth of the capacity (see the sweep): on a gateway of 10 or
  more, "within one slot" becomes "within about 10 %". On a gateway that jitters, it is
  the jitter (four times its mean difference), and a lane with few, long calls learns the
  jitter slowly (see "Gateways that jitter").
- With shared lanes, grants are decided in Redis by the limit of whichever process decides
  them, and the reserve kept through a drop does not apply there.
`
