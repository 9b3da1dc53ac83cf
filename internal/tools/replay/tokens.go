package replay

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// chatBody is a chat completion request of n bytes of prompt text asking
// for at most maxTokens: what the lane estimates and the gateway counts.
func chatBody(n, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":"protolabs/smart","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}`,
		strings.Repeat("word ", n/5+1)[:n], maxTokens)
}

// TokenFigures are a run's figures against the gateway's tokens-per-minute
// limit.
type TokenFigures struct {
	Limit int64 // the gateway's tokens per minute
	// From and To bound the window the use is measured in; Queued is
	// whether calls waited in the lane at every sample in it.
	From, To time.Duration
	Queued   bool
	// Used is what the limit gave out in the window (reserved, less what
	// came back); Share, Used over Limit times the window in minutes.
	Used  int64
	Share float64
	// Attempts and RateLimited are the requests the gateway received and
	// answered 429; Blind, the 429s before the first answer's headers (a
	// lane that follows them knows nothing before that).
	Attempts, RateLimited, Blind int64
	FirstAnswer                  time.Duration
}

// tokenWindowFrom is where the window of TokenFigures starts: after the
// first minute, in which the gateway's bucket still holds the minute's
// worth it started with.
const tokenWindowFrom = 2 * time.Minute

func (s *sim) tokenFigures() *TokenFigures {
	f := &TokenFigures{Limit: s.o.TokensPerMinute, From: tokenWindowFrom, To: s.o.Duration, Queued: true,
		Attempts: s.gw.st.Received, RateLimited: s.gw.st.RateLimited}
	for _, smp := range s.r.Samples {
		if smp.At >= f.From && smp.At < f.To && smp.Queued == (limiter.QueuedByPriority{}) {
			f.Queued = false
		}
	}
	f.FirstAnswer = s.gw.firstAnswer
	for _, at := range s.gw.limited {
		if s.gw.firstAnswer == 0 || at < s.gw.firstAnswer {
			f.Blind++
		}
	}
	f.Used = s.gw.tokensUsed(f.From, f.To)
	f.Share = float64(f.Used) / (float64(f.Limit) * (f.To - f.From).Minutes())
	return f
}

// TokenRuns is the tokens-per-minute replay: lanes sized in calls only,
// lanes with tokens_per_minute set to the gateway's limit, lanes with no
// budget that follow the gateway's rate-limit headers, and the same with
// cold_start on (they send one call until the first answer's headers).
type TokenRuns struct {
	Calls, Budget, Headers, ColdStart Report
}

// RunTokens runs the four, with o (TokenLimit() for the report).
func RunTokens(o Options) (TokenRuns, error) {
	var t TokenRuns
	for _, r := range []struct {
		dst        *Report
		mode, name string
	}{
		{&t.Calls, TokensCalls, "lanes sized in calls"},
		{&t.Budget, TokensBudget, "tokens_per_minute at the limit"},
		{&t.Headers, TokensHeaders, "following the headers, no budget"},
		{&t.ColdStart, TokensColdStart, "following the headers, no budget, cold_start"},
	} {
		o.TokenMode = r.mode
		rep, err := Run("tokens", o)
		if err != nil {
			return t, err
		}
		rep.Scenario = r.name
		*r.dst = rep
	}
	return t, nil
}

func share429(r Report) float64 {
	if r.Tokens == nil || r.Tokens.Attempts == 0 {
		return 0
	}
	return float64(r.Tokens.RateLimited) / float64(r.Tokens.Attempts)
}

// Goals checks the goals: with a budget, no 429 and at least 95%
// of the limit used while work is queued; following the headers only, at
// most 1% of the requests answered 429 and at least 90% used. The headers'
// goals are held by the lanes with cold_start on: without it the lanes
// send their first calls blind (the report has both).
func (t TokenRuns) Goals() []Goal {
	b, h := t.Budget.Tokens, t.ColdStart.Tokens
	if b == nil || h == nil {
		return nil
	}
	return []Goal{
		{Text: "tokens_per_minute at the limit: no 429", Figure: fmt.Sprintf("%d 429s", b.RateLimited), Met: b.RateLimited == 0},
		{Text: "tokens_per_minute at the limit: at least 95% of the limit used while work is queued",
			Figure: fmt.Sprintf("%.1f%%", 100*b.Share), Met: b.Queued && b.Share >= 0.95},
		{Text: "following the headers, no budget, cold_start: at most 1% of the requests answered 429",
			Figure: fmt.Sprintf("%.2f%% (%d of %d)", 100*share429(t.ColdStart), h.RateLimited, h.Attempts), Met: share429(t.ColdStart) <= 0.01},
		{Text: "following the headers, no budget, cold_start: at least 90% of the limit used while work is queued",
			Figure: fmt.Sprintf("%.1f%%", 100*h.Share), Met: h.Queued && h.Share >= 0.90},
	}
}

// Markdown writes the tokens section's table and goals.
func (t TokenRuns) Markdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	rs := []Report{t.Calls, t.Budget, t.Headers, t.ColdStart}
	row := sideBySide(w, rs)
	tk := func(f func(*TokenFigures) string) func(Report) string {
		return func(r Report) string { return f(r.Tokens) }
	}
	row("requests the gateway received / answered 429", func(r Report) string {
		return fmt.Sprintf("%d / %d (%.2f%%)", r.Tokens.Attempts, r.Tokens.RateLimited, 100*share429(r))
	})
	row("of them before the first answer's headers", func(r Report) string {
		return fmt.Sprintf("%d (first answer at %s)", r.Tokens.Blind, r.Tokens.FirstAnswer.Round(time.Millisecond))
	})
	row("tokens used from minute 2 to 10, of the limit", tk(func(f *TokenFigures) string {
		return fmt.Sprintf("%d (%.1f%%)", f.Used, 100*f.Share)
	}))
	row("calls queued in the lane at every sample from minute 2 to 10", tk(func(f *TokenFigures) string {
		if f.Queued {
			return "yes"
		}
		return "no"
	}))
	for _, c := range Classes {
		row(c+": calls / completed", func(r Report) string {
			return fmt.Sprintf("%d / %d", r.Classes[c].Calls, r.Classes[c].Completed)
		})
		row(c+": failed, by reason", func(r Report) string { return reasons(r.Classes[c].Failed) })
		row(c+": queue wait p50 / p99", func(r Report) string {
			return secs(r.Classes[c].WaitP50) + " / " + secs(r.Classes[c].WaitP99)
		})
	}
	row("retries the clients sent", func(r Report) string { return fmt.Sprint(r.Retries) })
	p("\nThe goals (`internal/tools/replay`'s TestTokenLimit holds them, and checks that the report is the same from run to run):\n\n")
	goalList(w, t.Goals())
}
