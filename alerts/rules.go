// Package alerts holds the Prometheus alert rules of llmlanes
// (llmlanes.rules.yml, the one hand-written source), their runbook and
// their promtool unit tests, and makes the copies that are generated from
// them: the rules for another metric prefix (protoagent.rules.yml) and the
// Kubernetes PrometheusRule (deploy/kubernetes). Regenerate them with
//
//	go run ./alerts/gen
package alerts

import (
	_ "embed"
	"regexp"
	"strings"
)

// Source is llmlanes.rules.yml.
//
//go:embed llmlanes.rules.yml
var Source []byte

// metricName matches the llmlanes metric prefix where a metric name starts.
var metricName = regexp.MustCompile(`\bllmlanes_`)

// ForPrefix returns the rules for metrics named with prefix instead of
// llmlanes (metrics.prefix in lanes-exporter's configuration).
func ForPrefix(prefix string) []byte {
	return metricName.ReplaceAll(Source, []byte(prefix+"_"))
}

// Generated returns the generated files, by path from the repository root.
func Generated() map[string][]byte {
	return map[string][]byte{
		"alerts/protoagent.rules.yml":           ForPrefix("protoagent"),
		"deploy/kubernetes/prometheusrule.yaml": PrometheusRule(),
	}
}

// PrometheusRule returns the rules as a prometheus-operator PrometheusRule:
// the source's groups, indented under spec.
func PrometheusRule() []byte {
	var b strings.Builder
	b.WriteString(`# Generated from alerts/llmlanes.rules.yml by go run ./alerts/gen; do not edit.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: lanes-exporter
  labels: {app.kubernetes.io/name: lanes-exporter}
spec:
`)
	for _, line := range strings.SplitAfter(string(Source), "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue // the source's header comment
		}
		if line != "\n" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}
