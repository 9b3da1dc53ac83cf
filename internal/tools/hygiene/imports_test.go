package hygiene

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules holds the library's packages to the "may import" column
// of docs/DESIGN.md's layout table: a package's non-test code imports the
// standard library and what its row allows, nothing more.
func TestImportRules(t *testing.T) {
	const mod = "github.com/llmlanes/llmlanes/"
	otel := "go.opentelemetry.io/otel"
	rules := map[string][]string{ // package -> the import path prefixes it may use beyond the standard library
		"limiter":                 {mod + "limiter/"},
		"limiter/adaptive":        nil,
		"limiter/internal/stats":  nil,
		"limiter/internal/budget": nil,
		"limiter/limitertest":     {mod + "limiter"},
		"limiter/lanehttp":        {mod + "limiter", mod + "internal/redact"},
		"sharedlane":              {mod + "limiter", mod + "internal/redact", "github.com/redis/go-redis/"},
		"classify":                {mod + "limiter"},
		"otelbridge":              {mod + "limiter", mod + "internal/redact", otel},
		"internal/history":        {mod + "classify"},
		"internal/version":        nil,
		"internal/redact":         nil,
		"internal/gatewaysim":     nil,
		"internal/demo":           {mod + "internal/exporter", mod + "internal/gatewaysim"},
		"alerts":                  nil,
		"dashboards":              {"github.com/grafana/grafana-foundation-sdk/"},
		"internal/otelsetup":      {otel, "go.opentelemetry.io/contrib/"},
	}
	root := root(t)
	for pkg, allowed := range rules {
		cmd := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "./"+pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list ./%s: %v", pkg, err)
		}
		for _, imp := range strings.Fields(string(out)) {
			first, _, _ := strings.Cut(imp, "/")
			if !strings.Contains(first, ".") {
				continue // the standard library
			}
			ok := false
			for _, a := range allowed {
				ok = ok || strings.HasPrefix(imp, a)
			}
			if !ok {
				t.Errorf("%s imports %s, which docs/DESIGN.md's layout does not allow it", pkg, imp)
			}
		}
	}
}

// TestPackageComments holds every package to a package comment that says
// its one job (docs/DESIGN.md, "Layout"): go doc shows it.
func TestPackageComments(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}	{{.Doc}}`, "./...")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, doc, _ := strings.Cut(line, "\t")
		if strings.TrimSpace(doc) == "" {
			t.Errorf("%s has no package comment", pkg)
		}
	}
}
