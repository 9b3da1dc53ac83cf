package replay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A short replay keeps the simulator honest: without a limiter the storm
// appears (timeouts, retries, wasted gateway work); with lanes none of it
// does, the gateway never sees more than the limit, every panel finishes,
// and the operator's chat is served ahead of the panel's bulk calls. No
// timing thresholds: only counts and comparisons within one run.
func TestReplayShowsStormAndLanesStopIt(t *testing.T) {
	o := Incident(0.004)
	o.Duration = 5 * time.Minute
	rs := map[string]Report{}
	for _, s := range []string{"no-limiter", "lanes"} {
		r, err := Run(context.Background(), s, o)
		if err != nil {
			t.Fatal(err)
		}
		rs[s] = r
	}
	storm, lanes := rs["no-limiter"], rs["lanes"]
	if storm.Timeouts == 0 || storm.RetriesSent == 0 || storm.WastedTokens == 0 || storm.PeakUpstream <= o.Capacity {
		t.Fatalf("no storm without a limiter: %+v", storm)
	}
	if lanes.Timeouts != 0 || lanes.RetriesSent != 0 || lanes.WastedTokens != 0 || lanes.PeakUpstream > o.Limit {
		t.Fatalf("lanes: %+v", lanes)
	}
	if lanes.PanelsDone != o.Panels || len(lanes.Failed) != 0 || lanes.Completed["interactive"] == 0 {
		t.Fatalf("lanes did not serve everyone: %+v", lanes)
	}
	if lanes.ChatWaitP99 >= lanes.BulkWaitP50 {
		t.Fatalf("chat waited %v (p99), bulk %v (p50): interactive not ahead", lanes.ChatWaitP99, lanes.BulkWaitP50)
	}
	var b bytes.Buffer
	Table(&b, []Report{storm, lanes})
	SVG(&b, []Report{storm, lanes}, o.Capacity, o.Limit)
	if !strings.Contains(b.String(), "| request timeouts |") || !strings.Contains(b.String(), "<polyline") {
		t.Fatalf("report:\n%s", b.String())
	}
}

func TestUnknownScenario(t *testing.T) {
	if _, err := Run(context.Background(), "nope", Incident(0.001)); err == nil || !strings.Contains(err.Error(), "no-limiter") {
		t.Fatalf("err %v", err)
	}
}
