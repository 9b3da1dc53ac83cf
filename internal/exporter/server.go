// Package exporter is lanes-exporter: a lane-limiting reverse proxy in front
// of the configured LLM gateways, and the exporter of the lanes' metrics,
// snapshot and classification, with a status page.
package exporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/telemetry"
)

// PriorityHeader carries a proxied call's class; it is stripped before
// forwarding.
const PriorityHeader = "X-LLM-Priority"

// Server is a running lanes-exporter's state.
type Server struct {
	file string // the configuration file, for reloads; "" when built in code
	log  *slog.Logger
	lim  *limiter.Limiter
	tel  *telemetry.Telemetry
	base http.RoundTripper // shared connection pool to the upstreams
	cfg  atomic.Pointer[Config]
	ups  atomic.Pointer[map[string]*upstream]
	mux  *http.ServeMux
	mu   sync.Mutex // serializes reloads

	reloadOK   prometheus.Gauge
	reloadTime prometheus.Gauge
	polls      atomic.Pointer[pollers]
	buffers    bufferPool
}

func (s *Server) targets() *pollers { return s.polls.Load() }

type upstream struct {
	cfg   Upstream
	proxy *httputil.ReverseProxy
}

// Options are the parts of a Server that are not in the configuration file.
type Options struct {
	File  string            // reload source; "" disables reloading from a file
	Log   *slog.Logger      // nil: slog.Default()
	Clock limiter.Clock     // nil: the system clock
	Base  http.RoundTripper // nil: a new http.Transport
	// Observers are told the limiter's events beside the telemetry.
	Observers []limiter.Observer
}

// New builds a server from a checked configuration.
func New(cfg *Config, o Options) (*Server, error) {
	s := &Server{file: o.File, log: o.Log, base: o.Base, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.base == nil {
		s.base = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true}
	}
	tel, err := telemetry.New(telemetry.Options{Prefix: cfg.Metrics.Prefix, Thresholds: cfg.thresholds()})
	if err != nil {
		return nil, err
	}
	opts := []limiter.Option{limiter.WithObserver(tel.Observe), limiter.WithLogger(s.log)}
	for _, ob := range o.Observers {
		opts = append(opts, limiter.WithObserver(ob))
	}
	if o.Clock != nil {
		opts = append(opts, limiter.WithClock(o.Clock))
	}
	lim, err := limiter.New(cfg.limiterConfig(), opts...)
	if err != nil {
		return nil, err
	}
	tel.Watch(lim)
	s.lim, s.tel = lim, tel
	p := cfg.Metrics.Prefix
	s.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: p + "_config_last_reload_successful",
		Help: "1 if the last configuration reload succeeded (or none was tried), 0 if it was refused."})
	s.reloadTime = prometheus.NewGauge(prometheus.GaugeOpts{Name: p + "_config_last_reload_success_timestamp_seconds",
		Help: "When the configuration was last loaded successfully, in Unix seconds."})
	tel.Registry().MustRegister(s.reloadOK, s.reloadTime, newTargetCollector(s, p))
	tel.SetSources(func() []telemetry.Source { return s.targets().sources() })
	s.reloadOK.Set(1)
	s.reloadTime.SetToCurrentTime()
	s.apply(cfg)

	tel.Register(s.mux)
	s.mux.HandleFunc("/proxy/{upstream}/{rest...}", s.serveProxy)
	s.mux.HandleFunc("POST /-/reload", s.serveReload)
	s.mux.HandleFunc("GET /api/telemetry/llm-lanes/budget", s.serveBudget)
	s.mux.HandleFunc("GET /{$}", s.serveStatus)
	return s, nil
}

// Handler returns the server's routes.
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
	_ = s.lim.SetConfig(cfg.limiterConfig()) // checked already
	_ = s.tel.SetThresholds(cfg.thresholds())
	ups := make(map[string]*upstream, len(cfg.Upstreams))
	bases := make(map[string]string, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		ups[u.Name] = s.newUpstream(u, cfg.Proxy)
		bases[u.Name] = u.BaseURL
	}
	s.tel.SetUpstreams(bases)
	s.ups.Store(&ups)
	s.cfg.Store(cfg)
	if old := s.polls.Swap(s.startTargets(cfg.Targets)); old != nil {
		old.stop()
	}
}

func (s *Server) newUpstream(u Upstream, pc ProxyConfig) *upstream {
	target, _ := url.Parse(u.BaseURL) // checked
	lanes := &lanehttp.Transport{
		Limiter:               s.lim,
		Base:                  s.base,
		Lane:                  func(_ *http.Request, model string) string { return u.BaseURL + "|" + model },
		MaxBodyBytes:          pc.MaxBodyBytes,
		ResponseHeaderTimeout: time.Duration(pc.ResponseHeaderTimeout),
		StallTimeout:          time.Duration(pc.StallTimeout),
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out.URL
			out.Scheme, out.Host, out.User = target.Scheme, target.Host, nil
			out.Path = target.Path + "/" + pr.In.PathValue("rest")
			out.RawPath = ""
			out.RawQuery = pr.In.URL.RawQuery
			pr.Out.Host = target.Host
			pr.Out.Header.Del(PriorityHeader)
		},
		Transport:     s.tel.Bridge().Transport(lanes),
		FlushInterval: -1, // streams pass through chunk by chunk
		ErrorHandler:  s.proxyError(u.Name),
		BufferPool:    &s.buffers,
	}
	return &upstream{cfg: u, proxy: rp}
}

// bufferPool recycles the proxy's 32 KiB copy buffers, which it would
// otherwise allocate for every call.
type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, 32<<10)
}

func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }

// serveProxy forwards /proxy/{upstream}/<rest> to <base_url>/<rest>.
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("upstream")
	u := (*s.ups.Load())[name]
	if u == nil {
		writeError(w, http.StatusNotFound, "unknown_upstream", fmt.Sprintf("no upstream named %q is configured", name))
		return
	}
	if rest := r.PathValue("rest"); hasDotSegment(rest) {
		writeError(w, http.StatusBadRequest, "invalid_path", "the path may not contain . or .. segments")
		return
	}
	ctx := r.Context()
	if v := r.Header.Get(PriorityHeader); v != "" {
		p, err := limiter.ParsePriority(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_priority", fmt.Sprintf("%s: %v", PriorityHeader, err))
			return
		}
		ctx = limiter.WithPriority(ctx, p)
	}
	// Each proxied request is one acquisition. A client's retry of a call
	// seen in the last few minutes queues with that call's first arrival
	// (lanehttp recognises it from its own memory, never from what the
	// client claims).
	u.proxy.ServeHTTP(w, r.WithContext(ctx))
}

func hasDotSegment(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// proxyError answers a request the upstream could not serve. It logs the
// cause without the URL (which may carry a key in its query) or headers.
func (s *Server) proxyError(name string) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		var se *lanehttp.StallError
		switch {
		case r.Context().Err() != nil:
			return // the client is gone; its slot is already free
		case errors.As(err, &se):
			s.log.Warn("upstream stalled", "upstream", name, "lane", se.Lane, "phase", se.Phase, "after", se.After)
			writeError(w, http.StatusGatewayTimeout, "upstream_stall", se.Error())
		default:
			err = withoutURL(err)
			s.log.Warn("upstream unreachable", "upstream", name, "err", err.Error())
			writeError(w, http.StatusBadGateway, "upstream_unreachable", fmt.Sprintf("upstream %q: %v", name, err))
		}
	}
}

// withoutURL drops the URL that net/http puts in front of a transport
// error: it may carry a key in its query, and must not reach a log.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// writeError answers with an OpenAI-style JSON error.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	b, _ := json.Marshal(lanehttp.ErrorBody{Error: lanehttp.ErrorDetail{Message: msg, Type: typ, Code: code}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
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

func (s *Server) serveReload(w http.ResponseWriter, _ *http.Request) {
	if err := s.Reload(); err != nil {
		writeError(w, http.StatusBadRequest, "reload_refused", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, `{"status":"reloaded"}`)
}

// Shutdown stops the target pollers and the telemetry, and closes idle
// upstream connections.
func (s *Server) Shutdown(ctx context.Context) error {
	if p := s.polls.Swap(nil); p != nil {
		p.stop()
	}
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	return s.tel.Shutdown(ctx)
}
