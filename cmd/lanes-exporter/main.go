// Command lanes-exporter is a lane-limiting reverse proxy for LLM gateways
// and the exporter of its lanes: point any OpenAI-compatible client's base
// URL at http://<listen>/proxy/<upstream>/ and every process on the box
// shares one bounded, priority-ordered budget per (gateway, model).
//
//	lanes-exporter --config lanes.yaml
//	lanes-exporter --demo
//
// Signals: SIGHUP reloads the configuration file (as POST /-/reload does,
// with --web.enable-lifecycle); SIGTERM or SIGINT turns readiness false,
// answers every queued call at once with 503 lane_shutting_down, stops
// accepting connections, lets calls holding a slot finish for up to
// --shutdown-timeout, then exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("lanes-exporter", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `lanes-exporter: a lane-limiting reverse proxy for LLM gateways, and the exporter of its lanes.

Usage:
  lanes-exporter --config lanes.yaml [--listen addr]
  lanes-exporter --demo [--listen addr]

Routes: /proxy/<upstream>/... (the proxy; class from the X-LLM-Priority header:
interactive, default or bulk), /metrics, /api/telemetry/llm-lanes,
/api/telemetry/llm-lanes/classification, /api/telemetry/llm-lanes/budget,
/healthz, /-/healthy, /-/ready, POST /-/reload (with --web.enable-lifecycle), and a
status page at /.

Flags:
`)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "configuration file (YAML; see lanes.example.yaml)")
	listen := fs.String("listen", "", "address to listen on, overriding the file's listen (default "+exporter.DefaultListen+")")
	demo := fs.Bool("demo", false, "run against a built-in simulated gateway with a built-in load, to see every surface")
	shutdown := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long calls in progress may take to finish")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	lifecycle := fs.Bool("web.enable-lifecycle", false, "allow POST /-/reload (SIGHUP reloads in any case)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "lanes-exporter: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var l *exporter.Listener
	var stopDemo func(context.Context) error
	switch {
	case *demo:
		addr := *listen
		if addr == "" {
			addr = exporter.DefaultListen
		}
		var err error
		if l, stopDemo, err = startDemo(addr, log); err != nil {
			fmt.Fprintln(os.Stderr, "lanes-exporter:", err)
			return 1
		}
		base := "http://" + l.Addr
		fmt.Printf(`lanes-exporter demo: a simulated gateway (capacity 8) behind lanes of 4 slots (1 reserved for interactive),
with chats, coder turns and review-panel bursts. Faults cycle every 100 s: normal for 20 s, then 429/5xx for 25 s, then stalls for 15 s.

  status page      %[1]s/
  snapshot (D8)    %[1]s/api/telemetry/llm-lanes
  classification   %[1]s/api/telemetry/llm-lanes/classification
  metrics          %[1]s/metrics
  proxy            %[1]s/proxy/sim/chat/completions   (header X-LLM-Priority: interactive|default|bulk)

Ctrl-C to stop.
`, base)
	case *config != "":
		cfg, err := exporter.LoadConfig(*config)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lanes-exporter:", err)
			return 1
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		srv, err := exporter.New(cfg, exporter.Options{File: *config, Log: log, EnableLifecycle: *lifecycle})
		if err != nil {
			fmt.Fprintln(os.Stderr, "lanes-exporter:", err)
			return 1
		}
		if l, err = exporter.Start(srv, cfg.Listen); err != nil {
			fmt.Fprintln(os.Stderr, "lanes-exporter:", err)
			return 1
		}
		log.Info("lanes-exporter listening", "addr", l.Addr, "upstreams", len(cfg.Upstreams), "max_inflight", cfg.Limiter.MaxInflight)
	default:
		fs.Usage()
		fmt.Fprintln(os.Stderr, "\nlanes-exporter: give --config FILE or --demo")
		return 2
	}

	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	for s := range sig {
		if s == syscall.SIGHUP {
			if *demo {
				log.Warn("the demo has no configuration file to reload")
				continue
			}
			_ = l.Server.Reload() // logs its result
			continue
		}
		log.Info("shutting down; letting calls in progress finish", "signal", s.String(), "timeout", *shutdown)
		ctx, cancel := context.WithTimeout(context.Background(), *shutdown)
		var err error
		if stopDemo != nil {
			err = stopDemo(ctx)
		} else {
			err = l.Shutdown(ctx)
		}
		cancel()
		if err != nil {
			log.Error("shutdown", "err", err)
			return 1
		}
		return 0
	}
	return 0
}
