package replay

import (
	"fmt"
	"io"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
)

// Scenarios of the incident, in report order. Run takes these names, and
// "shared-exporter" for the two-process comparison.
var Scenarios = []string{"no-limiter", "lanes", "gateway-429"}

// Options shape a replay; every duration is simulated time.
type Options struct {
	Seed     uint64        // draws the coders' arrivals and the gateway's faults
	Duration time.Duration // how long calls keep arriving

	// The gateway: Capacity answers at full speed, Tokens tokens of
	// TokenTime after FirstTokenDelay; past Capacity every answer slows in
	// proportion (processor sharing, as in gatewaysim).
	Capacity        int
	Tokens          int
	TokenTime       time.Duration
	FirstTokenDelay time.Duration

	// The lanes: one lane per process of Limit slots, Reserve of them kept
	// for interactive calls, and a queue timeout.
	Limit        int
	Reserve      int
	QueueTimeout time.Duration

	// The clients, as the OpenAI SDKs behave: each attempt bounded by
	// RequestTimeout (with lanes: the transport's header and stall
	// timeouts, which start once the slot is held), Retries retries after
	// Backoff, doubled each time, on 429, 5xx and timeouts; none after an
	// answer marked X-Should-Retry: false (a queue timeout).
	RequestTimeout time.Duration
	Retries        int
	Backoff        time.Duration

	// The load of each of Agents processes: an operator who sends a chat
	// turn ChatEvery after each reply; coder calls every CoderEvery on
	// average (uniform between half and one and a half times it); Panels
	// review panels of PanelSize bulk finder calls, PanelEvery apart.
	Agents     int
	ChatEvery  time.Duration
	CoderEvery time.Duration
	Panels     int
	PanelSize  int
	PanelEvery time.Duration

	// SharedLimit and SharedReserve are the settings of the one lane of
	// the "shared-exporter" scenario, which every agent's calls pass
	// through.
	SharedLimit   int
	SharedReserve int

	// A fault, when FaultEnd is after FaultStart: at FaultStart the gateway
	// breaks off every answer in progress (a replica fails), then answers
	// FaultShare of the calls with 503 until FaultEnd.
	FaultStart time.Duration
	FaultEnd   time.Duration
	FaultShare float64

	// PollEvery is how often the classification route is polled, and the
	// timeline sampled.
	PollEvery  time.Duration
	Thresholds classify.Thresholds

	// Adaptive, with "lanes", makes the lane's limit adaptive, Limit its
	// ceiling (see limiter.Adaptive); nil: Limit is fixed.
	Adaptive *limiter.Adaptive
	// NoPriorities puts every call in one class in the lane, with no
	// reserve: a limiter without a priority queue.
	NoPriorities bool
	// Request bodies: ChatBytes, CoderBytes and FinderBytes by class, each
	// call's drawn within PromptJitter (a share) of it; the gateway takes
	// PromptTime per KiB before the first token, at no load.
	ChatBytes, CoderBytes, FinderBytes int
	PromptJitter                       float64
	PromptTime                         time.Duration
	// RejectAbove makes the gateway answer 429 at once to a call that
	// arrives with this many in progress (any set-up; "gateway-429" uses
	// Limit).
	RejectAbove int
	// CapacityChanges change the gateway's capacity as the run goes.
	CapacityChanges []CapacityChange
	// Jitter and Bimodal add to each first token a delay that does not
	// depend on the load (see gatewaysim.Config.Jitter).
	Jitter  time.Duration
	Bimodal bool
	// Clients, when above 0, replaces the incident's load with this many
	// clients, each sending a default call of CoderBytes as soon as its
	// last one ended (a closed loop), for Duration.
	Clients int
	// BoardBPanelAt, with the "two-boards" and "board-b-alone" scenarios,
	// makes agent 1 a second board: no operator, its coder calls, and one
	// panel of PanelSize finders at BoardBPanelAt. In "two-boards" both
	// boards share one lane (SharedLimit, SharedReserve); Tenants names
	// each board's calls as its tenant (board-a, board-b), so that the
	// lane shares its slots fairly between them. "board-b-alone" runs
	// board B alone on a lane of BoardBAloneLimit slots.
	BoardBPanelAt    time.Duration
	BoardBCoderEvery time.Duration // board B's coder calls, on average (0: CoderEvery)
	Tenants          bool
	BoardBAloneLimit int
	// TokensPerMinute, when above 0, makes the gateway limit the tokens it
	// serves a minute as OpenAI does (gatewaysim.TokenLimit): a call that
	// does not fit is answered 429 with Retry-After, and every answer says
	// what remains (x-ratelimit-*-tokens). Each call asks for MaxTokens
	// (its output bound); its prompt is its body's bytes of text. With the
	// "tokens" scenario, TokenMode says what the lanes know of tokens:
	// TokensCalls (nothing: lanes sized in calls), TokensBudget
	// (tokens_per_minute set to the gateway's limit), TokensHeaders (no
	// budget; the gateway's rate-limit headers followed) or
	// TokensColdStart (as TokensHeaders, with the lanes' cold_start on).
	TokensPerMinute int64
	MaxTokens       int
	TokenMode       string
}

// The lanes' token modes of the "tokens" scenario.
const (
	TokensCalls     = "calls"
	TokensBudget    = "budget"
	TokensHeaders   = "headers"
	TokensColdStart = "cold-start"
)

// CapacityChange sets the gateway's capacity at a time.
type CapacityChange struct {
	At       time.Duration
	Capacity int
}

// Incident returns the #209 incident with the ADR's settings: a gateway of
// capacity 6 whose answers (45 tokens of 1 s, after 1 s) take 46 s when
// idle; 3 panels of 5 finders a minute apart, coder calls every 10 s and
// an operator who sends a chat turn 15 s after each reply, for 10 minutes;
// SDKs with a 120 s request timeout and 2 retries (0.5 s, then 1 s);
// lanes of 5 with 1 reserved and a 300 s queue timeout.
func Incident() Options {
	return Options{Seed: 1, Duration: 10 * time.Minute,
		Capacity: 6, Tokens: 45, TokenTime: time.Second, FirstTokenDelay: time.Second,
		Limit: 5, Reserve: 1, QueueTimeout: 300 * time.Second,
		RequestTimeout: 120 * time.Second, Retries: 2, Backoff: 500 * time.Millisecond,
		Agents: 1, ChatEvery: 15 * time.Second, CoderEvery: 10 * time.Second,
		Panels: 3, PanelSize: 5, PanelEvery: time.Minute,
		PollEvery: 10 * time.Second, Thresholds: classify.DefaultThresholds()}
}

// TwoProcesses returns the ADR's over-commit: two agents, each running the
// incident's load, on one gateway sized for 8, each with its own lanes of
// 6 ("two instances with max_inflight: 6 each can still put 12 calls on a
// gateway sized for 8"); the shared exporter's one lane has the gateway's 8
// slots, 2 of them reserved (one operator per agent).
func TwoProcesses() Options {
	o := Incident()
	o.Agents, o.Capacity, o.Limit, o.Reserve = 2, 8, 6, 1
	o.SharedLimit, o.SharedReserve = 8, 2
	return o
}

// TwoBoards returns the ADR's second incident: two boards auto-open PRs
// into one review gate. Board A runs the incident's load (an operator,
// coder calls, three panels of five finders a minute apart); board B,
// three minutes in, one panel of five and a coder call a minute. Both share one
// lane with the ADR's settings (5 slots, 1 reserved). Board B alone gets
// a lane of 3 slots with the reserve of 1: 2 of the shared lane's 4
// non-interactive slots, its fair share.
func TwoBoards() Options {
	o := Incident()
	o.Agents, o.BoardBPanelAt, o.BoardBCoderEvery = 2, 3*time.Minute, time.Minute
	o.SharedLimit, o.SharedReserve, o.BoardBAloneLimit = o.Limit, o.Reserve, 3
	return o
}

// TokenLimit returns the incident on a gateway that limits tokens per
// minute, as OpenAI does: 9,000 a minute; chat turns of 2 KiB, coder calls
// of 8 KiB and finder calls of 16 KiB of prompt (each within ±25%), each
// asking for at most 256 tokens (the answers are the incident's 45). The
// load asks for more tokens than that, and the lanes (the ADR's 5 slots, 1
// reserved) would send them: tokens, not slots, are what is short.
func TokenLimit() Options {
	o := Incident()
	o.ChatBytes, o.CoderBytes, o.FinderBytes, o.PromptJitter = 2048, 8192, 16384, 0.25
	o.TokensPerMinute, o.MaxTokens = 9000, 256
	return o
}

// Degradation returns the incident through lanes with a gateway that
// fails between minutes 4 and 7: the answers in progress break off, then
// half the calls get a 503. The load runs for 12 minutes.
func Degradation() Options {
	o := Incident()
	o.Duration = 12 * time.Minute
	o.FaultStart, o.FaultEnd, o.FaultShare = 4*time.Minute, 7*time.Minute, 0.5
	return o
}

// Parameters writes every parameter as a Markdown list.
func (o Options) Parameters(w io.Writer) {
	p := func(name, format string, args ...any) {
		fmt.Fprintf(w, "- %s: "+format+"\n", append([]any{name}, args...)...)
	}
	p("seed", "%d", o.Seed)
	p("calls arrive for", "%s", o.Duration)
	p("gateway", "capacity %d; answers of %d tokens of %s after %s (%s when idle); processor sharing past capacity; no disconnect propagation",
		o.Capacity, o.Tokens, o.TokenTime, o.FirstTokenDelay, o.FirstTokenDelay+time.Duration(o.Tokens)*o.TokenTime)
	if o.Jitter > 0 {
		kind := fmt.Sprintf("uniform in [0, %s)", o.Jitter)
		if o.Bimodal {
			kind = fmt.Sprintf("0 or %s, equally likely", o.Jitter)
		}
		p("gateway jitter", "each first token %s later, whatever the load", kind)
	}
	if o.Clients > 0 {
		p("load", "%d clients, each sending a default call as soon as its last one ended", o.Clients)
	} else {
		p("load per agent", "%d agent(s); an operator's chat turn %s after each reply; a coder call every %s on average; %d review panels of %d bulk finders, %s apart",
			o.Agents, o.ChatEvery, o.CoderEvery, o.Panels, o.PanelSize, o.PanelEvery)
	}
	p("SDK", "request timeout %s; %d retries, backoff %s doubling, no jitter; no retry after X-Should-Retry: false",
		o.RequestTimeout, o.Retries, o.Backoff)
	p("lanes", "max_inflight %d, interactive_reserve %d, queue_timeout %s, aging one class per 60 s; transport header and stall timeouts %s from the grant",
		o.Limit, o.Reserve, o.QueueTimeout, o.RequestTimeout)
	if o.BoardBPanelAt > 0 {
		p("two boards", "agent 0 is board A (the load above); agent 1 is board B: no operator, a coder call every %s on average, one panel of %d finders at %s; both on one lane of max_inflight %d, interactive_reserve %d; board B alone: a lane of %d, interactive_reserve %d",
			o.BoardBCoderEvery, o.PanelSize, o.BoardBPanelAt, o.SharedLimit, o.SharedReserve, o.BoardBAloneLimit, o.Reserve)
	} else if o.SharedLimit > 0 {
		p("shared exporter's lane", "max_inflight %d, interactive_reserve %d", o.SharedLimit, o.SharedReserve)
	}
	if o.FaultEnd > o.FaultStart {
		p("fault", "from %s to %s: answers in progress break off at the start, then %.0f%% of calls get a 503",
			o.FaultStart, o.FaultEnd, 100*o.FaultShare)
	}
	if o.Adaptive != nil {
		p("adaptive limit", "between min_inflight %d and max_inflight %d, starting at %d after the probe", o.Adaptive.MinInflight, o.Limit, orMin(o.Adaptive))
	}
	if o.NoPriorities {
		p("priorities", "none: every call in one class, no reserve")
	}
	if o.ChatBytes > 0 {
		p("prompts", "chat %d, coder %d, finder %d bytes, each within ±%.0f%%; the gateway takes %s per KiB before the first token",
			o.ChatBytes, o.CoderBytes, o.FinderBytes, 100*o.PromptJitter, o.PromptTime)
	}
	if o.RejectAbove > 0 {
		p("gateway limit", "429 at once to a call arriving with %d in progress", o.RejectAbove)
	}
	if o.TokensPerMinute > 0 {
		p("gateway tokens per minute", "%d, a token bucket that refills continuously (as OpenAI's and Anthropic's limits do); a call reserves its prompt (the gateway's count: its text's bytes, 4 a token) and its max_tokens (%d) when it arrives and gets back what it did not use when it ends; past the limit a 429 with Retry-After (the SDK waits that long, as openai-go does up to 60 s, then retries); every answer's x-ratelimit-*-tokens say what remains and when it is whole again",
			o.TokensPerMinute, o.MaxTokens)
	}
	for _, c := range o.CapacityChanges {
		p("capacity change", "%d at %s", c.Capacity, c.At)
	}
	p("classification", "polled every %s; wait_p90 %s, upstream_errors %d at %.0f%% of exchanges, retries %d (5-minute windows)",
		o.PollEvery, o.Thresholds.WaitP90, o.Thresholds.UpstreamErrors, 100*o.Thresholds.ErrorRatio, o.Thresholds.Retries)
}

func orMin(a *limiter.Adaptive) int {
	if a.Initial > 0 {
		return a.Initial
	}
	return a.MinInflight
}
