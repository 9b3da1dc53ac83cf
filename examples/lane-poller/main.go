// Command lane-poller polls lanes-exporter's classification the way a
// review bot (pr-reviewer) does, and prints each lane's state and hold text
// every few seconds: enough to tell "the gate is throttling on purpose"
// (local_queue) from "the gateway is dead" (gateway_degraded).
//
//	go run ./examples/lane-poller -exporter http://127.0.0.1:4470 -upstream sim -model protolabs/smart
//	go run ./examples/lane-poller -exporter http://127.0.0.1:4470            # every lane
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lane-poller:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("lane-poller", flag.ContinueOnError)
	exporter := fs.String("exporter", "http://127.0.0.1:4470", "lanes-exporter's address")
	upstream := fs.String("upstream", "", "the configured upstream's name (with -model: one lane)")
	model := fs.String("model", "", "the model (with -upstream: one lane)")
	every := fs.Duration("every", 5*time.Second, "how often to poll")
	count := fs.Int("count", 0, "stop after this many polls (0: until interrupted)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*upstream == "") != (*model == "") {
		return errors.New("give both -upstream and -model, or neither for every lane")
	}
	c := &classify.Client{BaseURL: *exporter}
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for n := 1; ; n++ {
		var lanes []classify.Classification
		var err error
		if *upstream != "" {
			var one *classify.Classification
			if one, err = c.Model(ctx, *upstream, *model); err == nil {
				lanes = append(lanes, *one)
			}
		} else {
			var rep *classify.Report
			if rep, err = c.Report(ctx); err == nil {
				lanes = rep.Lanes
			}
		}
		now := time.Now().UTC().Format(time.RFC3339)
		switch {
		case errors.Is(err, classify.ErrDisabled):
			fmt.Fprintf(out, "%s  the limiter is off: calls pass straight through\n", now)
		case err != nil:
			fmt.Fprintf(out, "%s  cannot read the classification: %v\n", now, err)
		case len(lanes) == 0:
			fmt.Fprintf(out, "%s  no lanes yet\n", now)
		}
		for _, l := range lanes {
			fmt.Fprintf(out, "%s  %s  %-16s  wait now: %s  %s\n", now, name(l), l.State, eta(l.ETA), l.HoldText)
		}
		if *count > 0 && n >= *count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// name shows a lane as "<upstream>|<model>" when its upstream is known.
func name(l classify.Classification) string {
	if l.Target != "" {
		return l.Target + ":" + l.Lane
	}
	if l.Upstream != "" {
		return l.Upstream + "|" + l.Model
	}
	return l.Lane
}

func eta(e limiter.ETA) string {
	var parts []string
	for _, c := range []struct {
		name string
		v    *limiter.Seconds
	}{{"interactive", e.Interactive}, {"default", e.Default}, {"bulk", e.Bulk}} {
		v := "?"
		if c.v != nil {
			v = fmt.Sprintf("%.1f s", float64(*c.v))
		}
		parts = append(parts, c.name+" "+v)
	}
	return strings.Join(parts, ", ")
}
