package dashboards

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The committed JSON is what the generator makes now: regenerate with
// `go run ./dashboards/gen` after changing the code.
func TestGeneratedJSONIsCurrent(t *testing.T) {
	for _, p := range Prefixes {
		files, err := Files(p)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join("generated", p, name))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("generated/%s/%s is stale (%v): run go run ./dashboards/gen", p, name, err)
			}
		}
	}
}

func TestPrefixReachesEveryQuery(t *testing.T) {
	files, _ := Files("protoagent")
	for name, b := range files {
		exprs, err := Exprs(b)
		if err != nil || len(exprs) < 6 {
			t.Fatalf("%s: %d exprs, %v", name, len(exprs), err)
		}
		for _, e := range exprs {
			if !strings.Contains(e, "protoagent_llm_") || strings.Contains(e, "llmlanes_") || strings.Contains(e, "P_") {
				t.Errorf("%s: %s", name, e)
			}
		}
	}
}

// Every expression parses: promtool checks them as recording rules.
func TestQueriesParse(t *testing.T) {
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboards\n    rules:\n")
	n := 0
	for _, p := range Prefixes {
		files, _ := Files(p)
		for _, b := range files {
			exprs, _ := Exprs(b)
			for _, e := range exprs {
				n++
				fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %q\n", n, Substitute(e))
			}
		}
	}
	file := filepath.Join(t.TempDir(), "queries.yml")
	os.WriteFile(file, []byte(rules.String()), 0o644)
	out, err := exec.Command("promtool", "check", "rules", file).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("SUCCESS: %d rules found", n)) {
		t.Fatalf("promtool: %v\n%s", err, out)
	}
}
