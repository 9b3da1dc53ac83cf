package lanescenario

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// Lane is the key of the lane every scenario drives.
const Lane = "L"

// Start is where every scenario's clock starts.
var start = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// An Engine keeps the lane's decisions: it makes the limiter a scenario
// drives, and reads the lane's queue as it keeps it.
type Engine interface {
	// Name is the engine's name, "local" or "shared": the prefix of the
	// output lines only it prints.
	Name() string
	// New returns a limiter under cfg whose lanes read clock.
	New(t testing.TB, cfg limiter.Config, clock *limitertest.Clock) (*limiter.Limiter, error)
	// Queue returns lane's waiting calls, in any order, and, once a call
	// has named a tenant, every tenant's weighted service.
	Queue(t testing.TB, lim *limiter.Limiter, lane string) Queue
}

// A Stepper is an Engine with something to do to its lanes before every
// command of a file (from the second on): an engine's own test of a path
// the files do not reach, that must leave every output as it is.
type Stepper interface {
	Step(t testing.TB, lim *limiter.Limiter)
}

// Queue is a lane's waiting calls as an engine keeps them.
type Queue struct {
	Waiters []Waiter
	Service map[string]float64 // nil while no call has named a tenant
}

// Waiter is one waiting call.
type Waiter struct {
	Class   limiter.Priority
	Tenant  string    // limiter.DefaultTenant for a call that names none
	Arrival time.Time // logical arrival, to the millisecond at least
	Seq     uint64    // enqueue order in the lane
	Tokens  int64     // its estimate as the lane charges it (raised, if so), 0 for none
}

// RunDir runs every scenario file under dir against e.
func RunDir(t *testing.T, dir string, e Engine) {
	datadriven.Walk(t, dir, func(t *testing.T, path string) {
		t.Parallel()
		Run(t, path, e)
	})
}

// Run runs the scenario file at path against e. An expected line that
// begins with an engine's name and a colon ("shared: ...") is that
// engine's alone; a command whose output has such lines must say why
// (differs="..."), so that every divergence between the engines is
// written down where it shows.
func Run(t *testing.T, path string, e Engine) {
	r := &runner{t: t, e: e, clock: limitertest.NewClock(start), calls: map[string]*call{}}
	defer r.close()
	datadriven.RunTest(t, path, r.do)
}

type callState uint8

const (
	awaiting callState = iota
	holding
	released
	ended // without a slot
)

type call struct {
	id      string
	seq     int
	class   limiter.Priority
	tenant  string
	tokens  int64
	arrival time.Time
	due     time.Time // its queue timeout ends, if it waits
	cancel  context.CancelFunc
	done    chan struct{}
	slot    limiter.Slot
	granted time.Time // when it was granted, on the clock: its send time for limits
	err     error
	state   callState
	// reported is set once the output has said what became of the call
	// (queued, granted, ended).
	reported bool
}

type runner struct {
	t     *testing.T
	e     Engine
	clock *limitertest.Clock
	lim   *limiter.Limiter
	cfg   limiter.Config
	calls map[string]*call
	order []*call
	only  string // the engine the rest of the file is for, if one
}

func (r *runner) close() {
	for _, c := range r.order {
		c.cancel()
	}
	for _, c := range r.order {
		<-c.done
		if c.state == holding {
			c.slot.Release()
		}
	}
	if r.lim != nil {
		r.lim.Shutdown()
	}
}

func (r *runner) do(t *testing.T, td *datadriven.TestData) string {
	if r.only != "" && r.only != r.e.Name() {
		return td.Expected
	}
	if s, ok := r.e.(Stepper); ok && r.lim != nil {
		s.Step(t, r.lim)
	}
	var out strings.Builder
	switch td.Cmd {
	case "only":
		if len(td.CmdArgs) < 2 || !td.HasArg("why") {
			td.Fatalf(t, `want "only ENGINE why=..."`)
		}
		r.only = td.CmdArgs[0].Key
		return "ok\n"
	case "config", "reload":
		cfg := r.config(t, td)
		if td.Cmd == "config" {
			if r.lim != nil {
				td.Fatalf(t, "config twice: use reload")
			}
			lim, err := r.e.New(t, cfg, r.clock)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			r.lim = lim
		} else if err := r.lim.SetConfig(cfg); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		r.cfg = cfg
	case "acquire":
		r.acquire(t, td)
	case "advance":
		d, err := time.ParseDuration(td.CmdArgs[0].Key)
		if err != nil || d < 0 {
			td.Fatalf(t, "advance %s: want a duration", td.CmdArgs[0].Key)
		}
		r.advance(t, d)
	case "release":
		c := r.holder(t, td)
		c.slot.Release()
		c.state = released
	case "cancel":
		c := r.call(t, td)
		c.cancel()
		if c.state == awaiting {
			select { // its wait ends (or ended just before in a grant)
			case <-c.done:
			case <-time.After(30 * time.Second):
				td.Fatalf(t, "call %s: its wait does not end when canceled", c.id)
			}
		}
	case "settle":
		c := r.holder(t, td)
		var used int64
		td.ScanArgs(t, "used", &used)
		c.slot.Settle(limiter.Usage{Prompt: used})
	case "limits":
		r.limits(t, td)
	case "snapshot":
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}
	if r.lim == nil {
		td.Fatalf(t, "%s before config", td.Cmd)
	}
	r.settle(t)
	r.events(&out)
	r.state(t, &out)
	return r.compare(t, td, out.String())
}

// compare returns td.Expected if out is what this engine should print for
// it, and out otherwise (datadriven then shows the difference).
func (r *runner) compare(t *testing.T, td *datadriven.TestData, out string) string {
	var want []string
	marked := false
	for _, line := range strings.SplitAfter(td.Expected, "\n") {
		if line == "" {
			continue
		}
		name, rest, ok := strings.Cut(line, ": ")
		if ok && (name == "local" || name == "shared") {
			marked = true
			if name == r.e.Name() {
				want = append(want, rest)
			}
			continue
		}
		want = append(want, line)
	}
	if marked && !td.HasArg("differs") {
		td.Fatalf(t, `lines for one engine alone, and no differs="why"`)
	}
	if strings.Join(want, "") == out {
		return td.Expected
	}
	return out
}

func (r *runner) config(t *testing.T, td *datadriven.TestData) limiter.Config {
	cfg := limiter.DefaultConfig()
	if r.lim != nil {
		cfg = r.cfg
		f := *cfg.Fairness
		cfg.Fairness = &f
	}
	for _, a := range td.CmdArgs {
		val := func() int {
			n, err := strconv.Atoi(a.SingleVal(t))
			if err != nil {
				td.Fatalf(t, "%s: %v", a.Key, err)
			}
			return n
		}
		switch a.Key {
		case "limit":
			cfg.MaxInflight = val()
		case "reserve":
			cfg.InteractiveReserve = val()
		case "timeout":
			d, err := time.ParseDuration(a.SingleVal(t))
			if err != nil {
				td.Fatalf(t, "timeout: %v", err)
			}
			cfg.QueueTimeout = d
		case "tpm":
			cfg.TokensPerMinute = int64(val())
		case "max-inflight-tokens":
			cfg.MaxInflightTokens = int64(val())
		case "cap":
			cfg.Fairness.MaxInflightPerTenant = val()
		case "max-tenants":
			cfg.Fairness.MaxTenants = val()
		case "weights":
			cfg.Fairness.Weights = map[string]float64{}
			for _, v := range a.Vals {
				name, w, ok := strings.Cut(v, "=")
				f, err := strconv.ParseFloat(w, 64)
				if !ok || err != nil {
					td.Fatalf(t, "weights: %q: want NAME=WEIGHT", v)
				}
				cfg.Fairness.Weights[name] = f
			}
		case "cold-start":
			cfg.ColdStart = true
		case "deadline":
			p, ok := limiter.ParseDeadlinePolicy(a.SingleVal(t))
			if !ok {
				td.Fatalf(t, "deadline: want wait or answer_early")
			}
			cfg.Deadline = p
		case "margin":
			d, err := time.ParseDuration(a.SingleVal(t))
			if err != nil {
				td.Fatalf(t, "margin: %v", err)
			}
			cfg.DeadlineMargin = d
		default:
			td.Fatalf(t, "unknown setting %q", a.Key)
		}
	}
	return cfg
}

func (r *runner) acquire(t *testing.T, td *datadriven.TestData) {
	var id string
	td.ScanArgs(t, "id", &id)
	if r.calls[id] != nil {
		td.Fatalf(t, "call %s again", id)
	}
	now := r.clock.Now()
	c := &call{id: id, seq: len(r.order), class: limiter.Default, tenant: limiter.DefaultTenant, arrival: now,
		due: now.Add(r.cfg.QueueTimeout), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if td.HasArg("class") {
		var s string
		td.ScanArgs(t, "class", &s)
		p, err := limiter.ParsePriority(s)
		if err != nil {
			td.Fatalf(t, "%v", err)
		}
		c.class = p
	}
	ctx = limiter.WithPriority(ctx, c.class)
	if td.HasArg("tenant") {
		td.ScanArgs(t, "tenant", &c.tenant)
		ctx = limiter.WithTenant(ctx, c.tenant)
	}
	if td.HasArg("tokens") {
		td.ScanArgs(t, "tokens", &c.tokens)
		ctx = limiter.WithTokens(ctx, c.tokens)
	}
	if td.HasArg("deadline") {
		var s string
		td.ScanArgs(t, "deadline", &s)
		d, err := time.ParseDuration(s)
		if err != nil {
			td.Fatalf(t, "deadline=%s: want a duration from now", s)
		}
		ctx = limiter.WithDeadline(ctx, now.Add(d))
		margin := r.cfg.DeadlineMargin
		if margin == 0 {
			margin = limiter.DefaultDeadlineMargin
		}
		if end := now.Add(d - margin); end.Before(c.due) {
			c.due = end
		}
	}
	if td.HasArg("arrival") {
		var s string
		td.ScanArgs(t, "arrival", &s)
		if o := r.calls[s]; o != nil {
			c.arrival = o.arrival // a retry keeps its place
		} else if d, err := time.ParseDuration(s); err == nil && d <= 0 {
			c.arrival = c.arrival.Add(d)
		} else {
			td.Fatalf(t, "arrival=%s: want a call's id or a duration of 0 or less", s)
		}
		ctx = limiter.WithArrival(ctx, c.arrival)
	}
	r.calls[id] = c
	r.order = append(r.order, c)
	go func() {
		defer close(c.done)
		c.slot, c.err = r.lim.Acquire(ctx, Lane)
	}()
}

func (r *runner) call(t *testing.T, td *datadriven.TestData) *call {
	var id string
	td.ScanArgs(t, "id", &id)
	c := r.calls[id]
	if c == nil {
		td.Fatalf(t, "no call %s", id)
	}
	return c
}

func (r *runner) holder(t *testing.T, td *datadriven.TestData) *call {
	c := r.call(t, td)
	if c.state != holding {
		td.Fatalf(t, "call %s holds no slot", c.id)
	}
	return c
}

// advance moves the clock by d, stopping at every timer that falls due on
// the way so that each engine acts at the same instants.
func (r *runner) advance(t *testing.T, d time.Duration) {
	end := r.clock.Now().Add(d)
	for {
		next, ok := r.clock.NextDue()
		if !ok || next.After(end) {
			break
		}
		r.clock.Advance(max(0, next.Sub(r.clock.Now())))
		r.settle(t)
	}
	r.clock.Advance(end.Sub(r.clock.Now()))
}

func (r *runner) limits(t *testing.T, td *datadriven.TestData) {
	c := r.holder(t, td)
	pl := limiter.ProviderLimits{Slot: c.slot, At: c.granted} // sent at once, as lanehttp's Transport does
	for _, a := range td.CmdArgs {
		var b *limiter.ProviderBudget
		switch a.Key {
		case "id", "differs":
			continue
		case "concurrency": // a gateway's concurrency 429 (see ProviderLimits.Concurrency)
			pl.Concurrency = true
			continue
		case "refuse": // the headers are the provider's own (ProviderLimits.RefuseAbove)
			pl.RefuseAbove = true
			continue
		case "tokens":
			b = &pl.Tokens
		case "requests":
			b = &pl.Requests
		case "retry-after":
			d, err := time.ParseDuration(a.SingleVal(t))
			if err != nil {
				td.Fatalf(t, "retry-after: %v", err)
			}
			pl.RetryAfter = d
			continue
		default:
			td.Fatalf(t, "unknown key %q", a.Key)
		}
		f := strings.Split(a.SingleVal(t), "/")
		if len(f) != 3 {
			td.Fatalf(t, "%s: want LIMIT/REMAINING/RESET", a.Key)
		}
		limit, err1 := strconv.ParseInt(f[0], 10, 64)
		rem, err2 := strconv.ParseInt(f[1], 10, 64)
		reset, err3 := time.ParseDuration(f[2])
		if err := errors.Join(err1, err2, err3); err != nil {
			td.Fatalf(t, "%s: %v", a.Key, err)
		}
		*b = limiter.ProviderBudget{Known: true, Limit: limit, Remaining: rem, Reset: reset}
	}
	r.lim.RecordLimits(context.Background(), Lane, pl)
}

// settle waits until every call's wait has come to rest: the lane holds
// exactly the calls that returned with a slot, queues exactly those that
// have not returned, and none waits past its queue timeout. It waits on
// the engine, never on a duration: a slow machine only makes it wait
// longer.
func (r *runner) settle(t *testing.T) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, pending, late := 0, 0, 0
		for _, c := range r.order {
			if c.state == awaiting {
				select {
				case <-c.done:
					c.state = ended
					if c.err == nil {
						c.state, c.granted = holding, r.clock.Now()
					}
					c.reported = false
				default:
					pending++
					if !r.clock.Now().Before(c.due) {
						late++
					}
				}
			}
			if c.state == holding {
				held++
			}
		}
		s := r.lane()
		if s.Inflight == held && s.Queued == pending && late == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lane does not come to rest: %d in flight, %d queued; the scenario holds %d and waits on %d (%d past their timeout)",
				s.Inflight, s.Queued, held, pending, late)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *runner) lane() limiter.LaneSnapshot {
	for _, l := range r.lim.Snapshot().Lanes {
		if l.Lane == Lane {
			return l
		}
	}
	return limiter.LaneSnapshot{Lane: Lane}
}
