package replay

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// runAdaptiveOnce is one run of RunAdaptive, shared by the tests (each
// takes seconds under the race detector).
var runAdaptiveOnce = sync.OnceValues(RunAdaptive)

func adaptiveRun(t *testing.T) AdaptiveBundle {
	t.Helper()
	b, err := runAdaptiveOnce()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The adaptive limit against the gateway simulator, in the replay's
// deterministic time (issue: adaptive lane limits, "what must be
// proven"): each goal measured on the runs of docs/ADAPTIVE.md.
func TestAdaptiveGoals(t *testing.T) {
	b := adaptiveRun(t)
	for _, rs := range [][]AdaptiveRun{b.Steady, b.Halves, b.Rejects} {
		for _, r := range rs {
			checkAccounted(t, r.Report)
		}
	}
	for _, x := range b.Sweep {
		checkAccounted(t, x.Adaptive)
		checkAccounted(t, x.Fixed)
	}
	if len(b.Sweep) != len(sweepCapacities)*len(sweepSeeds)*2 {
		t.Errorf("%d sweep runs", len(b.Sweep))
	}
	if b.BestFixed != 6 {
		t.Errorf("the best fixed limit is %d, want the simulator's capacity, 6", b.BestFixed)
	}
	gs := b.Goals(nil)
	if len(gs) != 12 {
		t.Errorf("%d goals, want 12", len(gs))
	}
	for _, g := range gs {
		if !g.Met {
			t.Errorf("%s: not met: %s", g.Text, g.Figure)
		} else {
			t.Logf("%s: %s", g.Text, g.Figure)
		}
	}
	// The limit moved: it was not just left at a bound that happens to
	// pass.
	for _, r := range b.Steady[3:5] {
		lo, hi := 100, 0
		for _, s := range r.Samples {
			lo, hi = min(lo, s.Limit), max(hi, s.Limit)
		}
		if lo > 2 || hi < 8 {
			t.Errorf("%s: the limit ranged %d–%d: it never left a bound", r.Name, lo, hi)
		}
	}
	// Without the adaptive limit, the halving is not followed.
	if fx := b.Halves[1].Follow(HalvesAt, HalvesBack, capacity); fx.Settled >= 0 {
		t.Errorf("the fixed limit of 6 is within one slot of 3: %s", fx)
	}
}

// Same inputs, same ADAPTIVE.md and charts, byte for byte: this run's
// files are the committed ones, which make replay wrote in another process
// (a second run here would prove no more, for half a minute under -race).
func TestAdaptiveSameReport(t *testing.T) {
	fa := adaptiveRun(t).Files()
	md := string(fa["ADAPTIVE.md"])
	for _, want := range []string{"## The goals, measured", "## Beyond the headline", "Of 24 runs: ", "## Gateways that jitter", "![capacity halves: adaptive](adaptive-capacity-halves-adaptive.svg)", "queue_timeout 5m0s"} {
		if !strings.Contains(md, want) {
			t.Errorf("ADAPTIVE.md lacks %q", want)
		}
	}
	if !strings.Contains(string(fa["adaptive-adaptive-from-2.svg"]), "<polyline") {
		t.Error("no line in the limit chart")
	}
	// The committed report is this one: a change to the controller or the
	// runs is not done until make replay has been run.
	for name, b := range fa {
		committed, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", name))
		if err != nil || !bytes.Equal(committed, b) {
			t.Errorf("docs/%s is not what the replay gives now (%v): run make replay", name, err)
		}
	}
}
