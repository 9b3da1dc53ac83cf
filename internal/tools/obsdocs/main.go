// Command obsdocs writes the generated tables of docs/OBSERVABILITY.md
// from their declarations: the metrics (otelbridge.Defs, telemetry.Defs,
// otelbridge.GenAIDefs and lanes-exporter's TargetDefs), the error codes
// (lanehttp.Codes and lanes-exporter's Codes), the alerts
// (alerts/llmlanes.rules.yml) and the dashboards' panels (package
// dashboards). Each table sits between two marker comments,
//
//	<!-- generated: NAME (go run ./internal/tools/obsdocs) -->
//	<!-- end generated: NAME -->
//
// and the prose around them is the file's own. Run from the repository's
// top directory; its test fails when the file is stale.
package main

import (
	"fmt"
	"log"
	"os"
)

const file = "docs/OBSERVABILITY.md"

func main() {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	sections, err := Sections(".")
	if err != nil {
		log.Fatal(err)
	}
	out, err := Splice(string(b), sections)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", file)
}
