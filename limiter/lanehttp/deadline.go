package lanehttp

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers a client states its timeout in, first found first used:
// TimeoutHeader (ours; a proxy strips it before forwarding), then the
// official SDKs' own: the OpenAI and Anthropic Node and Go SDKs send
// X-Stainless-Timeout (the attempt's timeout, whole seconds; the Go SDKs
// only with a request timeout, openai-node only with one given per
// request), openai-python
// sends X-Stainless-Read-Timeout (its read timeout, which runs until the
// response's headers arrive, then between a stream's chunks).
const (
	TimeoutHeader              = "X-LLM-Timeout"
	StainlessTimeoutHeader     = "X-Stainless-Timeout"
	StainlessReadTimeoutHeader = "X-Stainless-Read-Timeout"
	maxStatedTimeout           = 24 * time.Hour
	minStatedTimeout           = time.Millisecond
	statedTimeoutMaxLen        = 32
)

// StatedTimeout returns the timeout h states for its call (see
// TimeoutHeader): the attempt's (StatedAttemptTimeout), else the read
// timeout (StatedReadTimeout); false when it states none. A value that is
// not a number of seconds above 0 and at most a day (negative, 0, NaN,
// huge, text) is ignored, never an error: the next header is looked at.
func StatedTimeout(h http.Header) (time.Duration, bool) {
	if d, ok := StatedAttemptTimeout(h); ok {
		return d, true
	}
	return StatedReadTimeout(h)
}

// StatedAttemptTimeout returns the timeout of the whole attempt h states:
// TimeoutHeader, else StainlessTimeoutHeader.
func StatedAttemptTimeout(h http.Header) (time.Duration, bool) {
	for _, name := range [...]string{TimeoutHeader, StainlessTimeoutHeader} {
		if d, ok := parseTimeout(h.Get(name)); ok {
			return d, true
		}
	}
	return 0, false
}

// StatedReadTimeout returns the read timeout h states
// (StainlessReadTimeoutHeader): the longest its client waits for the next
// bytes, the answer's headers first.
func StatedReadTimeout(h http.Header) (time.Duration, bool) {
	return parseTimeout(h.Get(StainlessReadTimeoutHeader))
}

func parseTimeout(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > statedTimeoutMaxLen {
		return 0, false
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(s) || s*float64(time.Second) < float64(minStatedTimeout) || s > maxStatedTimeout.Seconds() {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}
