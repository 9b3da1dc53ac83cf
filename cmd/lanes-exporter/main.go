// Command lanes-exporter is a lane-limiting reverse proxy for LLM gateways
// and the exporter of its lanes: point any OpenAI-compatible client's base
// URL at http://<listen>/proxy/<upstream>/ and every process on the box
// shares one bounded, priority-ordered budget per (gateway, model).
//
//	lanes-exporter --config lanes.yaml
//	lanes-exporter --demo
//	lanes-exporter --check-config lanes.yaml
//
// Signals: SIGHUP reloads the configuration file (as POST /-/reload does,
// with --web.enable-lifecycle); SIGTERM or SIGINT turns readiness false,
// answers every queued call at once with 503 lane_shutting_down, stops
// accepting connections, lets calls holding a slot finish for up to
// --shutdown-timeout, then exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/otelsetup"
	"github.com/llmlanes/llmlanes/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `lanes-exporter: a lane-limiting reverse proxy for LLM gateways, and the exporter of its lanes.

Usage:
  lanes-exporter --config lanes.yaml [--listen addr] [--web.listen-address addr] [--web.config.file web.yml]
  lanes-exporter --demo [--listen addr]
  lanes-exporter --check-config lanes.yaml
  lanes-exporter --version

Routes:
  /proxy/<upstream>/...                     the proxy (class from the X-LLM-Priority header:
                                            interactive, default or bulk)
  /metrics                                  Prometheus metrics
  /api/telemetry/llm-lanes                  the lanes' snapshot (JSON)
  /api/telemetry/llm-lanes/classification   each lane's state: idle, healthy, local_queue,
                                            gateway_degraded (?lane=, ?upstream=&model=)
  /api/telemetry/llm-lanes/budget           each lane's limits across processes vs capacity
  /healthz, /-/healthy                      liveness
  /-/ready                                  readiness (503 once shutdown has begun)
  POST /-/reload                            reload the file (needs --web.enable-lifecycle)
  /                                         the status page

With --web.listen-address, every route but the proxy's is served on that address
instead (liveness and readiness on both), and --web.config.file can lock it down
(TLS, client certificates, basic auth: exporter-toolkit's web config).

Traces and OTLP metrics follow the standard OTEL_* environment variables
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, ...);
with none set, nothing is exported but /metrics.

Flags:
`

// helpAsked reports whether args ask for the usage (-h, -help, --help).
func helpAsked(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			return true
		}
	}
	return false
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lanes-exporter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		if helpAsked(args) {
			return // printed once, on stdout, below
		}
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "configuration file (YAML; see lanes.example.yaml)")
	check := fs.String("check-config", "", "check this configuration file, say what is wrong with it if anything, and exit")
	listen := fs.String("listen", "", "address to listen on, overriding the file's listen (default "+exporter.DefaultListen+")")
	demo := fs.Bool("demo", false, "run against a built-in simulated gateway with a built-in load, to see every surface")
	demoGateway := fs.String("demo.gateway", "simple", "with --demo, the simulated gateway: simple (stops a call's work when its client goes) or litellm (LiteLLM-like: max_parallel_requests 3, below the lanes' 4; goes on with abandoned calls)")
	shutdown := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long calls holding a slot may take to finish")
	logLevel := fs.String("log.level", "info", "debug, info, warn or error")
	fs.StringVar(logLevel, "log-level", "info", "the same as --log.level")
	logFormat := fs.String("log.format", "logfmt", "logfmt or json")
	lifecycle := fs.Bool("web.enable-lifecycle", false, "allow POST /-/reload (SIGHUP reloads in any case)")
	telemetry := fs.String("web.listen-address", "", "serve the telemetry routes (metrics, snapshot, classification, budget, status page, reload) on this address of their own (default: with the proxy, on --listen)")
	webConfig := fs.String("web.config.file", "", "prometheus/exporter-toolkit web config for the telemetry's address: TLS, client certificates, basic auth (with one address: that address's, TLS only)")
	proxyWebConfig := fs.String("proxy.web.config.file", "", "the same kind of file for the proxy's address: TLS and client certificates only (its clients' Authorization carries their model credentials)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			// Parse printed it to stderr already; --help's answer is the
			// usage on stdout, once.
			fs.SetOutput(stdout)
			fmt.Fprint(stdout, usage)
			fs.PrintDefaults()
			return 0
		}
		return 2
	}
	if *showVersion {
		v := version.Get()
		fmt.Fprintf(stdout, "lanes-exporter %s (revision %s, %s)\n", v.Version, v.Revision, v.GoVersion)
		return 0
	}
	if *check != "" {
		cfg, err := exporter.LoadConfig(*check)
		if err != nil {
			fmt.Fprintln(stderr, "lanes-exporter:", err)
			return 1
		}
		fmt.Fprintf(stdout, "config %s: ok (%d upstreams, max_inflight %d, listen %s)\n", *check, len(cfg.Upstreams), cfg.Limiter.MaxInflight, cfg.Listen)
		return 0
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintln(stderr, "lanes-exporter:", err)
		return 2
	}

	ctx := context.Background()
	otel, err := otelsetup.FromEnv(ctx, version.Get().Version)
	if err != nil {
		fmt.Fprintln(stderr, "lanes-exporter:", err)
		return 1
	}
	defer otel.Shutdown(context.Background())
	opts := exporter.Options{Log: log, EnableLifecycle: *lifecycle,
		TracerProvider: otel.TracerProvider, Propagator: otel.Propagator, MetricExporters: otel.MetricExporters}

	// The signals are caught before the listener opens: a SIGTERM that comes
	// as soon as the process answers (a test, an orchestrator's quick stop)
	// must shut it down gracefully, not kill it.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)

	var l *exporter.Listener
	var stopDemo func(context.Context) error
	addrs := exporter.Addresses{ProxyWebConfig: *proxyWebConfig, Telemetry: *telemetry, TelemetryWebConfig: *webConfig}
	if *telemetry == "" && *webConfig != "" {
		// One address: the Prometheus habit (--web.config.file) names
		// that address's file, which then takes TLS only.
		if *proxyWebConfig != "" {
			fmt.Fprintln(stderr, "lanes-exporter: with one address, give --web.config.file or --proxy.web.config.file, not both (or give the telemetry its own --web.listen-address)")
			return 2
		}
		addrs.ProxyWebConfig, addrs.TelemetryWebConfig = *webConfig, ""
	}
	switch {
	case *demo && (addrs != exporter.Addresses{}):
		fmt.Fprintln(stderr, "lanes-exporter: --web.listen-address, --web.config.file and --proxy.web.config.file are for --config; the demo serves everything on --listen")
		return 2
	case *demo:
		addr := *listen
		if addr == "" {
			addr = exporter.DefaultListen
		}
		if l, stopDemo, err = startDemo(addr, log, opts, *demoGateway); err != nil {
			fmt.Fprintln(stderr, "lanes-exporter:", err)
			return 1
		}
		base := "http://" + l.Addr
		gw := "a simulated gateway (capacity 8)"
		if *demoGateway == "litellm" {
			gw = "a simulated LiteLLM-like gateway (capacity 8, max_parallel_requests 3)"
		}
		fmt.Fprintf(stdout, `lanes-exporter demo: %[2]s behind lanes of 4 slots (1 reserved for interactive),
with chats, coder turns and review-panel bursts. Faults cycle every 100 s: normal for 20 s, then 429/5xx for 25 s, then stalls for 15 s.

  status page      %[1]s/
  snapshot         %[1]s/api/telemetry/llm-lanes
  classification   %[1]s/api/telemetry/llm-lanes/classification
  metrics          %[1]s/metrics
  proxy            %[1]s/proxy/sim/chat/completions   (header X-LLM-Priority: interactive|default|bulk)

Ctrl-C to stop.
`, base, gw)
	case *config != "":
		cfg, err := exporter.LoadConfig(*config)
		if err != nil {
			fmt.Fprintln(stderr, "lanes-exporter:", err)
			return 1
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		opts.File = *config
		srv, err := exporter.New(cfg, opts)
		if err != nil {
			fmt.Fprintln(stderr, "lanes-exporter:", err)
			return 1
		}
		addrs.Proxy = cfg.Listen
		if l, err = exporter.Listen(srv, addrs); err != nil {
			fmt.Fprintln(stderr, "lanes-exporter:", err)
			_ = srv.Shutdown(context.Background())
			return 1
		}
		log.Info("lanes-exporter listening", "addr", l.Addr, "telemetry", l.TelemetryAddr, "proxy_tls", addrs.ProxyWebConfig != "",
			"telemetry_web_config", addrs.TelemetryWebConfig, "upstreams", len(cfg.Upstreams), "max_inflight", cfg.Limiter.MaxInflight,
			"version", version.Get().Version, "traces", otel.Traces)
	default:
		fs.Usage()
		fmt.Fprintln(stderr, "\nlanes-exporter: give --config FILE or --demo")
		return 2
	}

	for s := range sig {
		if s == syscall.SIGHUP {
			if *demo {
				log.Warn("the demo has no configuration file to reload")
				continue
			}
			_ = l.Server.Reload() // logs its result
			continue
		}
		log.Info("shutting down: queued calls are answered now, calls in progress may finish", "signal", s.String(), "timeout", *shutdown)
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

// newLogger returns the process's logger: every line, net/http's and the
// reverse proxy's included, goes through it.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log.level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "logfmt":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log.format %q: want logfmt or json", format)
}
