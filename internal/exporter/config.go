package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/redact"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/sharedlane"
	"github.com/llmlanes/llmlanes/telemetry"
)

// Config is lanes-exporter's configuration file (see lanes.example.yaml).
type Config struct {
	// tenantSource is limiter.fairness.tenant_from, parsed once by check
	// rather than for every call.
	tenantSource tenantSource
	// res is the file resolved into the library's configurations, once,
	// by check: New and a reload use these, never the file again.
	res resolved

	Listen         string         `yaml:"listen"`
	Limiter        LimiterConfig  `yaml:"limiter"`
	Upstreams      []Upstream     `yaml:"upstreams"`
	Metrics        MetricsConfig  `yaml:"metrics"`
	Proxy          ProxyConfig    `yaml:"proxy"`
	Limits         LimitsConfig   `yaml:"limits"`
	Server         ServerConfig   `yaml:"server"`
	Classification Classification `yaml:"classification"`
	Targets        []Target       `yaml:"targets"`
	Shared         *SharedConfig  `yaml:"shared"`
}

// SharedConfig keeps the lanes in Redis, shared with every process that
// names the same Redis and key prefix (package sharedlane). Absent: the
// lanes are this process's own.
type SharedConfig struct {
	RedisURL         string   `yaml:"redis_url"`
	TLSCAFile        string   `yaml:"tls_ca_file"`
	KeyPrefix        string   `yaml:"key_prefix"`
	LeaseTTL         Duration `yaml:"lease_ttl"`
	OnRedisDown      string   `yaml:"on_redis_down"`
	LocalMaxInflight int      `yaml:"local_max_inflight"`
	// Process names this process among the lane's holders (default
	// host:pid).
	Process string `yaml:"process"`
}

// sharedlane returns the backend's settings.
func (c *SharedConfig) sharedlane() sharedlane.Config {
	return sharedlane.Config{URL: c.RedisURL, TLSCAFile: c.TLSCAFile, KeyPrefix: c.KeyPrefix, LeaseTTL: time.Duration(c.LeaseTTL),
		OnRedisDown: c.OnRedisDown, LocalMaxInflight: c.LocalMaxInflight, Process: c.Process}
}

// LimiterConfig holds the lane settings (docs/DESIGN.md, "Semantics of a lane").
type LimiterConfig struct {
	MaxInflight        int      `yaml:"max_inflight"`
	QueueTimeout       Duration `yaml:"queue_timeout"`
	InteractiveReserve *int     `yaml:"interactive_reserve"`
	// Deadline and DeadlineMargin: what a lane does with a call whose
	// client's stated timeout (X-LLM-Timeout, X-Stainless-Timeout,
	// X-Stainless-Read-Timeout) it foresees missing, answer_early (the
	// default) or wait, and how long before that timeout a queued call is
	// answered (0: 500 ms); see limiter.Config.Deadline.
	Deadline       string   `yaml:"deadline"`
	DeadlineMargin Duration `yaml:"deadline_margin"`
	// Adaptive, when present, makes max_inflight the ceiling of a limit
	// learned from the gateway (see limiter.Adaptive).
	Adaptive *AdaptiveConfig `yaml:"adaptive"`
	// Fairness shares each lane between tenants (see limiter.Fairness).
	Fairness FairnessConfig `yaml:"fairness"`
	// TokensPerMinute and MaxInflightTokens are each lane's token budgets
	// (see limiter.Config), 0 for none; DefaultMaxOutputTokens is the
	// output bound of a call that names none, for its estimate (0: 1024).
	TokensPerMinute        int64 `yaml:"tokens_per_minute"`
	MaxInflightTokens      int64 `yaml:"max_inflight_tokens"`
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
	// ColdStart makes each new lane send one call until the first
	// answer's headers (see limiter.Config.ColdStart); not with shared.
	ColdStart bool `yaml:"cold_start"`
	// ProviderWindow is the window over which the provider refills the
	// budgets its rate-limit headers announce (see
	// limiter.Config.ProviderWindow): a reset is taken as at most this
	// long. 0: 60 s.
	ProviderWindow Duration `yaml:"provider_window"`
}

// FairnessConfig is limiter.fairness.
type FairnessConfig struct {
	// TenantFrom says where a call's tenant comes from: "header" (the
	// default: X-LLM-Tenant), "credential" (a short hash of the caller's
	// Authorization or x-api-key, never the secret itself) or
	// "header:NAME" (the value of request header NAME).
	TenantFrom           string             `yaml:"tenant_from"`
	Weights              map[string]float64 `yaml:"weights"`
	MaxInflightPerTenant int                `yaml:"max_inflight_per_tenant"` // 0: no cap
}

// AdaptiveConfig is limiter.adaptive.
type AdaptiveConfig struct {
	MinInflight int `yaml:"min_inflight"`
	Initial     int `yaml:"initial"`
}

// Upstream is a gateway the proxy may reach, as /proxy/<name>/...
type Upstream struct {
	Name     string `yaml:"name"`
	BaseURL  string `yaml:"base_url"`
	Capacity int    `yaml:"capacity"` // the gateway's real parallel capacity, 0 if unknown
	// Models, when set, are the only models a call may name: exact ids or
	// path.Match globs ("protolabs/*"). Others get a 403 model_not_allowed.
	Models []string `yaml:"models"`
	// Provider is the GenAI provider its spans and GenAI metrics name
	// (gen_ai.provider.name: openai, anthropic, aws.bedrock, ...); "" means
	// openai, or anthropic for /messages.
	Provider string `yaml:"provider"`
	// CancelPropagates says the upstream stops a call's work when its
	// client goes away. false (the default, and LiteLLM's behaviour): a
	// call whose client leaves after it was sent keeps its slot until the
	// upstream's answer ends (read and discarded), so that the backend
	// never has more calls at work than the lane's limit.
	CancelPropagates bool `yaml:"cancel_propagates"`
	// Headers says whose rate-limit headers the upstream sends: gateway
	// (the default: a gateway's own accounting, as LiteLLM's rpm/tpm;
	// its budgets bind grants, its announced limit refuses no call),
	// provider (the provider's API itself: a call estimated above its
	// announced token limit is refused too) or ignore.
	Headers string `yaml:"headers"`
}

// MetricsConfig sets the metric name prefix.
type MetricsConfig struct {
	Prefix string `yaml:"prefix"`
}

// ProxyConfig bounds proxied calls; a zero field takes its default.
type ProxyConfig struct {
	MaxBodyBytes          int64    `yaml:"max_body_bytes"`          // default 32 MiB
	BodyReadTimeout       Duration `yaml:"body_read_timeout"`       // default 60 s
	BodyMinRate           int64    `yaml:"body_min_rate"`           // default 240 bytes a second, after the grace
	BodyMinRateGrace      Duration `yaml:"body_min_rate_grace"`     // default 5 s
	DialTimeout           Duration `yaml:"dial_timeout"`            // default 10 s
	TLSHandshakeTimeout   Duration `yaml:"tls_handshake_timeout"`   // default 10 s
	ResponseHeaderTimeout Duration `yaml:"response_header_timeout"` // default 300 s, from when the slot is held
	StallTimeout          Duration `yaml:"stall_timeout"`           // default 120 s
	// ServerTiming adds Server-Timing to every proxied answer (the queue
	// wait and the time to the upstream's headers); default true.
	ServerTiming *bool    `yaml:"server_timing"`
	WriteTimeout Duration `yaml:"write_timeout"` // default 120 s: a client that reads nothing for it is cut
	// StreamKeepalive commits a streamed call that waits for its slot
	// longer than StreamKeepaliveEvery (200 text/event-stream) and sends
	// an SSE comment every period while it waits; its answer then comes
	// as the stream's events, an error as the provider's in-stream error
	// event (keepalive.go). Default true; every 15 s.
	StreamKeepalive      *bool    `yaml:"stream_keepalive"`
	StreamKeepaliveEvery Duration `yaml:"stream_keepalive_every"`
}

// LimitsConfig bounds what clients can make the exporter hold; a zero
// field takes its default.
type LimitsConfig struct {
	MaxLanes       int      `yaml:"max_lanes"`        // default 1000
	LaneIdleTTL    Duration `yaml:"lane_idle_ttl"`    // default 1 h
	MaxQueuedBytes int64    `yaml:"max_queued_bytes"` // default 256 MiB
	// MaxConnectionQueuedBytes is what the calls in progress on one
	// connection hold together; default an eighth of MaxQueuedBytes, and
	// never less than proxy.max_body_bytes.
	MaxConnectionQueuedBytes int64 `yaml:"max_connection_queued_bytes"`
	MaxModelBytes            int   `yaml:"max_model_bytes"` // default 256
	// MaxTenants is how many tenants a lane tracks by name; the calls of
	// any more share the tenant "other". Default 100.
	MaxTenants int `yaml:"max_tenants"`
	// MaxTenantSeries is how many (lane, tenant) series the tenant
	// metrics have across all lanes; a lane's tenants past it are summed
	// as "other". Default 1000.
	MaxTenantSeries int `yaml:"max_tenant_series"`
}

// ServerConfig bounds the connections of lanes-exporter's HTTP server; a
// zero field takes its default.
type ServerConfig struct {
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"` // default 10 s
	IdleTimeout       Duration `yaml:"idle_timeout"`        // default 120 s
	MaxHeaderBytes    int      `yaml:"max_header_bytes"`    // default 64 KiB
}

// Classification holds the classification thresholds.
type Classification struct {
	WaitP90        Duration `yaml:"wait_p90"`
	UpstreamErrors int      `yaml:"upstream_errors"`
	ErrorRatio     *float64 `yaml:"error_ratio"`
	Retries        int      `yaml:"retries"`
	ClearAfter     Duration `yaml:"clear_after"`
}

// Target is another process's lane snapshot endpoint to re-export.
type Target struct {
	Name     string   `yaml:"name"`
	URL      string   `yaml:"url"`
	Interval Duration `yaml:"interval"`
}

// Duration is a Go duration string ("300s", "5m") or a plain number of
// seconds (300, 0.5).
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as 300s or 5m, or a number of seconds", n.Line)
	}
	if secs, err := strconv.ParseFloat(n.Value, 64); err == nil {
		*d = Duration(secs * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration: want e.g. 300s, 5m or a number of seconds", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// Defaults.
const (
	DefaultListen                = "127.0.0.1:4470"
	DefaultTargetInterval        = 10 * time.Second
	DefaultMaxBodyBytes          = 32 << 20
	DefaultBodyReadTimeout       = 60 * time.Second
	DefaultDialTimeout           = 10 * time.Second
	DefaultTLSHandshakeTimeout   = 10 * time.Second
	DefaultResponseHeaderTimeout = 300 * time.Second
	DefaultStallTimeout          = 120 * time.Second
	DefaultWriteTimeout          = 120 * time.Second
	DefaultStreamKeepaliveEvery  = 15 * time.Second
	DefaultMaxQueuedBytes        = 256 << 20
	DefaultBodyMinRate           = 240 // bytes a second, as Kestrel's MinRequestBodyDataRate
	DefaultBodyMinRateGrace      = 5 * time.Second
	DefaultMaxModelBytes         = 256
	DefaultReadHeaderTimeout     = 10 * time.Second
	DefaultIdleTimeout           = 120 * time.Second
	DefaultMaxHeaderBytes        = 64 << 10
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]*$`)

// ConfigError is a configuration file that cannot be used.
type ConfigError struct {
	File string
	Key  string // e.g. limiter.max_inflight, upstreams[1].base_url; "" for a syntax error
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("config %s: %s: %v", e.File, e.Key, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// LoadConfig reads and checks a configuration file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{File: path, Err: err}
	}
	return ParseConfig(path, b)
}

// ParseConfig parses and checks a configuration; file names it in errors.
func ParseConfig(file string, b []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)                                  // a misspelt key is an error, not a silent default
	if err := dec.Decode(c); err != nil && err != io.EOF { // io.EOF: an empty file
		return nil, &ConfigError{File: file, Err: cleanYAML(err)}
	}
	if err := c.check(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = file
		}
		return nil, err
	}
	return c, nil
}

// cleanYAML says what a YAML error means in the file's terms: its line,
// and what was wanted there, never a Go type name.
func cleanYAML(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if m := unknownKeyRE.FindStringSubmatch(l); m != nil {
			l = fmt.Sprintf("%s: unknown key %q (lanes.example.yaml lists every key)", m[1], m[2])
		} else if m := wrongTypeRE.FindStringSubmatch(l); m != nil {
			got := yamlKinds[m[2]]
			if m[3] != "" {
				got += " " + m[3]
			}
			l = fmt.Sprintf("%s: want %s, got %s", m[1], goKind(m[4]), got)
		}
		lines = append(lines, l)
	}
	return errors.New(strings.Join(lines, "; "))
}

var (
	unknownKeyRE = regexp.MustCompile(`^(line \d+): field (\S+) not found in type \S+$`)
	wrongTypeRE  = regexp.MustCompile("^(line \\d+): cannot unmarshal !!(\\w+) ?(`[^`]*`)? into (\\S+)$")
	yamlKinds    = map[string]string{"str": "text", "int": "a whole number", "float": "a number", "bool": "true or false",
		"seq": "a list", "map": "a mapping", "null": "nothing", "timestamp": "a time"}
)

// goKind says in words what a Go type of the configuration wants.
func goKind(t string) string {
	t = strings.TrimPrefix(t, "*")
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string":
		return "text"
	case t == "bool":
		return "true or false"
	}
	return "a mapping of keys to values"
}

func keyErr(key, format string, args ...any) error {
	return &ConfigError{Key: key, Err: fmt.Errorf(format, args...)}
}

// check validates every key and fills in the defaults.
func (c *Config) check() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if err := c.checkBounds(); err != nil {
		return err
	}
	// The limiter section is the limiter's to judge: one rule, in
	// limiter.Config.Validate, named here by its key in this file.
	// (checkBounds has judged the limits section, whose 0 means a default
	// here, not what it means to the library.)
	if _, ok := limiter.ParseDeadlinePolicy(c.Limiter.Deadline); !ok {
		return keyErr("limiter.deadline", "is %q: want answer_early (the default) or wait", c.Limiter.Deadline)
	}
	var se *limiter.SettingError
	lc := c.limiterConfig()
	if err := lc.ValidateFor(c.backendKind()); errors.As(err, &se) {
		return keyErr("limiter."+se.Setting, "%s", se.Problem)
	}
	if c.Limiter.DefaultMaxOutputTokens < 0 {
		return keyErr("limiter.default_max_output_tokens", "is %d: want 0 (the default, %d) or more", c.Limiter.DefaultMaxOutputTokens, lanehttp.DefaultMaxOutputTokens)
	}
	src, err := parseTenantFrom(c.Limiter.Fairness.TenantFrom)
	if err != nil {
		return keyErr("limiter.fairness.tenant_from", "%v", err)
	}
	c.tenantSource = src
	if len(c.Upstreams) == 0 {
		return keyErr("upstreams", "none configured: the proxy needs at least one {name, base_url}")
	}
	seen := map[string]bool{}
	for i, u := range c.Upstreams {
		k := fmt.Sprintf("upstreams[%d]", i)
		if !nameRE.MatchString(u.Name) {
			return keyErr(k+".name", "%q: want letters, digits, '.', '_' or '-'", u.Name)
		}
		if seen[u.Name] {
			return keyErr(k+".name", "%q is configured twice", u.Name)
		}
		seen[u.Name] = true
		p, err := url.Parse(u.BaseURL)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.RawQuery != "" || p.Fragment != "" {
			return keyErr(k+".base_url", "%q: want an http or https URL without a query, such as https://gw.example/v1", redact.String(u.BaseURL))
		}
		if p.User != nil {
			return keyErr(k+".base_url", "carries credentials: send them as the clients' Authorization header instead")
		}
		c.Upstreams[i].BaseURL = limiter.CanonicalBase(u.BaseURL) // as every lane key spells it
		if u.Capacity < 0 {
			return keyErr(k+".capacity", "is %d: want 0 (unknown) or more", u.Capacity)
		}
		if _, err := lanehttp.ParseHeaderSource(u.Headers); err != nil {
			return keyErr(k+".headers", "is %q: want gateway (the default), provider or ignore", u.Headers)
		}
		for j, m := range u.Models {
			if _, err := path.Match(m, ""); err != nil || m == "" {
				return keyErr(fmt.Sprintf("%s.models[%d]", k, j), "%q: want a model id or a glob such as protolabs/*", m)
			}
		}
	}
	if c.Metrics.Prefix == "" {
		c.Metrics.Prefix = telemetry.DefaultPrefix
	}
	if err := telemetry.ValidatePrefix(c.Metrics.Prefix); err != nil {
		return keyErr("metrics.prefix", "%v", err)
	}
	th := c.thresholds()
	if err := th.Validate(); err != nil {
		return keyErr("classification", "%v", err)
	}
	var sc *sharedlane.Config
	if c.Shared != nil {
		v := c.Shared.sharedlane()
		if err := v.Validate(); err != nil {
			return keyErr("shared", "%v", err)
		}
		sc = &v
	}
	names := map[string]bool{}
	for i, t := range c.Targets {
		k := fmt.Sprintf("targets[%d]", i)
		if !nameRE.MatchString(t.Name) || names[t.Name] {
			return keyErr(k+".name", "%q: want a unique name of letters, digits, '.', '_' or '-'", t.Name)
		}
		names[t.Name] = true
		if p, err := url.Parse(t.URL); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return keyErr(k+".url", "%q: want the http URL of a lane snapshot, such as http://127.0.0.1:8080/api/telemetry/llm-lanes", redact.String(t.URL))
		}
		if t.Interval < 0 {
			return keyErr(k+".interval", "is negative")
		}
		if t.Interval == 0 {
			c.Targets[i].Interval = Duration(DefaultTargetInterval)
		}
	}
	c.res = resolved{limiter: lc, thresholds: th, shared: sc}
	return nil
}

// resolved is a checked file turned into the library's configurations.
type resolved struct {
	limiter    limiter.Config
	thresholds classify.Thresholds
	shared     *sharedlane.Config // nil: no lane is shared
}

// backendKind is the kind of limiter.Backend the file asks for, for
// limiter.Config.ValidateFor: a nil *sharedlane.Backend with shared:, nil
// (none) without.
func (c *Config) backendKind() limiter.Backend {
	if c.Shared != nil {
		return (*sharedlane.Backend)(nil)
	}
	return nil
}

// limiterConfig returns the limiter settings, defaults applied.
func (c *Config) limiterConfig() limiter.Config {
	lc := limiter.DefaultConfig()
	lc.MaxInflight = c.Limiter.MaxInflight
	lc.MaxLanes, lc.LaneIdleTTL = c.Limits.MaxLanes, time.Duration(c.Limits.LaneIdleTTL)
	if c.Limiter.QueueTimeout != 0 { // 0: the default; a negative one is Validate's to refuse
		lc.QueueTimeout = time.Duration(c.Limiter.QueueTimeout)
	}
	if c.Limiter.InteractiveReserve != nil {
		lc.InteractiveReserve = *c.Limiter.InteractiveReserve
	}
	lc.Deadline, _ = limiter.ParseDeadlinePolicy(c.Limiter.Deadline) // checked
	lc.DeadlineMargin = time.Duration(c.Limiter.DeadlineMargin)
	if a := c.Limiter.Adaptive; a != nil {
		lc.Adaptive = &limiter.Adaptive{MinInflight: a.MinInflight, Initial: a.Initial}
	}
	lc.TokensPerMinute, lc.MaxInflightTokens = c.Limiter.TokensPerMinute, c.Limiter.MaxInflightTokens
	lc.ColdStart = c.Limiter.ColdStart
	lc.ProviderWindow = time.Duration(c.Limiter.ProviderWindow)
	f := c.Limiter.Fairness
	lc.Fairness = &limiter.Fairness{Weights: f.Weights, MaxInflightPerTenant: f.MaxInflightPerTenant, MaxTenants: c.Limits.MaxTenants}
	return lc
}

// thresholds returns the classification thresholds, defaults applied.
func (c *Config) thresholds() classify.Thresholds {
	th := classify.DefaultThresholds()
	if v := c.Classification.WaitP90; v != 0 {
		th.WaitP90 = time.Duration(v)
	}
	if v := c.Classification.UpstreamErrors; v != 0 {
		th.UpstreamErrors = v
	}
	if v := c.Classification.ErrorRatio; v != nil {
		th.ErrorRatio = *v
	}
	if v := c.Classification.Retries; v != 0 {
		th.Retries = v
	}
	th.ClearAfter = time.Duration(c.Classification.ClearAfter)
	return th
}

// checkBounds checks the proxy, limits and server sections, and fills in
// their defaults.
func (c *Config) checkBounds() error {
	for _, b := range []struct {
		key string
		v   *int64
		def int64
	}{
		{"proxy.max_body_bytes", &c.Proxy.MaxBodyBytes, DefaultMaxBodyBytes},
		{"limits.max_queued_bytes", &c.Limits.MaxQueuedBytes, DefaultMaxQueuedBytes},
		{"proxy.body_min_rate", &c.Proxy.BodyMinRate, DefaultBodyMinRate},
	} {
		if *b.v < 0 {
			return keyErr(b.key, "is %d: want 0 (the default, %d) or more", *b.v, b.def)
		}
		if *b.v == 0 {
			*b.v = b.def
		}
	}
	// A body of proxy.max_body_bytes holds up to bodyPeak of it while it
	// is read: a budget smaller than that would answer such a body a
	// retryable 503 every time, and it could never pass.
	peak := bodyPeak(c.Proxy.MaxBodyBytes)
	if c.Limits.MaxQueuedBytes < peak {
		return keyErr("limits.max_queued_bytes", "is %d: want at least %d, what one body of proxy.max_body_bytes (%d) holds while it is read (twice its size and 64 KiB), or a smaller max_body_bytes",
			c.Limits.MaxQueuedBytes, peak, c.Proxy.MaxBodyBytes)
	}
	// A connection's share: by default an eighth of the whole, so that
	// one client leaves the rest to others, but never less than one body
	// of the largest size allowed holds.
	switch share := &c.Limits.MaxConnectionQueuedBytes; {
	case *share < 0 || *share > c.Limits.MaxQueuedBytes:
		return keyErr("limits.max_connection_queued_bytes", "is %d: want 0 (the default) up to limits.max_queued_bytes (%d)", *share, c.Limits.MaxQueuedBytes)
	case *share == 0:
		*share = min(c.Limits.MaxQueuedBytes, max(c.Limits.MaxQueuedBytes/8, peak))
	case *share < peak:
		return keyErr("limits.max_connection_queued_bytes", "is %d: want at least %d, what one body of proxy.max_body_bytes (%d) holds while it is read (twice its size and 64 KiB), or a smaller max_body_bytes",
			*share, peak, c.Proxy.MaxBodyBytes)
	}
	for _, b := range []struct {
		key string
		v   *int
		def int
	}{
		{"limits.max_lanes", &c.Limits.MaxLanes, limiter.DefaultMaxLanes},
		{"limits.max_model_bytes", &c.Limits.MaxModelBytes, DefaultMaxModelBytes},
		{"limits.max_tenants", &c.Limits.MaxTenants, limiter.DefaultMaxTenants},
		{"limits.max_tenant_series", &c.Limits.MaxTenantSeries, otelbridge.DefaultMaxTenantSeries},
		{"server.max_header_bytes", &c.Server.MaxHeaderBytes, DefaultMaxHeaderBytes},
	} {
		if *b.v < 0 {
			return keyErr(b.key, "is %d: want 0 (the default, %d) or more", *b.v, b.def)
		}
		if *b.v == 0 {
			*b.v = b.def
		}
	}
	for _, b := range []struct {
		key string
		v   *Duration
		def time.Duration
	}{
		{"proxy.body_read_timeout", &c.Proxy.BodyReadTimeout, DefaultBodyReadTimeout},
		{"proxy.body_min_rate_grace", &c.Proxy.BodyMinRateGrace, DefaultBodyMinRateGrace},
		{"proxy.dial_timeout", &c.Proxy.DialTimeout, DefaultDialTimeout},
		{"proxy.tls_handshake_timeout", &c.Proxy.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout},
		{"proxy.response_header_timeout", &c.Proxy.ResponseHeaderTimeout, DefaultResponseHeaderTimeout},
		{"proxy.stall_timeout", &c.Proxy.StallTimeout, DefaultStallTimeout},
		{"proxy.write_timeout", &c.Proxy.WriteTimeout, DefaultWriteTimeout},
		{"proxy.stream_keepalive_every", &c.Proxy.StreamKeepaliveEvery, DefaultStreamKeepaliveEvery},
		{"limits.lane_idle_ttl", &c.Limits.LaneIdleTTL, limiter.DefaultLaneIdleTTL},
		{"server.read_header_timeout", &c.Server.ReadHeaderTimeout, DefaultReadHeaderTimeout},
		{"server.idle_timeout", &c.Server.IdleTimeout, DefaultIdleTimeout},
	} {
		if *b.v < 0 {
			return keyErr(b.key, "is %s: want 0 (the default, %s) or more", time.Duration(*b.v), b.def)
		}
		if *b.v == 0 {
			*b.v = Duration(b.def)
		}
	}
	return nil
}
