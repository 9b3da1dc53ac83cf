// Command gen writes the rule files generated from alerts/llmlanes.rules.yml:
// the protoagent copy, and the Kubernetes PrometheusRule.
//
//	go run ./alerts/gen
package main

import (
	"log"
	"os"

	"github.com/llmlanes/llmlanes/alerts"
)

func main() {
	for file, b := range alerts.Generated() {
		if err := os.WriteFile(file, b, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
