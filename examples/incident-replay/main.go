// Command incident-replay replays the #209 incident of ADR-0115 and the
// risks the ADR names (two processes on one gateway, a gateway that
// degrades) in virtual time, and writes the report, INCIDENT-REPLAY.md,
// with a timeline picture per scenario, and the adaptive limit's report,
// ADAPTIVE.md, with a chart of the limit per adaptive run:
//
//	go run ./examples/incident-replay                 # into a new temporary directory
//	go run ./examples/incident-replay -out docs -http # what make replay runs
//
// The simulated runs are exact: the same inputs give the same report. With
// -http the incident is also replayed over real HTTP on loopback, scaled in
// time by -scale; those figures vary a little from run to run, and the
// report says whether the machine kept up.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/llmlanes/llmlanes/internal/tools/replay"
)

func main() {
	out := flag.String("out", "", "directory to write the report to (default: a new temporary directory)")
	withHTTP := flag.Bool("http", false, "also replay the incident over real HTTP on loopback, and two processes sharing a lane in Redis (needs redis-server)")
	scale := flag.Float64("scale", 0.01, "with -http: real seconds per simulated second")
	flag.Parse()
	ctx := context.Background()
	b, err := replay.RunAll(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if *withHTTP {
		fmt.Fprintf(os.Stderr, "replaying over HTTP at scale %g (about %.0f s)...\n", *scale, 3*17*60**scale)
		if err := b.RunHTTPAll(ctx, *scale); err != nil {
			log.Fatal(err)
		}
		fmt.Fprintln(os.Stderr, "replaying callers in front of a LiteLLM-like gateway, through the proxy...")
		if err := b.RunLiteLLMAll(ctx, *scale); err != nil {
			log.Fatal(err)
		}
		fmt.Fprintln(os.Stderr, "replaying callers whose timeout is shorter than the wait, through the proxy...")
		if err := b.RunDeadlinesAll(ctx, *scale); err != nil {
			log.Fatal(err)
		}
		fmt.Fprintln(os.Stderr, "replaying two processes sharing a lane in Redis...")
		if err := b.RunSharedRedis(ctx, *scale); err != nil {
			log.Fatal(err)
		}
	}
	replay.Table(os.Stdout, b.Incident)
	dir := *out
	if dir == "" {
		if dir, err = os.MkdirTemp("", "incident-replay-"); err != nil {
			log.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	ab, err := replay.RunAdaptive()
	if err != nil {
		log.Fatal(err)
	}
	files := b.Files()
	maps.Copy(files, ab.Files())
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Fprintln(os.Stderr, "wrote", filepath.Join(dir, "INCIDENT-REPLAY.md"), "and", filepath.Join(dir, "ADAPTIVE.md"), "with their charts")
}
