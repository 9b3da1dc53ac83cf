// Package exporter is lanes-exporter: a lane-limiting reverse proxy in front
// of the configured LLM gateways, and the exporter of the lanes' metrics,
// snapshot and classification, with a status page.
package exporter

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/semaphore"

	"github.com/llmlanes/llmlanes/internal/history"
	"github.com/llmlanes/llmlanes/internal/version"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/sharedlane"
	"github.com/llmlanes/llmlanes/telemetry"
)

// Server is a running lanes-exporter's state.
type Server struct {
	file  string // the configuration file, for reloads; "" when built in code
	log   *slog.Logger
	lim   *limiter.Limiter
	clock limiter.Clock // the limiter's
	tel   *telemetry.Telemetry
	// shared keeps the lanes in Redis (the shared: section); nil otherwise.
	shared *sharedlane.Backend
	base   http.RoundTripper // shared connection pool to the upstreams
	cfg    atomic.Pointer[Config]
	ups    atomic.Pointer[map[string]*upstream]
	// mux has every route; proxyMux and telemetryMux the proxy's and the
	// telemetry's, for when they have addresses of their own.
	mux, proxyMux, telemetryMux *http.ServeMux
	mu                          sync.Mutex // serializes reloads

	reloadOK   prometheus.Gauge
	reloadTime prometheus.Gauge
	polls      atomic.Pointer[pollers]
	lastPoll   sync.Map // target URL → time of its last poll, across reloads
	buffers    bufferPool
	chunks     chunkPool           // model calls' bodies are read into these (body.go)
	queued     *semaphore.Weighted // bytes of request bodies held, bounded by limits.max_queued_bytes
	// queuedBytes and connShare are limits.max_queued_bytes and
	// max_connection_queued_bytes, read at start.
	queuedBytes, connShare int64
	// recall is the memory of recent calls every upstream's transport
	// shares, across reloads, so that a reload forgets no retry.
	recall *lanehttp.Recall
	// history is the lanes' last 15 minutes for the status page, which
	// sampler records (history.go).
	history    *history.History
	sampler    *sampler
	lifecycle  bool
	stopping   atomic.Bool // shutdown has begun: not ready, every call refused
	propagator propagation.TextMapPropagator
}

func (s *Server) targets() *pollers { return s.polls.Load() }

// Options are the parts of a Server that are not in the configuration file.
type Options struct {
	File  string            // reload source; "" disables reloading from a file
	Log   *slog.Logger      // nil: slog.Default()
	Clock limiter.Clock     // nil: the system clock
	Base  http.RoundTripper // nil: a new http.Transport with the proxy's dial and TLS timeouts
	// Observers are told the limiter's events beside the telemetry.
	Observers []limiter.Observer
	// EnableLifecycle allows POST /-/reload (the --web.enable-lifecycle
	// flag, as in Prometheus); SIGHUP reloads in any case.
	EnableLifecycle bool
	// TracerProvider, Propagator and MetricExporters are the OpenTelemetry
	// setup (see internal/otelsetup); nil means no traces, W3C trace
	// context, and no OTLP metrics.
	TracerProvider  trace.TracerProvider
	Propagator      propagation.TextMapPropagator
	MetricExporters []sdkmetric.Exporter
}

// New builds a server from a checked configuration.
func New(cfg *Config, o Options) (*Server, error) {
	s := &Server{file: o.File, log: o.Log, base: o.Base, lifecycle: o.EnableLifecycle,
		queued: semaphore.NewWeighted(cfg.Limits.MaxQueuedBytes), queuedBytes: cfg.Limits.MaxQueuedBytes,
		connShare: cfg.Limits.MaxConnectionQueuedBytes, recall: lanehttp.NewRecall(0)}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.base == nil {
		// Dial and TLS bounds are read at start; the response header bound
		// covers calls outside the lanes (a lane's own starts once its slot
		// is held, in lanehttp).
		s.base = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true,
			DialContext:           (&net.Dialer{Timeout: time.Duration(cfg.Proxy.DialTimeout), KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   time.Duration(cfg.Proxy.TLSHandshakeTimeout),
			ResponseHeaderTimeout: time.Duration(cfg.Proxy.ResponseHeaderTimeout),
		}
	}
	if o.TracerProvider == nil {
		o.TracerProvider = tracenoop.NewTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	s.propagator = o.Propagator
	tel, err := telemetry.New(telemetry.Options{Prefix: cfg.Metrics.Prefix, Thresholds: cfg.res.thresholds,
		TracerProvider: o.TracerProvider, Propagator: o.Propagator, MetricExporters: o.MetricExporters,
		MaxTenantSeries: cfg.Limits.MaxTenantSeries})
	if err != nil {
		return nil, err
	}
	opts := []limiter.Option{limiter.WithObserver(tel.Observe), limiter.WithObserver(noteQueued), limiter.WithLogger(s.log)}
	for _, ob := range o.Observers {
		opts = append(opts, limiter.WithObserver(ob))
	}
	if o.Clock != nil {
		opts = append(opts, limiter.WithClock(o.Clock))
	}
	if cfg.res.shared != nil {
		sc := *cfg.res.shared
		sc.Log = s.log
		sharedlane.RedisLogsTo(s.log) // go-redis's own lines too, structured and redacted
		if s.shared, err = sharedlane.New(sc); err != nil {
			return nil, err
		}
		opts = append(opts, limiter.WithBackend(s.shared))
		s.log.Info("lanes are shared in Redis", "redis_url", sharedlane.Redact(sc.URL), "process", s.shared.Process())
	}
	lim, err := limiter.New(cfg.res.limiter, opts...)
	if err != nil {
		return nil, err
	}
	tel.Watch(lim)
	s.lim, s.tel = lim, tel
	p := cfg.Metrics.Prefix
	gauge := func(i int, labels prometheus.Labels) prometheus.Gauge {
		d := processDefs[i]
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: d.PromName(p), Help: d.Description, ConstLabels: labels})
	}
	s.reloadOK, s.reloadTime = gauge(pReloadOK, nil), gauge(pReloadTime, nil)
	vi := version.Get()
	buildInfo := gauge(pBuildInfo, prometheus.Labels{"version": vi.Version, "revision": vi.Revision, "goversion": vi.GoVersion})
	buildInfo.Set(1)
	tel.Registry().MustRegister(s.reloadOK, s.reloadTime, buildInfo, newTargetCollector(s, p))
	tel.SetSources(func() []telemetry.Source { return s.targets().sources() })
	s.reloadOK.Set(1)
	s.reloadTime.SetToCurrentTime()
	s.apply(cfg)

	s.mux, s.proxyMux, s.telemetryMux = s.routes(true, true), s.routes(true, false), s.routes(false, true)
	clock := o.Clock
	if clock == nil {
		clock = limiter.SystemClock()
	}
	s.history = history.New(HistoryWindow, HistoryInterval)
	s.clock = clock
	s.sampler = &sampler{s: s, clock: clock}
	s.sampler.schedule()
	return s, nil
}

// routes is the proxy's routes, the telemetry's (metrics, the snapshot,
// the classification, the budget, the status page, reload), or both; the
// liveness and readiness routes are on every one.
func (s *Server) routes(proxy, telemetry bool) *http.ServeMux {
	mux := http.NewServeMux()
	if proxy {
		mux.HandleFunc("/proxy/{upstream}/{rest...}", s.serveProxy)
	}
	if telemetry {
		s.tel.Register(mux)
		mux.HandleFunc("/-/reload", s.serveReload)
		mux.HandleFunc("GET /api/telemetry/llm-lanes/budget", s.serveBudget)
		mux.HandleFunc("GET "+HistoryPath, s.serveHistory)
		mux.HandleFunc("GET /{$}", s.serveStatus)
	}
	mux.HandleFunc("GET /-/healthy", s.serveHealthy)
	mux.HandleFunc("GET /-/ready", s.serveReady)
	return mux
}

// Handler returns the server's routes, the proxy's and the telemetry's.
func (s *Server) Handler() http.Handler { return s.mux }

// Limiter returns the server's limiter.
func (s *Server) Limiter() *limiter.Limiter { return s.lim }

// Telemetry returns the server's telemetry.
func (s *Server) Telemetry() *telemetry.Telemetry { return s.tel }

// Config returns the configuration in force.
func (s *Server) Config() *Config { return s.cfg.Load() }

// apply puts a checked configuration in force: limits for later
// acquisitions, thresholds, and the upstreams with their proxies.
func (s *Server) apply(cfg *Config) {
	_ = s.lim.SetConfig(cfg.res.limiter) // checked already
	_ = s.tel.SetThresholds(cfg.res.thresholds)
	ups := make(map[string]*upstream, len(cfg.Upstreams))
	bases := make(map[string]string, len(cfg.Upstreams))
	providers := map[string]string{}
	for _, u := range cfg.Upstreams {
		ups[u.Name] = s.newUpstream(u, cfg)
		bases[u.Name] = u.BaseURL
		if u.Provider != "" {
			providers[u.BaseURL] = u.Provider
		}
	}
	s.tel.SetUpstreams(bases)
	s.tel.Bridge().SetProviders(providers)
	s.ups.Store(&ups)
	s.cfg.Store(cfg)
	if old := s.polls.Swap(s.startTargets(cfg.Targets)); old != nil {
		old.stop()
	}
}

// Reload reads the configuration file again and puts it in force; a
// configuration that fails its checks is refused, and the old one stays.
// The listen address and the metric prefix take effect at the next start.
func (s *Server) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == "" {
		return errors.New("no configuration file to reload")
	}
	cfg, err := LoadConfig(s.file)
	if err != nil {
		s.reloadOK.Set(0)
		s.log.Error("reload refused; the old configuration stays in force", "err", err)
		return err
	}
	old := s.cfg.Load()
	if !reflect.DeepEqual(cfg.Shared, old.Shared) {
		err := errors.New("shared: the shared-lanes section changes only at the next start")
		s.reloadOK.Set(0)
		s.log.Error("reload refused; the old configuration stays in force", "err", err)
		return err
	}
	if cfg.Listen != old.Listen || cfg.Metrics.Prefix != old.Metrics.Prefix {
		s.log.Warn("listen and metrics.prefix change only at the next start", "listen", old.Listen, "prefix", old.Metrics.Prefix)
		cfg.Listen, cfg.Metrics.Prefix = old.Listen, old.Metrics.Prefix
	}
	s.apply(cfg)
	s.reloadOK.Set(1)
	s.reloadTime.SetToCurrentTime()
	s.log.Info("configuration reloaded", "file", s.file, "max_inflight", cfg.Limiter.MaxInflight, "upstreams", len(cfg.Upstreams))
	return nil
}

// Stop begins the shutdown: readiness turns false, every call waiting for
// a slot is answered at once with 503 lane_shutting_down, and every later
// call is too (none reaches the gateway); calls holding a slot run on.
func (s *Server) Stop() {
	s.stopping.Store(true)
	s.lim.Shutdown()
}

// Shutdown stops the target pollers and the telemetry, and closes idle
// upstream connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.sampler.stop()
	if p := s.polls.Swap(nil); p != nil {
		p.stop()
	}
	if s.shared != nil {
		s.shared.Close()
	}
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	return s.tel.Shutdown(ctx)
}

// lanes-exporter's metrics about itself, by their place in processDefs.
const (
	pBuildInfo = iota
	pReloadOK
	pReloadTime
)

// processDefs is the table of lanes-exporter's metrics about itself; read
// only.
var processDefs = []otelbridge.Def{
	pBuildInfo: {Name: "build_info", Labels: []string{"version", "revision", "goversion"},
		Description: "Always 1; the labels say which build of lanes-exporter is running."},
	pReloadOK: {Name: "config_last_reload_successful",
		Description: "1 if the last configuration reload succeeded (or none was tried), 0 if it was refused."},
	pReloadTime: {Name: "config_last_reload_success_timestamp_seconds", Float: true,
		Description: "When the configuration was last loaded successfully, in Unix seconds."},
}

// ProcessDefs returns the table of lanes-exporter's metrics about itself
// (a copy).
func ProcessDefs() []otelbridge.Def { return append([]otelbridge.Def(nil), processDefs...) }
