package replay

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/llmlanes/llmlanes/classify"
)

// stateColor colours the classification band.
var stateColor = map[classify.State]string{
	classify.Idle: "#ddd", classify.Healthy: "#6b6", classify.LocalQueue: "#e93", classify.GatewayDegraded: "#c33",
}

// Timeline draws one scenario as four panels over a shared time axis:
// calls in progress at the gateway (with its capacity and the lane limit),
// calls waiting in the lanes by class, the classification route's answer
// at each poll (with the gateway's ground truth below it), and each chat
// turn's time to first token.
func Timeline(w io.Writer, r Report) {
	const width, pw, ph, left, gap = 760, 660, 110, 70, 46
	o := r.Options
	end := 60.0
	for _, s := range r.Samples {
		end = math.Max(end, s.At.Seconds())
	}
	x := func(sec float64) float64 { return left + sec/end*pw }
	height := 40 + 4*(ph+gap)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintln(w, `<rect width="100%" height="100%" fill="white"/>`)
	fmt.Fprintf(w, `<text x="%d" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", left, r.Scenario)
	panel := func(i int, title string, maxV float64) (y0 float64, y func(float64) float64) {
		y0 = float64(40 + i*(ph+gap))
		fmt.Fprintf(w, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-6, title)
		fmt.Fprintf(w, `<rect x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, pw, ph)
		if maxV > 0 {
			fmt.Fprintf(w, `<text x="%d" y="%.0f" text-anchor="end">%.0f</text><text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n",
				left-4, y0+10, maxV, left-4, y0+ph)
		}
		for m := 0.0; m <= end; m += 120 {
			fmt.Fprintf(w, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#666">%.0f min</text>`+"\n", x(m), y0+ph+12, m/60)
		}
		return y0, func(v float64) float64 { return y0 + ph - v/maxV*ph }
	}
	line := func(pts [][2]float64, color string) {
		var b strings.Builder
		for _, p := range pts {
			fmt.Fprintf(&b, "%.1f,%.1f ", p[0], p[1])
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.TrimSpace(b.String()))
	}
	ref := func(y float64, color, label string, lx float64) {
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/><text x="%.0f" y="%.1f" fill="%s">%s</text>`+"\n",
			left, y, left+pw, y, color, lx, y-3, color, label)
	}

	// 1. The gateway.
	maxG := float64(o.Capacity + 2)
	for _, s := range r.Samples {
		maxG = math.Max(maxG, float64(s.Gateway))
	}
	_, y := panel(0, "calls in progress at the gateway", maxG)
	ref(y(float64(o.Capacity)), "#c33", fmt.Sprintf("gateway capacity %d", o.Capacity), left+pw-130)
	if len(r.Grants) > 0 {
		limit := o.Limit
		if r.Scenario == "shared-exporter" {
			limit = o.SharedLimit
		}
		label := fmt.Sprintf("lane limit %d", limit)
		if o.Agents > 1 && r.Scenario != "shared-exporter" {
			label += fmt.Sprintf(", in each of %d agents", o.Agents)
		}
		ref(y(float64(limit)), "#393", label, left+4)
	}
	var pts [][2]float64
	for _, s := range r.Samples {
		pts = append(pts, [2]float64{x(s.At.Seconds()), y(float64(s.Gateway))})
	}
	line(pts, "#36c")

	// 2. The queue.
	maxQ := 5.0
	for _, s := range r.Samples {
		maxQ = math.Max(maxQ, float64(max(s.Queued.Interactive, s.Queued.Default, s.Queued.Bulk)))
	}
	y0, y := panel(1, "waiting in the lanes, by class", maxQ)
	if len(r.Grants) == 0 {
		fmt.Fprintf(w, `<text x="%d" y="%.0f" fill="#666">no queue: every call goes to the gateway at once</text>`+"\n", left+8, y0+ph/2)
	} else {
		for i, c := range []struct {
			name, color string
			v           func(Sample) int
		}{
			{"interactive", "#c33", func(s Sample) int { return s.Queued.Interactive }},
			{"default", "#36c", func(s Sample) int { return s.Queued.Default }},
			{"bulk", "#999", func(s Sample) int { return s.Queued.Bulk }},
		} {
			pts = pts[:0]
			for _, s := range r.Samples {
				pts = append(pts, [2]float64{x(s.At.Seconds()), y(float64(c.v(s)))})
			}
			line(pts, c.color)
			fmt.Fprintf(w, `<text x="%d" y="%.0f" fill="%s">%s</text>`+"\n", left+8+i*80, y0+14, c.color, c.name)
		}
	}

	// 3. Classification, and the ground truth.
	y0, _ = panel(2, "classification route (top; red tick: a gateway reason listed) and the truth (bottom; red: the gateway fails)", 0)
	for _, s := range r.Samples {
		step := math.Min(o.PollEvery.Seconds(), end-s.At.Seconds())/end*pw + 0.5
		if s.State != "" {
			fmt.Fprintf(w, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="%s"/>`+"\n", x(s.At.Seconds()), y0+6, step, ph/2-12, stateColor[s.State])
			if s.GatewayVerdict {
				fmt.Fprintf(w, `<rect x="%.1f" y="%.0f" width="%.1f" height="6" fill="#c33"/>`+"\n", x(s.At.Seconds()), y0+ph/2-6, step)
			}
		}
		truth := "#6b6"
		if s.Fault {
			truth = "#c33"
		}
		fmt.Fprintf(w, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="%s"/>`+"\n", x(s.At.Seconds()), y0+ph/2+6, step, ph/2-12, truth)
	}
	if r.Samples[0].State == "" {
		fmt.Fprintf(w, `<text x="%d" y="%.0f" fill="#666">no lanes: nothing to classify</text>`+"\n", left+8, y0+ph/4+4)
	}
	for i, st := range classify.States() {
		fmt.Fprintf(w, `<rect x="%d" y="%.0f" width="10" height="10" fill="%s"/><text x="%d" y="%.0f">%s</text>`+"\n",
			left+i*110, y0+ph+20, stateColor[st], left+i*110+14, y0+ph+29, st)
	}

	// 4. Chat.
	maxL := 5.0
	for _, p := range r.Chats {
		maxL = math.Max(maxL, p.Value)
	}
	_, y = panel(3, "chat: time to first token (s), by when the turn was sent", maxL)
	for _, p := range r.Chats {
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#36c"/>`+"\n", x(p.At.Seconds()), y(p.Value))
	}
	fmt.Fprintln(w, "</svg>")
}
