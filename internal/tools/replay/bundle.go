package replay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
)

// Bundle is every replay the report shows.
type Bundle struct {
	Incident     []Report // Scenarios, with Incident()
	TwoProcesses []Report // one lane per agent, then the shared exporter, with TwoProcesses()
	Budget       []BudgetView
	Degradation  []Report // Degradation() with the ADR's windows, then with ClearAfter
	// HTTP and Fidelity are the real-HTTP replays of Scenarios, when run.
	HTTP     []Report
	Fidelity []Fidelity
	// Shared is TwoProcesses' agents sharing one lane through Redis (real
	// HTTP, a real redis-server), when run.
	Shared         *Report
	SharedFidelity Fidelity
	Boards         Boards    // TwoBoards()
	Tokens         TokenRuns // TokenLimit()
	// LiteLLM is the replay in front of a LiteLLM-like gateway through
	// lanes-exporter (real HTTP), when run.
	LiteLLM []LiteLLMRun
	// Deadlines is the replay of callers whose timeout is shorter than the
	// wait (RunDeadlines), with the estimate's error.
	Deadlines        []DeadlineRun
	DeadlineEstimate EstimateError
}

// ClearAfter is the classification setting the degradation replay tries
// beside the ADR's rule.
const ClearAfter = 30 * time.Second

// RunAll runs the deterministic replays and the budget check.
func RunAll(ctx context.Context) (Bundle, error) {
	var b Bundle
	run := func(name, scenario string, o Options) (Report, error) {
		r, err := Run(scenario, o)
		r.Scenario = name
		return r, err
	}
	for _, s := range Scenarios {
		r, err := run(s, s, Incident())
		if err != nil {
			return b, err
		}
		b.Incident = append(b.Incident, r)
	}
	for _, s := range []struct{ name, scenario string }{{"lanes per agent", "lanes"}, {"shared-exporter", "shared-exporter"}} {
		r, err := run(s.name, s.scenario, TwoProcesses())
		if err != nil {
			return b, err
		}
		b.TwoProcesses = append(b.TwoProcesses, r)
	}
	var err error
	if b.Budget, err = CheckBudget(ctx, TwoProcesses()); err != nil {
		return b, err
	}
	o := Degradation()
	for _, c := range []struct {
		name  string
		clear time.Duration
	}{{"degraded, ADR windows", 0}, {"degraded, clear_after 30s", ClearAfter}} {
		o.Thresholds.ClearAfter = c.clear
		r, err := run(c.name, "lanes", o)
		if err != nil {
			return b, err
		}
		b.Degradation = append(b.Degradation, r)
	}
	if b.Boards, err = RunBoards(TwoBoards()); err != nil {
		return b, err
	}
	b.Tokens, err = RunTokens(TokenLimit())
	return b, err
}

// RunHTTPAll adds the real-HTTP replays at scale.
func (b *Bundle) RunHTTPAll(ctx context.Context, scale float64) error {
	for _, s := range Scenarios {
		r, f, err := RunHTTP(ctx, s, Incident(), scale)
		if err != nil {
			return err
		}
		b.HTTP, b.Fidelity = append(b.HTTP, r), append(b.Fidelity, f)
	}
	return nil
}

// RunLiteLLMAll adds the replay in front of a LiteLLM-like gateway.
func (b *Bundle) RunLiteLLMAll(ctx context.Context, scale float64) error {
	runs, err := RunLiteLLM(ctx, scale)
	b.LiteLLM = runs
	return err
}

// RunDeadlinesAll adds the replay of callers whose timeout is shorter
// than the wait.
func (b *Bundle) RunDeadlinesAll(ctx context.Context, scale float64) error {
	runs, est, err := RunDeadlines(ctx, scale)
	b.Deadlines, b.DeadlineEstimate = runs, est
	return err
}

// RunSharedRedis adds the replay of TwoProcesses' agents sharing one lane
// through a redis-server it starts (make tools installs it).
func (b *Bundle) RunSharedRedis(ctx context.Context, scale float64) error {
	dir, err := os.MkdirTemp("", "replay-redis-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r, err := redistest.Launch(dir)
	if err != nil {
		return err
	}
	defer r.Kill()
	if err := r.Uptime(time.Second); err != nil { // sharedlane grants nothing for a lease after Redis starts
		return err
	}
	rep, f, err := RunShared(ctx, TwoProcesses(), scale, r.URL())
	if err != nil {
		return err
	}
	b.Shared, b.SharedFidelity = &rep, f
	return nil
}

// Goal is one of the headline's goals, checked.
type Goal struct {
	Text, Figure string
	Met          bool
}

// goalList writes goals as a Markdown list, each marked met or not.
func goalList(w io.Writer, goals []Goal) {
	for _, g := range goals {
		mark := "met"
		if !g.Met {
			mark = "**not met**"
		}
		fmt.Fprintf(w, "- %s: %s (%s)\n", g.Text, mark, g.Figure)
	}
}

// Goals checks the headline's goals on the incident's lanes run against
// the no-limiter one.
func Goals(noLimiter, lanes Report) []Goal {
	chat := lanes.Classes["interactive"]
	var gs []Goal
	add := func(met bool, text, format string, args ...any) {
		gs = append(gs, Goal{Text: text, Figure: fmt.Sprintf(format, args...), Met: met})
	}
	add(lanes.RequestTimeouts == 0, "no request timeouts", "%d", lanes.RequestTimeouts)
	add(lanes.Retries == 0, "no retries", "%d", lanes.Retries)
	add(lanes.Gateway.TokensWasted == 0, "no wasted gateway work", "%d tokens", lanes.Gateway.TokensWasted)
	add(lanes.Gateway.Peak <= lanes.Options.Limit, "peak at the gateway at most the limit", "%d of %d", lanes.Gateway.Peak, lanes.Options.Limit)
	add(chat.Completed > 0 && chat.TTFTP99 <= lanes.IdleTTFT*3/2, "chat p99 time to first token at most 1.5x an idle gateway's",
		"%s against %s", secs(chat.TTFTP99), secs(lanes.IdleTTFT))
	panels := lanes.PanelsFinishedAt > 0 && (noLimiter.PanelsFinishedAt == 0 || lanes.PanelsFinishedAt <= noLimiter.PanelsFinishedAt/2)
	nl := "never all"
	if noLimiter.PanelsFinishedAt > 0 {
		nl = noLimiter.PanelsFinishedAt.Round(time.Second).String()
	}
	add(panels, "every panel finished in at most half the no-limiter time", "%s against %s", lanes.PanelsFinishedAt.Round(time.Second), nl)
	add(lanes.FailedAfterGateway == 0, "every failed call a fast queue timeout", "%d fast, %d after the gateway", lanes.FastFails, lanes.FailedAfterGateway)
	return gs
}

// Markdown writes the report: docs/INCIDENT-REPLAY.md.
func (b Bundle) Markdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("%s", mdIntro)
	Incident().Parameters(w)
	p("\n## The incident\n\n")
	Table(w, b.Incident)
	p("\nThe headline's goals, with the ADR's settings (checked by `internal/tools/replay`'s tests):\n\n")
	goalList(w, Goals(b.Incident[0], b.Incident[1]))
	p("\n%s", mdIncident)
	for _, r := range b.Incident {
		p("![%s: timeline](%s)\n", r.Scenario, SVGName(r))
	}

	p("\n## Two processes, one gateway\n\n%s", mdTwo)
	TwoProcesses().Parameters(w)
	p("\n")
	Table(w, b.TwoProcesses)
	p("\nWhat a lanes-exporter watching the set-up reports (its `/api/telemetry/llm-lanes/budget` route and the `llmlanes_llm_lane_overcommitted` gauge on which the `LLMLanesBudgetOvercommitted` alert fires after 15 minutes), from a real exporter on loopback:\n\n")
	p("| set-up | limits | budget | gateway capacity | over-committed | gauge |\n| --- | --- | ---: | ---: | --- | ---: |\n")
	for _, v := range b.Budget {
		var lims []string
		for _, who := range slices.Sorted(maps.Keys(v.Budget.Limits)) {
			lims = append(lims, fmt.Sprintf("%s %d", who, v.Budget.Limits[who]))
		}
		gauge := v.Gauge[strings.LastIndexByte(v.Gauge, ' ')+1:]
		p("| %s | %s | %d | %d | %v | %s |\n", v.Setup, strings.Join(lims, ", "), v.Budget.Total, v.Budget.Capacity, v.Budget.Overcommitted, gauge)
	}
	p("\n%s", mdTwoAfter)
	for _, r := range b.TwoProcesses {
		p("![%s: timeline](%s)\n", r.Scenario, SVGName(r))
	}

	p("\n## Two boards, one review gate\n\n%s", mdBoards)
	TwoBoards().Parameters(w)
	p("\n")
	b.Boards.Markdown(w)
	p("\n%s", mdBoardsAfter)

	p("\n## A provider's tokens per minute\n\n%s", mdTokens)
	TokenLimit().Parameters(w)
	p("\n")
	b.Tokens.Markdown(w)
	h := b.Tokens.Headers.Tokens
	p("\n"+mdTokensAfter, h.Blind, h.RateLimited-h.Blind, 100*share429(b.Tokens.Headers))

	p("\n## The gateway degrades mid-incident\n\n%s", mdDegraded)
	Degradation().Parameters(w)
	p("\n| classification rule | polls | gateway verdict right | local verdict right | onset detected after | recovery detected after | false alarms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range b.Degradation {
		a := r.Accuracy()
		p("| %s | %d | %.1f %% | %.1f %% | %s | %s | %d |\n", r.Scenario, a.Polls, 100*a.GatewayShare(), 100*a.LocalShare(),
			detect(a.DetectOnset), detect(a.DetectRecovery), a.FalseAlarms)
	}
	p("\n%s\n", mdDegradedAfter)
	Table(w, b.Degradation)
	p("\n")
	for _, r := range b.Degradation {
		p("![%s: timeline](%s)\n", r.Scenario, SVGName(r))
	}

	if len(b.HTTP) > 0 {
		p("\n## The same incident over real HTTP\n\n%s", mdHTTP)
		for i, f := range b.Fidelity {
			p("- %s: %s\n", b.HTTP[i].Scenario, f)
		}
		p("\n")
		Table(w, b.HTTP)
	}
	if b.Shared != nil {
		p("\n## Two processes sharing one lane in Redis (real HTTP, real Redis)\n\n%s", mdShared)
		p("- %s\n\n", b.SharedFidelity)
		Table(w, []Report{b.TwoProcesses[0], b.TwoProcesses[1], *b.Shared})
	}
	if len(b.LiteLLM) > 0 {
		r := b.LiteLLM[0]
		p("\n## In front of LiteLLM, through the proxy (real HTTP)\n\n"+mdLiteLLM, r.Callers, r.ClientTimeout.Seconds(), r.Retried, r.Backend, r.IdleCall.Seconds(), r.Limit)
		liteTable(w, b.LiteLLM)
	}
	if len(b.Deadlines) > 0 {
		p("\n## Callers whose timeout is shorter than the wait, through the proxy (real HTTP)\n\n"+mdDeadlines,
			dlCallers, dlTimeout.Seconds(), dlRetries, dlCapacity, (dlFirstToken + dlTokens*dlTokenTime).Seconds(), dlCapacity)
		deadlineTable(w, b.Deadlines, b.DeadlineEstimate)
	}
	p("\n%s", mdLimits)
}

// Files renders the report and its pictures, by file name.
func (b Bundle) Files() map[string][]byte {
	files := map[string][]byte{}
	var md bytes.Buffer
	b.Markdown(&md)
	files["INCIDENT-REPLAY.md"] = md.Bytes()
	for _, rs := range [][]Report{b.Incident, b.TwoProcesses, b.Degradation} {
		for _, r := range rs {
			var svg bytes.Buffer
			Timeline(&svg, r)
			files[SVGName(r)] = svg.Bytes()
		}
	}
	return files
}

// SVGName is the file name of r's timeline.
func SVGName(r Report) string {
	slug := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			return c
		}
		return '-'
	}, strings.ToLower(r.Scenario))
	for strings.Contains(slug, "--") {
		slug = strings.ReplaceAll(slug, "--", "-")
	}
	return "incident-replay-" + strings.Trim(slug, "-") + ".svg"
}

func detect(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return secs(d)
}

const mdIntro = `# Incident replay: lanes turn a retry storm into a visible queue

Regenerate with ` + "`make replay`" + ` (it runs ` + "`go run ./examples/incident-replay -out docs -http`" + `);
` + "`go run ./examples/incident-replay`" + ` alone writes to a new temporary directory and prints its name.

The #209 incident of ADR-0115, replayed as a discrete-event simulation in virtual time.
**One clock**: the real limiter (package ` + "`limiter`" + `, with its aging, reserve, queue
timeout, 60 s saturation dwell and 5-minute windows) and the real classification route
(package ` + "`telemetry`" + `, polled in-process) run on the same fake clock as the model of
the gateway (gatewaysim's processor sharing, token by token) and of the SDK clients. Nothing
depends on the machine: the same inputs give the same tables, byte for byte, on any machine
under any load (a test checks it). The last section replays the same load over real HTTP, on
a scaled clock, with a check of how far the machine's scheduling lag bent it.

Every parameter, as the ADR sets it:

`

const mdIncident = `Reading it: without a limiter every call goes to the gateway at once; past its capacity
every answer slows in proportion, calls pass the SDK's 120 s timeout, are abandoned (the
gateway finishes them anyway: wasted work) and retried, and the retries make it worse. With
gateway-side 429s the gateway stays fast, but the calls refused at once are retried within a
second and a half and then fail: the panels never finish. With lanes the gateway never sees
more than 5; the operator's chat always finds the reserved slot; the bulk finders wait in
the queue, age one class per minute and so overtake the coder calls that came after them;
the coder calls that cannot be served within 300 s end with a queue timeout, at once and
without reaching the gateway (their answer says ` + "`X-Should-Retry: false`" + `, so the SDK does
not retry). Queue waits count granted and timed-out waits; times to first token run from the
call's start, over its retries, for completed calls.

`

const mdTwo = `ADR-0115's own warning: "two instances with max_inflight: 6 each can still put 12 calls on
a gateway sized for 8". Two agents each run the incident's load on one gateway of capacity 8,
first each with its own lane of 6, then both through one shared lanes-exporter whose lane has
the gateway's 8 slots, 2 of them reserved for the two operators (this set-up's choice: one
reserved slot per interactive caller).

`

const mdTwoAfter = `Reading it: with a lane per agent, each process keeps its own limit and together they put
12 calls on a gateway sized for 8; the exporter watching them says so (budget 12 against a
capacity of 8, the gauge at 1). Through the shared exporter the gateway never sees more than
its 8. In this model a gateway past its capacity only slows in proportion and so serves the
same tokens per second, which is why the over-commit costs little here beyond the chat's
time to first token and the operators' turns; a real gateway pushed past its capacity does
worse (the incident above). The shared lane holds the gateway to its 8 slots for real, so
more coder calls end in a fast queue timeout.

`

const mdDegraded = `The incident through lanes, with a gateway that fails from minute 4 to minute 7: the answers
in progress break off, then half the calls get a 503 (the SDK retries them). The
classification route is polled every 10 s and compared with the ground truth. The gateway
verdict is whether the route lists a gateway reason (` + "`upstream_errors`" + `, ` + "`retries`" + `): the
lane queues throughout, so its state is ` + "`local_queue`" + ` with the gateway's reasons listed, as
the ADR wants. The local verdict is whether the state is ` + "`local_queue`" + ` exactly while some
call has waited longer than the 30 s wait threshold.

`

const mdDegradedAfter = `**With the ADR's rule the goal (95 % of polls right, each change seen within 30 s) is not
met**: the onset is seen at the next poll, but the errors, and the retries the queue sends
after the recovery, count for 5 minutes, so the route says the gateway fails for minutes
after it recovered. The setting that meets it is ` + "`classification.clear_after: 30s`" + `
(` + "`classify.Thresholds.ClearAfter`" + `): the gateway reasons then hold only while the latest
upstream error is at most 30 s old. It is off by default, as the ADR's rule is the contract;
its cost is that a gateway failing less often than every 30 s reads as healthy between
failures (the missed polls above), and a recovery can read as seen at once when the last
error came more than 30 s before it.

`

const mdHTTP = `The same load, the same settings, over loopback: SDK-like HTTP clients, the real
` + "`lanehttp.Transport`" + ` (whose timeouts run on the limiter's clock) and the real gatewaysim,
every duration multiplied by the scale; the limiter runs on a clock scaled the same way, so
aging and the queue timeout happen as in the simulation. These figures vary a little from
run to run (scheduling, HTTP overhead added to each token); a probe measures the largest
timer lateness, and a run whose lag reached the smallest interval of the model (the first
retry's 0.5 s backoff) is flagged as not faithful.

`

const mdShared = `The agents of "Two processes, one gateway", each with its own limiter, both limiters on
` + "`sharedlane`" + ` backends in one redis-server: one lane of 8 slots (2 reserved) shared through
Redis instead of through one exporter. Redis' clock cannot be scaled, so this run is over
real HTTP at the scale below, with the limiters on the real clock and their durations
scaled (queue timeout 3 s, aging step 0.6 s, transport timeouts 1.2 s; the lease TTL is
1 s); its figures vary a little from run to run. Beside it, the two simulated set-ups of
that section.

`

const mdBoards = `Two boards auto-open PRs into one review gate (the ADR's second incident). Board A runs
the incident's load; board B sends one panel of five finders three minutes in, and a coder
call a minute. With fair shares, each board's calls name it as their tenant
(` + "`X-LLM-Tenant: board-a`" + `), so that within a class the lane serves the board that has had
the least slot-time; with no tenants the lane orders by class and arrival alone. Board B
alone runs on a lane of 3 slots with 1 reserved: 2 of the shared lane's 4 non-interactive
slots, its fair share.

`

const mdBoardsAfter = `The order is the contract's three steps (docs/DESIGN.md, "Tenants and fair shares"): aging
lifts a class, never one board's calls over the other's. Board A's finders, queued since
the first minutes, raise the bulk class; within it, board B has had less slot-time, so its
fresh finders go first, on the 4 non-interactive slots, and its panel finishes sooner than
alone on 2 of them. Board A's last panel loses a finder to the 5-minute queue timeout: with
both boards the lane is over capacity for that timeout (default calls time out in both
runs, with fair shares or none), and the slot-time board B's panel takes within bulk
comes out of board A's youngest finders. With no tenants the same timeout falls on board
B's panel instead. The goal that all of board A's panels finish is not met by the rule as
written, and the rule and the scenario are kept as they are: what misses it is the load
against the queue timeout, not the order.
`

const mdTokens = `The incident's load on a gateway that limits the tokens it serves a minute, as OpenAI's,
Azure OpenAI's and Anthropic's do, through four kinds of lanes with the ADR's settings:
lanes sized in calls only (they know nothing of tokens: what they let through beyond the
limit is answered 429, and the SDK retries it); lanes with ` + "`tokens_per_minute`" + ` set to the
gateway's limit, which estimate every call (` + "`lanehttp.EstimateTokens`" + ` of its body), queue
what does not fit and settle each call against its usage; lanes with no budget that
follow the gateway's ` + "`x-ratelimit-remaining-tokens`" + ` and ` + "`x-ratelimit-reset-tokens`" + ` (and a
429's ` + "`Retry-After`" + `); and the same with ` + "`cold_start`" + ` on, the one setting changed from the
defaults there: a new lane sends one call until the first answer's headers. The tokens used
count as the provider bills them: a prompt when it arrives, each answer token when it is
made; the window starts at minute 2, once the bucket's first minute, full at the start, is
spent. A figure a little over 100 % is the window's edges: answers admitted before minute 2
count their tokens in it.

`

const mdTokensAfter = `With the budget, the lane keeps the gateway's bucket and its own in step (it reserves its
estimate, at least the gateway's reservation, when it grants a call, and settles both to the
usage when the call ends), so the gateway answers no 429 and the queue, not the SDK's retry
loop, holds what does not fit: the calls that wait longest reach the queue timeout, fast and
marked not to be retried. Following the headers alone, the lane keeps within what they say
remains, less the calls in flight that the provider's count may not hold, and past the reset they
announce it goes on refilling the provider's bucket as they described it until it is whole.
Before the first answer it knows nothing: with the defaults, the calls sent at once at the
start go blind, and those that do not fit are answered 429 (here %d of them, %d after the
first answer, %.1f %% of the requests; the ADR's settings give few requests, 5 slots of 46 s
answers). With ` + "`cold_start`" + ` the lane sends one call until that answer's headers (2 s here),
and the goals are met. The cold start is not the default: it costs every new lane one
answer's first byte, and a gateway that says nothing of its limits gains nothing from it.
`

const mdLimits = `## What the model leaves out

- No jitter in the SDK's backoff (the SDKs add up to 25 %), no connection set-up time, and a
  gateway with no variance: each token takes its share of the capacity, exactly.
- The clients hold no connection limit of their own (the OpenAI SDKs' HTTP pools allow far
  more than this load).
- The shared exporter is modelled as the one lane every agent's calls pass through; its HTTP
  path is what the real-HTTP replay and the proxy's own tests measure.
`
