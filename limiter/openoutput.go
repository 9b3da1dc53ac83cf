package limiter

import (
	"math"
	"slices"
)

// A call that names no output bound (no max_tokens, max_completion_tokens
// or max_output_tokens) may write anything; a fixed guess for it (package
// lanehttp's 1,024 tokens) lets a lane of such calls, answered at length,
// run past its budget by whatever the answers run past the guess. So a
// lane learns what such calls write: it estimates one at its prompt plus
// a high percentile (openPercentile) of the completions of its last
// openSamples such calls, once it has seen openMinSamples, and at the
// caller's fallback until then. A learned bound is at most the lane's
// smallest budget less the prompt, unless the fallback is more: learning
// never makes a call too large to be granted. A shared lane learns in each
// process, from that process's calls.
const (
	openSamples    = 64
	openMinSamples = 8
	openPercentile = 0.9
)

func addSat(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// outputs is what a lane's calls with no output bound wrote lately: the
// last openSamples completions, in a ring and sorted.
type outputs struct {
	ring   [openSamples]int64
	sorted []int64
	next   int
}

// add counts a completion of n tokens.
func (o *outputs) add(n int64) {
	n = max(n, 0)
	if len(o.sorted) == openSamples {
		old := o.ring[o.next]
		i, _ := slices.BinarySearch(o.sorted, old)
		o.sorted = slices.Delete(o.sorted, i, i+1)
	}
	o.ring[o.next] = n
	o.next = (o.next + 1) % openSamples
	i, _ := slices.BinarySearch(o.sorted, n)
	o.sorted = slices.Insert(o.sorted, i, n)
}

// bound returns the learned output bound, and whether there is one.
func (o *outputs) bound() (int64, bool) {
	if o == nil || len(o.sorted) < openMinSamples {
		return 0, false
	}
	return o.sorted[int(math.Ceil(openPercentile*float64(len(o.sorted))))-1], true
}

// estimateLocked returns the estimate of a call whose context's estimate
// is v (call.tokens: see WithTokens, WithOpenOutput), and whether it names
// no output bound.
func (l *lane) estimateLocked(cfg *Config, v any) (int64, bool) {
	if n, ok := v.(int64); ok || v == nil {
		return max(n, 0), false // small enough to inline: most calls
	}
	return l.openEstimateLocked(cfg, v)
}

// openEstimateLocked is estimateLocked for a value that is not a plain
// estimate.
func (l *lane) openEstimateLocked(cfg *Config, v any) (int64, bool) {
	n, o := estimateOf(v)
	if o == nil {
		return n, false
	}
	out := o.fallback
	var learnt *outputs // none before the lane's token accounting is made
	if l.tok != nil {
		learnt = l.tok.outputs
	}
	if learned, ok := learnt.bound(); ok {
		out = learned
		if ceiling := l.smallestBudgetLocked(cfg); ceiling > 0 {
			out = min(out, max(ceiling-o.prompt, o.fallback))
		}
	}
	return addSat(o.prompt, out), true
}
