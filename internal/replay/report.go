package replay

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

func secs(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// Table writes the scenarios side by side as a Markdown table.
func Table(w io.Writer, rs []Report) {
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
	for _, c := range []string{"interactive", "default", "bulk"} {
		row("completed / failed: "+c, func(r Report) string { return fmt.Sprintf("%d / %d", r.Completed[c], r.Failed[c]) })
	}
	row("review panels finished", func(r Report) string {
		if r.PanelsFinishedAt == 0 {
			return fmt.Sprintf("%d, not all", r.PanelsDone)
		}
		return fmt.Sprintf("all %d, by %s", r.PanelsDone, r.PanelsFinishedAt.Round(time.Second))
	})
	queued := func(r Report, d time.Duration) string { // only the lanes set-up has a queue
		if r.Scenario != "lanes" {
			return "–"
		}
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	row("chat: queue wait p50 / p99", func(r Report) string { return queued(r, r.ChatWaitP50) + " / " + queued(r, r.ChatWaitP99) })
	row("bulk finder: queue wait p50", func(r Report) string { return queued(r, r.BulkWaitP50) })
	row("chat: time to first token p50 / p99", func(r Report) string { return secs(r.ChatTTFTP50) + " / " + secs(r.ChatTTFTP99) })
	row("idle gateway's time to first token", func(r Report) string { return secs(r.IdleTTFT) })
	row("request timeouts", func(r Report) string { return fmt.Sprint(r.Timeouts) })
	row("retries sent", func(r Report) string { return fmt.Sprint(r.RetriesSent) })
	row("gateway work wasted on abandoned calls (tokens)", func(r Report) string { return fmt.Sprint(r.WastedTokens) })
	row("peak concurrency at the gateway", func(r Report) string { return fmt.Sprint(r.PeakUpstream) })
}

// SVG draws, per scenario, the gateway's concurrency over time (each on its
// own scale, at least the capacity) and each chat's time to first token
// (on a shared scale).
func SVG(w io.Writer, rs []Report, capacity, limit int) {
	const pw, ph, pad = 300, 160, 40
	width, height := pad+len(rs)*(pw+pad), 2*(ph+pad)+pad
	maxT, maxL := 1.0, 1.0
	for _, r := range rs {
		for _, p := range r.Timeline {
			maxT = math.Max(maxT, p.At.Seconds())
		}
		for _, p := range r.Chats {
			maxT, maxL = math.Max(maxT, p.At.Seconds()), math.Max(maxL, p.Value)
		}
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, r := range rs {
		x0 := pad + i*(pw+pad)
		maxC := float64(capacity + 2)
		for _, p := range r.Timeline {
			maxC = math.Max(maxC, p.Value)
		}
		for j, panel := range []struct {
			title string
			pts   []Point
			max   float64
			dots  bool
		}{{"gateway concurrency", r.Timeline, maxC, false}, {"chat: time to first token (s)", r.Chats, maxL, true}} {
			y0 := pad + j*(ph+pad)
			fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">%s: %s</text>`+"\n", x0, y0-8, r.Scenario, panel.title)
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, pw, ph)
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%.0f</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n",
				x0-4, y0+10, panel.max, x0-4, y0+ph)
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%.0f min</text>`+"\n", x0+pw, y0+ph+14, maxT/60)
			px := func(p Point) (float64, float64) {
				return float64(x0) + p.At.Seconds()/maxT*pw, float64(y0+ph) - p.Value/panel.max*ph
			}
			if j == 0 {
				for _, ref := range []struct {
					v      int
					color  string
					label  string
					labelX int
				}{{capacity, "#c33", fmt.Sprintf("gateway capacity %d", capacity), x0 + pw - 120}, {limit, "#393", fmt.Sprintf("lane limit %d", limit), x0 + 4}} {
					y := float64(y0+ph) - float64(ref.v)/panel.max*ph
					fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/><text x="%d" y="%.1f" fill="%s">%s</text>`+"\n",
						x0, y, x0+pw, y, ref.color, ref.labelX, y-3, ref.color, ref.label)
				}
			}
			if panel.dots {
				for _, p := range panel.pts {
					x, y := px(p)
					fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#36c"/>`+"\n", x, y)
				}
				continue
			}
			var b strings.Builder
			for _, p := range panel.pts {
				x, y := px(p)
				fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
			}
			fmt.Fprintf(w, `<polyline fill="none" stroke="#36c" stroke-width="1.5" points="%s"/>`+"\n", strings.TrimSpace(b.String()))
		}
	}
	fmt.Fprintln(w, "</svg>")
}
