// Package obslint holds lint.sh, which runs Grafana's dashboard-linter and
// Cloudflare's pint on the generated dashboards and the alert rules (make
// test and CI run it), and this test of it.
package obslint

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
const root = "../../.."

// lint runs lint.sh from the repository's root on the directories given.
func lint(t *testing.T, args ...string) (string, error) {
	t.Helper()
	tools, _ := filepath.Abs(filepath.Join(root, "..", "shared", "tools"))
	cmd := exec.Command("sh", append([]string{"internal/tools/obslint/lint.sh"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "LINTERS_DIR="+tools, "REQUIRE_LINTERS=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The committed dashboards and rules pass both linters with no error and
// no warning; a dashboard made editable and an alert that always fires
// are rejected, each by its linter.
func TestLintersRejectWhatTheyShould(t *testing.T) {
	out, err := lint(t)
	if strings.Contains(out, "SKIPPED") {
		if os.Getenv("REQUIRE_LINTERS") == "1" {
			t.Fatalf("the linters are required (REQUIRE_LINTERS=1) and missing:\n%s", out)
		}
		t.Skip(strings.TrimSpace(out))
	}
	if err != nil || !strings.Contains(out, "4 dashboards (dashboard-linter --strict) and 2 rule files (pint): no error, no warning") {
		t.Fatalf("the committed dashboards and rules: %v\n%s", err, out)
	}

	dir := t.TempDir()
	dash, rules := filepath.Join(dir, "dashboards"), filepath.Join(dir, "alerts")
	os.MkdirAll(dash, 0o755)
	os.MkdirAll(rules, 0o755)
	b, err := os.ReadFile(filepath.Join(root, "dashboards/generated/llmlanes/llm-lane-detail.json"))
	if err != nil {
		t.Fatal(err)
	}
	editable := strings.Replace(string(b), `"editable": false`, `"editable": true`, 1)
	if editable == string(b) {
		t.Fatal("the detail dashboard has no \"editable\": false to break")
	}
	os.WriteFile(filepath.Join(dash, "broken.json"), []byte(editable), 0o644)
	os.WriteFile(filepath.Join(rules, "broken.rules.yml"), []byte(`groups:
  - name: broken
    rules:
      - alert: AlwaysFires
        expr: sum by (lane) (llmlanes_llm_inflight)
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.lane }} is busy"}
`), 0o644)
	out, err = lint(t, dash, rules)
	if err == nil {
		t.Fatalf("a broken dashboard and rule passed:\n%s", out)
	}
	for _, want := range []string{"is editable, it should be set to 'editable: false'", "always firing alert (alerts/comparison)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the linters' output lacks %q:\n%s", want, out)
		}
	}
}
