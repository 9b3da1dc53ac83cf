package replay

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/leaktest"
	"github.com/llmlanes/llmlanes/internal/tools/redistest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

func runAll(t *testing.T) Bundle {
	t.Helper()
	b, err := RunAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// 1. Same inputs, same report: two runs write the same files, byte for
// byte (the goroutines of the limiter's acquisitions wake in any order;
// the engine must not let that show).
func TestSameInputsSameReport(t *testing.T) {
	a, b := runAll(t).Files(), runAll(t).Files()
	sameFiles(t, a, b)
	md := string(a["INCIDENT-REPLAY.md"])
	for _, want := range []string{"queue_timeout 5m0s", "interactive_reserve 1", "request timeout 2m0s; 2 retries", "| request timeouts |", "![lanes: timeline](incident-replay-lanes.svg)"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if !strings.Contains(string(a["incident-replay-lanes.svg"]), "<polyline") {
		t.Error("no line in the lanes timeline")
	}
}

// sameFiles checks that two runs wrote the same files, byte for byte.
func sameFiles(t *testing.T, a, b map[string][]byte) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))) {
		t.Fatalf("files %v and %v", slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)))
	}
	for name := range a {
		if !bytes.Equal(a[name], b[name]) {
			t.Errorf("%s differs between two runs", name)
		}
	}
}

// everyCallEnded checks that every class had calls and that each ended,
// completed or failed.
func everyCallEnded(t *testing.T, r Report) {
	t.Helper()
	for c, s := range r.Classes {
		failed := 0
		for _, n := range s.Failed {
			failed += n
		}
		if s.Calls != s.Completed+failed || s.Calls == 0 {
			t.Errorf("%s %s: %d calls, %d completed, %d failed", r.Scenario, c, s.Calls, s.Completed, failed)
		}
	}
}

// Every call is accounted for, and the lanes hold nothing at the end: no
// slot lost, no call stranded.
func checkAccounted(t *testing.T, r Report) {
	t.Helper()
	everyCallEnded(t, r)
	if last := r.Samples[len(r.Samples)-1]; last.Gateway != 0 || last.Queued.Interactive+last.Queued.Default+last.Queued.Bulk != 0 {
		t.Errorf("%s: left at the end: %+v", r.Scenario, last)
	}
}

// 1. The incident, qualitatively: without a limiter, the storm; with
// lanes, none of it, every goal met.
func TestIncident(t *testing.T) {
	b := runAll(t)
	storm, lanes := b.Incident[0], b.Incident[1]
	o := Incident()
	for _, r := range b.Incident {
		checkAccounted(t, r)
	}
	if storm.RequestTimeouts == 0 || storm.Retries == 0 || storm.Gateway.TokensWasted == 0 || storm.Gateway.Peak <= o.Capacity {
		t.Errorf("no storm without a limiter: %d timeouts, %d retries, %d wasted, peak %d",
			storm.RequestTimeouts, storm.Retries, storm.Gateway.TokensWasted, storm.Gateway.Peak)
	}
	if lanes.Gateway.Peak > o.Limit || lanes.Retries != 0 || lanes.PanelsDone != o.Panels {
		t.Errorf("lanes: peak %d, %d retries, %d panels", lanes.Gateway.Peak, lanes.Retries, lanes.PanelsDone)
	}
	if chat, bulk := lanes.Classes["interactive"], lanes.Classes["bulk"]; chat.WaitP99 >= bulk.WaitP50 {
		t.Errorf("chat waited %v (p99), bulk %v (p50): interactive not ahead", chat.WaitP99, bulk.WaitP50)
	}
	for _, g := range Goals(storm, lanes) {
		if !g.Met {
			t.Errorf("goal not met: %s (%s)", g.Text, g.Figure)
		}
	}
	if b.Incident[2].Gateway.RateLimited == 0 || b.Incident[2].Gateway.Peak > o.Limit {
		t.Errorf("gateway-429: %+v", b.Incident[2].Gateway)
	}
}

// 2. Aging happens in the replay: a bulk call that waited over 120 s is
// granted while a default call that arrived after it still waits. Without
// aging, a waiting default call always goes first.
func TestAgingInReplay(t *testing.T) {
	r, err := Run("lanes", Incident())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Grants {
		if b.Class != "bulk" || !b.Granted || b.Ended-b.Asked <= 120*time.Second {
			continue
		}
		for _, d := range r.Grants {
			if d.Class == "default" && d.Arrival > b.Arrival && d.Asked < b.Ended && d.Ended > b.Ended {
				return // overtaken
			}
		}
	}
	t.Fatal("no bulk call that waited over 120 s overtook a later default call")
}

// 3. Two processes: each with its own lane of 6 they put 12 calls on a
// gateway of 8, and a lanes-exporter watching them reports the budget
// over-committed; through one shared lane of 8 neither happens.
func TestTwoProcesses(t *testing.T) {
	b := runAll(t)
	o := TwoProcesses()
	per, shared := b.TwoProcesses[0], b.TwoProcesses[1]
	checkAccounted(t, per)
	checkAccounted(t, shared)
	if per.Gateway.Peak <= o.Capacity {
		t.Errorf("per-agent lanes: peak %d, want over the capacity %d", per.Gateway.Peak, o.Capacity)
	}
	if shared.Gateway.Peak > o.Capacity {
		t.Errorf("shared exporter: peak %d over the capacity %d", shared.Gateway.Peak, o.Capacity)
	}
	pv, sv := b.Budget[0], b.Budget[1]
	if !pv.Budget.Overcommitted || pv.Budget.Total != 2*o.Limit || !strings.HasSuffix(pv.Gauge, " 1") {
		t.Errorf("per-agent budget: %+v", pv)
	}
	if sv.Budget.Overcommitted || sv.Budget.Total != o.SharedLimit || !strings.HasSuffix(sv.Gauge, " 0") {
		t.Errorf("shared budget: %+v", sv)
	}
}

// 3. The gateway degrades: with the ADR's rule the onset is seen at once
// but the recovery only minutes later (as the report says); with
// clear_after the route is right at 95 % of polls or more and sees each
// change within 30 s, with no false alarm.
func TestDegradation(t *testing.T) {
	b := runAll(t)
	adr, clear := b.Degradation[0].Accuracy(), b.Degradation[1].Accuracy()
	if adr.DetectOnset < 0 || adr.DetectOnset > 30*time.Second || adr.DetectRecovery <= 30*time.Second || adr.GatewayShare() >= 0.95 {
		t.Errorf("ADR windows: %+v (%.3f); the report says onset within 30 s, recovery after more", adr, adr.GatewayShare())
	}
	if clear.GatewayShare() < 0.95 || clear.DetectOnset < 0 || clear.DetectOnset > 30*time.Second ||
		clear.DetectRecovery < 0 || clear.DetectRecovery > 30*time.Second || clear.FalseAlarms != 0 {
		t.Errorf("clear_after %s: %+v (%.3f)", ClearAfter, clear, clear.GatewayShare())
	}
	for _, r := range b.Degradation {
		checkAccounted(t, r)
		if r.Gateway.Resets == 0 || r.Gateway.ServerErrors == 0 || r.Retries == 0 {
			t.Errorf("%s: no fault happened: %+v", r.Scenario, r.Gateway)
		}
	}
}

// The real-HTTP replay keeps the hard invariants whatever the machine's
// load (the lane never lets more than its limit through; every call ends),
// and measures its own lag.
func TestRunHTTP(t *testing.T) {
	o := Incident()
	o.Duration = 3 * time.Minute
	r, f, err := RunHTTP(context.Background(), "lanes", o, 0.005)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", f)
	if r.Gateway.Peak > o.Limit || r.Gateway.Peak == 0 {
		t.Errorf("peak %d at the gateway, limit %d", r.Gateway.Peak, o.Limit)
	}
	everyCallEnded(t, r)
	if f.Bound != o.Backoff || f.Scale != 0.005 || f.Faithful != (f.MaxLag < f.Bound) {
		t.Errorf("fidelity %+v", f)
	}
}

func TestUnknownScenario(t *testing.T) {
	if _, err := Run("nope", Incident()); err == nil || !strings.Contains(err.Error(), "no-limiter") {
		t.Fatalf("err %v", err)
	}
	if _, _, err := RunHTTP(context.Background(), "shared-exporter", Incident(), 0.01); err == nil {
		t.Fatal("RunHTTP took a scenario it does not model")
	}
}

// The shared-lanes replay: two agents, each with its own limiter, share one
// lane through a real Redis: the gateway never works on more than the
// shared lane's limit, and every call ends.
func TestRunShared(t *testing.T) {
	r := redistest.Start(t)
	r.WaitUptime(time.Second)
	o := TwoProcesses()
	o.Duration = 3 * time.Minute
	rep, f, err := RunShared(context.Background(), o, 0.005, r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", f)
	if rep.Gateway.Peak > o.SharedLimit || rep.Gateway.Peak == 0 {
		t.Errorf("peak %d at the gateway, shared limit %d", rep.Gateway.Peak, o.SharedLimit)
	}
	everyCallEnded(t, rep)
}

// The two boards: the same inputs give the same report; with fair shares
// board B's panel finishes, sooner than with no tenants (where it does
// not finish at all, or later), and within 1.25x of board B alone on half
// the slots (under an order where aging lifted board A's calls over board
// B's within a class, it took 1.68x); the report shows the three side by
// side, with the goals checked as they stand (that all of board A's
// panels finish is reported, met or not: see the report for the cause).
func TestTwoBoards(t *testing.T) {
	a, err := RunBoards(TwoBoards())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RunBoards(TwoBoards())
	var ma, mb bytes.Buffer
	a.Markdown(&ma)
	b.Markdown(&mb)
	if ma.String() != mb.String() {
		t.Fatalf("two runs differ:\n%s\n%s", ma.String(), mb.String())
	}
	fair, none, alone := panelsOf(a.Fair, 1), panelsOf(a.NoTenants, 1), panelsOf(a.Alone, 1)
	if len(fair) != 1 || len(none) != 1 || len(alone) != 1 || len(panelsOf(a.Fair, 0)) != 3 || len(panelsOf(a.Alone, 0)) != 0 {
		t.Fatalf("panels: fair %v, no tenants %v, alone %v", a.Fair.PanelTimes, a.NoTenants.PanelTimes, a.Alone.PanelTimes)
	}
	if fair[0].Took == 0 || alone[0].Took == 0 || (none[0].Took != 0 && none[0].Took <= fair[0].Took) {
		t.Fatalf("board B's panel: fair shares %s, no tenants %s (0: not finished), alone %s", fair[0].Took, none[0].Took, alone[0].Took)
	}
	if gs := a.Goals(); len(gs) != 2 || !gs[0].Met {
		t.Errorf("goals %+v: want board B's panel within 1.25x of alone", gs)
	}
	for _, want := range []string{"| | **two boards, fair shares** | **two boards, no tenants** | **board B alone, half the slots** |",
		"| board B's panel |", "board B's panel, with fair shares, at most 1.25x", "board A's panels all finish, with fair shares"} {
		if !strings.Contains(ma.String(), want) {
			t.Errorf("the two boards' section lacks %q:\n%s", want, ma.String())
		}
	}
}

// The tokens-per-minute replay: the same inputs give the same report; with
// tokens_per_minute at the gateway's limit no request is answered 429 and
// at least 95% of the limit is used while calls queue; following the
// headers with no budget, at least 90% is used and every 429 came before
// the first answer (the lane knew nothing then), none after; with
// cold_start on as well, at most 1% of the requests are answered 429 (none
// are blind); lanes sized in calls walk into 429s.
func TestTokenLimit(t *testing.T) {
	a, err := RunTokens(TokenLimit())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RunTokens(TokenLimit())
	var ma, mb bytes.Buffer
	a.Markdown(&ma)
	b.Markdown(&mb)
	if ma.String() != mb.String() {
		t.Fatalf("two runs differ:\n%s\n%s", ma.String(), mb.String())
	}
	bu, hd, calls := a.Budget.Tokens, a.Headers.Tokens, a.Calls.Tokens
	if bu.RateLimited != 0 || !bu.Queued || bu.Share < 0.95 {
		t.Errorf("with the budget: %+v, want no 429, calls queued throughout and at least 95%% used", bu)
	}
	if !hd.Queued || hd.Share < 0.90 || hd.RateLimited != hd.Blind || hd.FirstAnswer == 0 {
		t.Errorf("following the headers: %+v, want at least 90%% used and no 429 after the first answer", hd)
	}
	cs := a.ColdStart.Tokens
	if !cs.Queued || cs.Share < 0.90 || cs.Blind != 0 || cs.RateLimited != 0 || cs.FirstAnswer == 0 {
		t.Errorf("following the headers with cold_start: %+v, want at least 90%% used and no 429", cs)
	}
	for _, g := range a.Goals() {
		if !g.Met {
			t.Errorf("goal not met: %s (%s)", g.Text, g.Figure)
		}
	}
	if calls.RateLimited < 10*max(1, hd.RateLimited) {
		t.Errorf("lanes sized in calls: %d 429s, want far more than the %d following the headers", calls.RateLimited, hd.RateLimited)
	}
}
