package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// The committed JSON is what the generator makes now: regenerate with
// `go run ./dashboards/gen` after changing the code.
func TestGeneratedJSONIsCurrent(t *testing.T) {
	for _, p := range Prefixes {
		files, err := Files(p)
		if err != nil {
			t.Fatal(err)
		}
		if files[".lint"], err = LintConfig(p); err != nil {
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
			if strings.Contains(e, "gen_ai_client_") {
				// The GenAI conventions' metrics keep their own names.
				if strings.Contains(e, "protoagent_") || strings.Contains(e, "llmlanes_") || strings.Contains(e, "P_") {
					t.Errorf("%s: %s: a GenAI metric with a prefix", name, e)
				}
				continue
			}
			if !strings.Contains(e, "protoagent_") || !strings.Contains(e, "_llm_") || strings.Contains(e, "llmlanes_") || strings.Contains(e, "P_") {
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

// Every committed dashboard passes the Grafana Foundation SDK's own strict
// decoder (every required field set, no unknown field) and its validation
// (enums such as tooltip modes and orientations).
func TestDashboardsDecodeStrictly(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	uids := map[string]string{}
	for _, p := range Prefixes {
		for _, name := range []string{"llm-lanes-overview.json", "llm-lane-detail.json"} {
			b, err := os.ReadFile(filepath.Join("generated", p, name))
			if err != nil {
				t.Fatal(err)
			}
			var d dashboard.Dashboard
			if err := strict(d.UnmarshalJSONStrict(b)); err != nil {
				t.Errorf("%s/%s: strict decode: %v", p, name, err)
				continue
			}
			if err := d.Validate(); err != nil {
				t.Errorf("%s/%s: validation: %v", p, name, err)
			}
			// Distinct uids and titles: both prefixes can be imported side by side.
			if other, dup := uids[*d.Uid]; dup {
				t.Errorf("%s/%s has the uid of %s", p, name, other)
			}
			uids[*d.Uid] = p + "/" + name
			uids["title:"+deref(d.Title)] = p + "/" + name
			for _, panel := range d.Panels {
				pp := panel.Panel
				if pp == nil {
					continue
				}
				if pp.Description == nil || *pp.Description == "" {
					t.Errorf("%s/%s: panel %q has no description", p, name, deref(pp.Title))
				}
				if pp.FieldConfig == nil || pp.FieldConfig.Defaults.Unit == nil || *pp.FieldConfig.Defaults.Unit == "" {
					t.Errorf("%s/%s: panel %q has no unit", p, name, deref(pp.Title))
				}
			}
		}
	}
	if len(uids) != 4*2 {
		t.Fatalf("titles and uids are not all distinct: %v", uids)
	}
}

// Every query selects by job (several exporters, or other jobs exporting
// the same metric names, stay apart).
func TestQueriesSelectJob(t *testing.T) {
	for _, p := range Prefixes {
		files, _ := Files(p)
		for name, b := range files {
			exprs, _ := Exprs(b)
			for _, e := range exprs {
				if !strings.Contains(e, `job=~"$job"`) {
					t.Errorf("%s/%s: no job matcher in %s", p, name, e)
				}
			}
		}
	}
}

// strict returns err, or nil for the empty cog.BuildErrors that the SDK's
// strict decoder returns (as a non-nil error) when all is well.
func strict(err error) error {
	if be, ok := err.(cog.BuildErrors); ok && len(be) == 0 {
		return nil
	}
	return err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Panel options that the dashboard JSON schema types as enums hold one of
// their values: the SDK's decoder takes any string, Grafana's schema does
// not (an empty tooltip mode or orientation was how this broke before).
func TestOptionEnums(t *testing.T) {
	enums := map[string][]string{
		"tooltip.mode":       {string(common.TooltipDisplayModeSingle), string(common.TooltipDisplayModeMulti), string(common.TooltipDisplayModeNone)},
		"tooltip.sort":       {string(common.SortOrderAscending), string(common.SortOrderDescending), string(common.SortOrderNone)},
		"orientation":        {string(common.VizOrientationAuto), string(common.VizOrientationVertical), string(common.VizOrientationHorizontal)},
		"legend.displayMode": {string(common.LegendDisplayModeList), string(common.LegendDisplayModeTable), string(common.LegendDisplayModeHidden)},
		"legend.placement":   {string(common.LegendPlacementBottom), string(common.LegendPlacementRight)},
	}
	checked := 0
	var walk func(path string, v any, file string)
	walk = func(path string, v any, file string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(path+"."+k, c, file)
			}
		case []any:
			for _, c := range v {
				walk(path, c, file)
			}
		case string:
			for suffix, allowed := range enums {
				if strings.HasSuffix(path, ".options."+suffix) {
					checked++
					if !slices.Contains(allowed, v) {
						t.Errorf("%s: %s is %q, want one of %v", file, path, v, allowed)
					}
				}
			}
		}
	}
	for _, p := range Prefixes {
		for _, name := range []string{"llm-lanes-overview.json", "llm-lane-detail.json"} {
			b, _ := os.ReadFile(filepath.Join("generated", p, name))
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			walk("", v, p+"/"+name)
		}
	}
	if checked < 20 {
		t.Fatalf("only %d enum options checked", checked)
	}
}
