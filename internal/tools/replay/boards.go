package replay

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Boards is the two-boards replay: both boards on one lane with fair
// shares (each board's calls its tenant), the same with no tenants, and
// board B alone on a lane of half the non-interactive slots.
type Boards struct {
	Fair, NoTenants, Alone Report
}

// RunBoards runs the three, with o (TwoBoards() for the report).
func RunBoards(o Options) (Boards, error) {
	var b Boards
	var err error
	fair := o
	fair.Tenants = true
	if b.Fair, err = Run("two-boards", fair); err != nil {
		return b, err
	}
	b.Fair.Scenario = "two boards, fair shares"
	o.Tenants = false
	if b.NoTenants, err = Run("two-boards", o); err != nil {
		return b, err
	}
	b.NoTenants.Scenario = "two boards, no tenants"
	if b.Alone, err = Run("board-b-alone", o); err != nil {
		return b, err
	}
	b.Alone.Scenario = "board B alone, half the slots"
	return b, nil
}

// panelsOf returns the panels of agent a.
func panelsOf(r Report, a int) []PanelTime {
	var out []PanelTime
	for _, p := range r.PanelTimes {
		if p.Agent == a {
			out = append(out, p)
		}
	}
	return out
}

func panelText(ps []PanelTime) string {
	var s []string
	for _, p := range ps {
		switch {
		case p.Took == 0 && len(p.Lost) > 0:
			s = append(s, fmt.Sprintf("from %s: not all finished (%s)", p.Start, reasons(p.Lost)))
		case p.Took == 0:
			s = append(s, fmt.Sprintf("from %s: not all finished", p.Start))
		default:
			s = append(s, fmt.Sprintf("from %s: %s", p.Start, p.Took.Round(time.Second)))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "; ")
}

// Goals checks the goals: with fair shares board B's panel takes
// at most 1.25x as long as alone on half the slots, and board A's panels
// all finish.
func (b Boards) Goals() []Goal {
	var gs []Goal
	fair, alone := panelsOf(b.Fair, 1), panelsOf(b.Alone, 1)
	ratio := 0.0
	if len(fair) == 1 && len(alone) == 1 && fair[0].Took > 0 && alone[0].Took > 0 {
		ratio = fair[0].Took.Seconds() / alone[0].Took.Seconds()
	}
	gs = append(gs, Goal{Text: "board B's panel, with fair shares, at most 1.25x as long as alone on half the slots",
		Figure: fmt.Sprintf("%.2fx", ratio), Met: ratio > 0 && ratio <= 1.25})
	done := 0
	as := panelsOf(b.Fair, 0)
	for _, p := range as {
		if p.Took > 0 {
			done++
		}
	}
	gs = append(gs, Goal{Text: "board A's panels all finish, with fair shares", Figure: fmt.Sprintf("%d of %d", done, len(as)), Met: done == len(as) && done > 0})
	return gs
}

// Markdown writes the two-boards section of the report.
func (b Boards) Markdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	rs := []Report{b.Fair, b.NoTenants, b.Alone}
	row := sideBySide(w, rs)
	row("board B's panel", func(r Report) string { return panelText(panelsOf(r, 1)) })
	row("board A's panels", func(r Report) string { return panelText(panelsOf(r, 0)) })
	for _, c := range Classes {
		row(c+": failed, by reason", func(r Report) string { return reasons(r.Classes[c].Failed) })
		row(c+": queue wait p50 / p99", func(r Report) string {
			return secs(r.Classes[c].WaitP50) + " / " + secs(r.Classes[c].WaitP99)
		})
	}
	p("\nThe goals set for fair shares, as they stand (`internal/tools/replay`'s tests check that the report is the same from run to run, that fair shares finish board B's panel sooner than no tenants, and the first goal; the second is reported as measured):\n\n")
	goalList(w, b.Goals())
}
