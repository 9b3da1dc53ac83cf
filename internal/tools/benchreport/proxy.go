package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
)

// proxyReport is what internal/tools/proxybench prints.
type proxyReport struct {
	Goals    []proxyGoal `json:"goals"`
	Markdown string      `json:"markdown"`
}

type proxyGoal struct {
	Text     string `json:"text"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// proxyVariant is the environment of the second lanes-exporter measured
// for latency and CPU: the Go scheduler on one CPU.
const proxyVariant = "GOMAXPROCS=1"

// runProxy builds lanes-exporter and internal/tools/proxybench, runs the
// measurement (a few minutes) and keeps its output in file.
func runProxy(file string, quick bool) (*proxyReport, error) {
	dir, err := os.MkdirTemp("", "benchreport")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for _, pkg := range []string{"./cmd/lanes-exporter", "./internal/tools/proxybench"} {
		cmd := exec.Command("go", "build", "-o", dir, pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build %s: %w", pkg, err)
		}
	}
	args := []string{"-lanes", filepath.Join(dir, "lanes-exporter"), "-variant", proxyVariant}
	if quick {
		args = append(args, "-quick")
	}
	cmd := exec.Command(filepath.Join(dir, "proxybench"), args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("proxybench: %w", err)
	}
	var px proxyReport
	if err := json.Unmarshal(out, &px); err != nil {
		return nil, fmt.Errorf("proxybench: %w", err)
	}
	return &px, os.WriteFile(file, out, 0o644)
}

// readProxy reads the figures a run kept; none if there are none.
func readProxy(file string) *proxyReport {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Printf("no proxy figures: %v", err)
		return nil
	}
	var px proxyReport
	if err := json.Unmarshal(b, &px); err != nil {
		log.Printf("proxy figures in %s: %v", file, err)
		return nil
	}
	return &px
}

const proxyIntro = `What an operator sees, measured by ` + "`internal/tools/proxybench`" + `: the gateway (a
small Go server answering four server-sent events at once), lanes-exporter, HAProxy
(Debian's, as the same lane: one server with ` + "`maxconn`" + ` the lane's limit, ` + "`timeout queue`" + `
300 s, ` + "`abortonclose`" + `, priority classes from X-LLM-Priority) and the load generator each
run in a process of their own on loopback, on this machine's 2 CPUs, in interleaved rounds.
*Added latency* is a proxy's p50 (p99) minus the gateway's own, measured direct in the same
round; *CPU per call* is the proxy process's user and system time over the calls (from
/proc); *RSS per queued call* is the growth of the proxy's resident memory with that many
calls queued, divided by their number, a fresh proxy each time. lanes-exporter runs on its
defaults but for the lane (Go's default GOMAXPROCS, all CPUs); the variant row runs it with
` + "`" + proxyVariant + "`" + `, HAProxy on its default of one thread per CPU.

`

// proxyNotes points to the profiles taken by hand.
const proxyNotes = `
Where the proxy's time and memory go, profiled by hand:
[notes/proxy-profile.md](notes/proxy-profile.md).
`
