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
		"alerts/protoagent.rules.yml": ForPrefix("protoagent"),
	}
}
