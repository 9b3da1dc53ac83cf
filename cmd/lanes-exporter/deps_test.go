package main

import (
	"os/exec"
	"strings"
	"testing"
)

// What the binary links: the default build has the demo (the simulator and
// its load) by design, for `make demo`; a production build (-tags nodemo)
// has none of it, nor any test helper.
func TestProductionBuildLinksNoSimulator(t *testing.T) {
	deps := func(tags ...string) string {
		t.Helper()
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		return string(out)
	}
	dev, prod := deps(), deps("-tags", "nodemo")
	for _, pkg := range []string{"github.com/llmlanes/llmlanes/internal/gatewaysim", "github.com/llmlanes/llmlanes/internal/demo"} {
		if !strings.Contains(dev, pkg+"\n") {
			t.Errorf("the default build lacks %s: --demo would not run", pkg)
		}
		if strings.Contains(prod, pkg+"\n") {
			t.Errorf("the production build links %s", pkg)
		}
	}
	for _, pkg := range []string{"testing\n", "limiter/limitertest\n", "net/http/httptest\n", "go.uber.org/goleak\n"} {
		if strings.Contains(prod, pkg) {
			t.Errorf("the production build links %s", strings.TrimSpace(pkg))
		}
	}
	// The tooling (the replay, the benchmarks and their report, test
	// helpers) lives under internal/tools, and neither build links any of it.
	for build, deps := range map[string]string{"default": dev, "production": prod} {
		for _, line := range strings.Split(deps, "\n") {
			if strings.HasPrefix(line, "github.com/llmlanes/llmlanes/internal/tools/") {
				t.Errorf("the %s build links %s", build, line)
			}
		}
	}
	if !strings.Contains(prod, "github.com/llmlanes/llmlanes/internal/exporter\n") {
		t.Fatalf("go list output does not look like the exporter's deps:\n%s", prod)
	}
}
