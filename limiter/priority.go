package limiter

import (
	"fmt"
	"strconv"
	"strings"
)

// Priority is the class of a model call. Waiters are served by class first
// (Interactive, then Default, then Bulk) and by arrival within a class.
// The zero value is Default, so untagged work is default work.
type Priority int8

const (
	// Interactive is work an operator is watching: chat and console turns.
	// Only Interactive calls may take the lane's reserved slots.
	Interactive Priority = -1
	// Default is everything untagged: agent-to-agent, background and
	// scheduled turns, subagents.
	Default Priority = 0
	// Bulk is fan-out work: workflow steps, sweeps, review-panel finders.
	Bulk Priority = 1
)

// ParsePriority returns the class named s: "interactive", "default" or
// "bulk", in any case ("Interactive" too). Any other name gives an error
// that wraps ErrUnknownPriority and lists the valid names.
func ParsePriority(s string) (Priority, error) {
	switch {
	case strings.EqualFold(s, "interactive"):
		return Interactive, nil
	case strings.EqualFold(s, "default"):
		return Default, nil
	case strings.EqualFold(s, "bulk"):
		return Bulk, nil
	}
	return Default, fmt.Errorf("limiter: %w %q: want one of interactive, default, bulk", ErrUnknownPriority, s)
}

// String returns the class name as ParsePriority accepts it.
func (p Priority) String() string {
	switch p {
	case Interactive:
		return "interactive"
	case Default:
		return "default"
	case Bulk:
		return "bulk"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// MarshalText encodes p as its name.
func (p Priority) MarshalText() ([]byte, error) {
	if !p.valid() {
		return nil, fmt.Errorf("limiter: %w %d", ErrUnknownPriority, p)
	}
	return []byte(p.String()), nil
}

// UnmarshalText decodes a name accepted by ParsePriority.
func (p *Priority) UnmarshalText(b []byte) error {
	q, err := ParsePriority(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

func (p Priority) valid() bool { return p >= Interactive && p <= Bulk }

// Index maps the classes onto 0, 1 and 2, in serving order (Interactive
// first), for arrays indexed by class.
func (p Priority) Index() int { return int(p - Interactive) }
