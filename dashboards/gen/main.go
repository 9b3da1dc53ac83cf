// Command gen writes the llmlanes Grafana dashboards as JSON, one folder
// per metric prefix, under dashboards/generated:
//
//	go run ./dashboards/gen
package main

import (
	"log"
	"os"
	"path/filepath"

	"github.com/llmlanes/llmlanes/dashboards"
)

func main() {
	for _, p := range dashboards.Prefixes {
		files, err := dashboards.Files(p)
		if err != nil {
			log.Fatal(err)
		}
		dir := filepath.Join("dashboards", "generated", p)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatal(err)
		}
		lint, err := dashboards.LintConfig(p)
		if err != nil {
			log.Fatal(err)
		}
		files[".lint"] = lint
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				log.Fatal(err)
			}
		}
	}
}
