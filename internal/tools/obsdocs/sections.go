package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/llmlanes/llmlanes/dashboards"
	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/telemetry"
)

// Sections returns every generated table, by name, reading the files it
// needs under the repository's top directory root.
func Sections(root string) (map[string]string, error) {
	alerts, err := alertTable(filepath.Join(root, "alerts", "llmlanes.rules.yml"))
	if err != nil {
		return nil, err
	}
	panels, err := panelTable()
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"metrics":        metricTable("{p}", append(otelbridge.Defs(), telemetry.Defs()...)),
		"genai-metrics":  metricTable("", otelbridge.GenAIDefs()),
		"target-metrics": metricTable("{p}", append(exporter.TargetDefs(), exporter.ProcessDefs()...)),
		"codes":          codeTable(),
		"alerts":         alerts,
		"panels":         panels,
	}, nil
}

var kinds = map[otelbridge.Kind]string{otelbridge.Counter: "counter", otelbridge.Gauge: "gauge", otelbridge.Histogram: "histogram"}

func metricTable(prefix string, defs []otelbridge.Def) string {
	var b strings.Builder
	b.WriteString("| series | type | labels | meaning |\n| --- | --- | --- | --- |\n")
	for _, d := range defs {
		labels := make([]string, len(d.Labels))
		for i, l := range d.Labels {
			labels[i] = "`" + strings.ReplaceAll(l, ".", "_") + "`"
		}
		meaning := cell(d.Description)
		if d.Only != "" {
			meaning += " *Only on " + d.Only + ".*"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.PromName(prefix), kinds[d.Kind], strings.Join(labels, ", "), meaning)
	}
	return b.String()
}

func codeTable() string {
	var b strings.Builder
	b.WriteString("| code | status | `x-should-retry` | table | when |\n| --- | --- | --- | --- | --- |\n")
	row := func(c lanehttp.Code, by string) {
		retry := "—"
		if c.NoRetry {
			retry = "`false`"
		}
		fmt.Fprintf(&b, "| `%s` | %d %s | %s | %s | %s |\n", c.Name, c.Status, http.StatusText(c.Status), retry, by, cell(c.When))
	}
	for _, c := range lanehttp.Codes() {
		row(c, "`lanehttp`")
	}
	for _, c := range exporter.Codes() {
		row(c, "lanes-exporter's")
	}
	return b.String()
}

func alertTable(path string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(src, &rules); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	var b strings.Builder
	b.WriteString("| alert | severity | for | summary |\n| --- | --- | --- | --- |\n")
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Alert, r.Labels["severity"], r.For, cell(r.Annotations["summary"]))
		}
	}
	return b.String(), nil
}

func panelTable() (string, error) {
	files, err := dashboards.Files("llmlanes")
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("| dashboard | panel | type | what it shows |\n| --- | --- | --- | --- |\n")
	for _, n := range names {
		var d struct {
			Title  string `json:"title"`
			Panels []struct {
				Type        string `json:"type"`
				Title       string `json:"title"`
				Description string `json:"description"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(files[n], &d); err != nil {
			return "", fmt.Errorf("%s: %w", n, err)
		}
		for _, p := range d.Panels {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(d.Title), cell(p.Title), p.Type, cell(p.Description))
		}
	}
	return b.String(), nil
}

// cell makes s fit a Markdown table cell: one line, no bare pipe.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// Splice returns doc with each generated table replaced by sections'
// (every marker must have its table, and every table its marker).
func Splice(doc string, sections map[string]string) (string, error) {
	seen := map[string]bool{}
	var out strings.Builder
	rest := doc
	for {
		i := strings.Index(rest, "<!-- generated: ")
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], " -->")
		if j < 0 {
			return "", fmt.Errorf("an unclosed marker at %q", rest[i:min(len(rest), i+40)])
		}
		head := rest[i : i+j+4]
		name, _, _ := strings.Cut(strings.TrimPrefix(head, "<!-- generated: "), " ")
		body, ok := sections[name]
		if !ok {
			return "", fmt.Errorf("no table named %q", name)
		}
		end := "<!-- end generated: " + name + " -->"
		k := strings.Index(rest[i:], end)
		if k < 0 {
			return "", fmt.Errorf("table %q has no %s", name, end)
		}
		out.WriteString(rest[:i])
		out.WriteString(head + "\n" + body + end)
		rest = rest[i+k+len(end):]
		seen[name] = true
	}
	out.WriteString(rest)
	for name := range sections {
		if !seen[name] {
			return "", fmt.Errorf("%s has no marker for table %q", file, name)
		}
	}
	return out.String(), nil
}
