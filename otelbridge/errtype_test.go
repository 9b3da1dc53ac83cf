package otelbridge

import (
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
)

// error.type names a gateway's status only from a fixed set: a gateway
// that answers with made-up statuses (200 values on one lane) makes one
// "_OTHER" series, not 200.
func TestGenAIErrorTypeBounded(t *testing.T) {
	seen := map[string]bool{}
	for status := 400; status < 600; status++ {
		seen[genaiErrorType(limiter.Exchange{Outcome: limiter.OutcomeClientError, Status: status})] = true
	}
	if len(seen) > len(errorStatuses)+1 || !seen["_OTHER"] || !seen["429"] || !seen["503"] {
		t.Fatalf("%d error.type values for the 200 statuses 400-599: %v", len(seen), seen)
	}
	if got := genaiErrorType(limiter.Exchange{Outcome: limiter.OutcomeServerError, Status: 599}); got != "_OTHER" {
		t.Fatalf("599: %q, want _OTHER", got)
	}
}
