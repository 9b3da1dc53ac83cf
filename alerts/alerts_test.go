// Package alerts holds the Prometheus rule file, its runbook and its unit
// tests; this test runs promtool over them.
package alerts

import (
	"os/exec"
	"testing"
)

// promtool comes from Debian's prometheus package; `make test` installs it.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("promtool", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
}

func TestRulesCheck(t *testing.T) { promtool(t, "check", "rules", "llmlanes.rules.yml") }

func TestRulesUnitTests(t *testing.T) { promtool(t, "test", "rules", "tests.yml") }
