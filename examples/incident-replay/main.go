// Command incident-replay replays the #209 incident of ADR-0115 against the
// gateway simulator, without a limiter, with lanes, and with a gateway-side
// 429 limit, and writes docs/INCIDENT-REPLAY.md and its chart:
//
//	go run ./examples/incident-replay            # scale 0.01: 120 s -> 1.2 s, about 30 s in all
//	go run ./examples/incident-replay -scale 0.05 -duration 20m
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/llmlanes/llmlanes/internal/replay"
)

func main() {
	scale := flag.Float64("scale", 0.01, "real seconds per simulated second")
	duration := flag.Duration("duration", 10*time.Minute, "simulated time during which calls arrive")
	doc := flag.String("doc", "docs/INCIDENT-REPLAY.md", "report to write (empty: none)")
	flag.Parse()
	o := replay.Incident(*scale)
	o.Duration = *duration
	var rs []replay.Report
	for _, s := range replay.Scenarios {
		fmt.Fprintf(os.Stderr, "replaying %s...\n", s)
		r, err := replay.Run(context.Background(), s, o)
		if err != nil {
			log.Fatal(err)
		}
		rs = append(rs, r)
	}
	var table bytes.Buffer
	replay.Table(&table, rs)
	fmt.Print(table.String())
	if *doc == "" {
		return
	}
	svg := filepath.Join(filepath.Dir(*doc), "incident-replay.svg")
	var chart bytes.Buffer
	replay.SVG(&chart, rs, o.Capacity, o.Limit)
	if err := os.WriteFile(svg, chart.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, intro, o.Capacity, o.Tokens, o.TokenTime, o.Panels, o.PanelSize, o.PanelEvery, o.CoderEvery, o.ChatEvery,
		o.Duration, o.RequestTimeout, o.Retries, o.Limit, *scale)
	md.Write(table.Bytes())
	fmt.Fprint(&md, outro)
	if err := os.WriteFile(*doc, md.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(os.Stderr, "wrote", *doc, "and", svg)
}

const intro = `# Incident replay: lanes turn a retry storm into a visible queue

Produced by ` + "`go run ./examples/incident-replay`" + ` (numbers vary a little between runs).

The #209 incident of ADR-0115, replayed against the gateway simulator on loopback: a
gateway of capacity %d (past it every call slows in proportion: processor sharing) whose
answers are %d tokens of %s when idle; %d review panels of %d bulk finder calls, %s apart;
coder calls from two boards (one every %s); an operator who sends a chat turn %s after
each reply; calls arriving for %s. The gateway keeps working on requests whose clients
gave up (it does not propagate disconnects) and counts that work as wasted.

- **no-limiter**: clients as the SDKs behave: a %s request timeout, %d retries with backoff.
- **lanes**: the same clients through a lane of %d (below the gateway's capacity) with one
  slot reserved for interactive calls; the timeouts start once the slot is held.
- **gateway-429**: the gateway answers 429 at once above the same limit (LiteLLM-style);
  the clients retry as the SDKs do.

Time is scaled (%.3g real seconds per simulated second); figures are simulated time.

`

const outro = `
![gateway concurrency and chat time to first token over time, per scenario](incident-replay.svg)

**Reading it.** Without a limiter the gateway is pushed far past its capacity, every call
slows, calls time out and are sent again while the gateway still works on the abandoned
ones: the storm, with wasted work, and most panels and chats never complete. With lanes
the gateway never sees more than the lane's limit, nothing times out or is retried,
nothing is wasted, every panel finishes, and the operator's chat keeps its idle-gateway
time to first token because it takes the reserved slot while the panels wait in the queue,
visible in the metrics. A gateway-side 429 limit also protects the gateway, but turns
the excess into rejections that the SDKs retry and then give up on: calls and panels
are lost instead of queued.

Reproduce: ` + "`go run ./examples/incident-replay`" + ` (flags: ` + "`-scale`" + `, ` + "`-duration`" + `). A short replay
runs in ` + "`make test`" + ` (` + "`internal/replay`" + `), asserting the qualitative results.
`
