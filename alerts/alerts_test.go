package alerts

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// promtool comes from Debian's prometheus package; `make test` installs it.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("promtool", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
}

func TestRulesCheck(t *testing.T) {
	promtool(t, "check", "rules", "llmlanes.rules.yml")
	promtool(t, "check", "rules", "protoagent.rules.yml")
}

func TestRulesUnitTests(t *testing.T) { promtool(t, "test", "rules", "tests.yml") }

// The generated files are what the source makes now: regenerate with
// `go run ./alerts/gen` after changing llmlanes.rules.yml.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	for path, want := range Generated() {
		got, err := os.ReadFile(filepath.Join("..", path))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale (%v): run go run ./alerts/gen", path, err)
		}
	}
	p := string(ForPrefix("protoagent"))
	if strings.Contains(p, "llmlanes_") || !strings.Contains(p, "protoagent_llm_lane_state") || !strings.Contains(p, "alert: LLMLanesGatewayDegraded") {
		t.Fatal("the protoagent rules are not the source with the prefix substituted")
	}
}

// What pint checks that matters here (pint itself is not installable on
// this project's machines: see the README), checked on every rule: each
// aggregation keeps job, a rule on up{} also fires when the job is absent,
// and every alert has a for, a severity and its three annotations.
func TestRulesKeepJobAndAnnotations(t *testing.T) {
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(Source, &file); err != nil {
		t.Fatal(err)
	}
	aggr := regexp.MustCompile(`\b(sum|max|min|avg|count|topk|bottomk|quantile|stddev|stdvar|group)\s*(by|without)?\s*(\([^)]*\))?\s*\(`)
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			n++
			for _, m := range aggr.FindAllStringSubmatch(r.Expr, -1) {
				if m[2] != "by" || !regexp.MustCompile(`\bjob\b`).MatchString(m[3]) {
					t.Errorf("%s: %q does not keep job", r.Alert, strings.TrimSpace(m[0]))
				}
			}
			if strings.Contains(r.Expr, "up{") && !strings.Contains(r.Expr, "absent(") {
				t.Errorf("%s: a rule on up{} needs absent() too", r.Alert)
			}
			if r.For == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" ||
				r.Annotations["description"] == "" || !strings.Contains(r.Annotations["runbook_url"], "runbook.md#"+strings.ToLower(r.Alert)) {
				t.Errorf("%s: for %q, labels %v, annotations %v", r.Alert, r.For, r.Labels, r.Annotations)
			}
		}
	}
	if n != 10 {
		t.Fatalf("%d rules, want 10", n)
	}
}
