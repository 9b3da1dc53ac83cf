package sharedlane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/internal/redact"
	"github.com/llmlanes/llmlanes/limiter"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Config configures New. Zero fields take the documented defaults.
type Config struct {
	// URL names Redis: redis://[user:password@]host:port/db, rediss:// for
	// TLS; ?master_name=NAME (and &addr=host:port for more sentinels) for
	// Sentinel; ?addr=host:port (more seed nodes) or ?cluster=true for a
	// Cluster.
	URL string
	// TLSCAFile, with rediss://, is a PEM file of the certificates that
	// Redis' must chain to (a private CA); the system's roots otherwise.
	TLSCAFile string
	// KeyPrefix starts every key and the grant channel: processes with the
	// same prefix and lane key share the lane. Default "llmlanes".
	KeyPrefix string
	// LeaseTTL is how long a held slot or a queue place outlives its
	// process's last renewal. Default 15 s.
	LeaseTTL time.Duration
	// OnRedisDown is "local" (the default: lanes of this process's own, of
	// LocalMaxInflight slots) or "closed" (refuse calls).
	OnRedisDown string
	// LocalMaxInflight is the limit of the fallback lanes. Default 2.
	LocalMaxInflight int
	// Process names this process where the lane shows who holds its slots.
	// Default host:pid.
	Process string
	// AgingStep is how long a waiter waits before its class rises a step,
	// on Redis' clock. Default 60 s, as in an in-process lane; tests
	// shorten it.
	AgingStep time.Duration
	// PollEvery is how often a waiter checks its place in case a grant's
	// message was lost; each check also frees the slots of lapsed leases.
	// Default 1 s, or LeaseTTL/3 if that is shorter.
	PollEvery time.Duration
	// Log receives the changes of state (Redis down, back, a slot lost).
	// Default slog.Default().
	Log *slog.Logger
	// Clock, for tests only, replaces Redis' clock in the lanes' decisions
	// (arrivals, aging, grants, the tenants' slot-time, lease expiries),
	// and this process's in the queue timeouts of its waits: every process
	// sharing a lane must then use the same. nil: Redis' TIME and the
	// system's clock, as they must be in production, where hosts' clocks
	// differ.
	Clock limiter.Clock
}

// Defaults.
const (
	DefaultKeyPrefix        = "llmlanes"
	DefaultLeaseTTL         = 15 * time.Second
	DefaultLocalMaxInflight = 2
	DefaultAgingStep        = time.Minute
	DefaultPollEvery        = time.Second
)

// Fallback modes.
const (
	OnDownLocal  = "local"
	OnDownClosed = "closed"
)

func (c Config) withDefaults() Config {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.OnRedisDown == "" {
		c.OnRedisDown = OnDownLocal
	}
	if c.LocalMaxInflight == 0 {
		c.LocalMaxInflight = DefaultLocalMaxInflight
	}
	if c.Process == "" {
		host, _ := os.Hostname()
		c.Process = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.AgingStep == 0 {
		c.AgingStep = DefaultAgingStep
	}
	if c.PollEvery == 0 {
		c.PollEvery = min(DefaultPollEvery, c.LeaseTTL/3)
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}

// Validate reports the settings that are out of range. It checks the URL's
// form, not that Redis answers.
func (c Config) Validate() error {
	var errs []error
	if rdb, err := newClient(c.URL, c.TLSCAFile, 0); err != nil {
		errs = append(errs, err)
	} else {
		rdb.Close() // made only to check the URL; it has not connected
	}
	if c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < 300*time.Millisecond) {
		errs = append(errs, fmt.Errorf("lease_ttl is %s: want 300ms or more", c.LeaseTTL))
	}
	if c.OnRedisDown != "" && c.OnRedisDown != OnDownLocal && c.OnRedisDown != OnDownClosed {
		errs = append(errs, fmt.Errorf("on_redis_down is %q: want local or closed", c.OnRedisDown))
	}
	if c.LocalMaxInflight < 0 {
		errs = append(errs, fmt.Errorf("local_max_inflight is %d: want 1 or more", c.LocalMaxInflight))
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		errs = append(errs, fmt.Errorf("key_prefix %q: braces are reserved for the lanes' hash tags", c.KeyPrefix))
	}
	if c.Process != "" && strings.Contains(c.Process, "|") {
		errs = append(errs, fmt.Errorf("process %q: '|' is reserved", c.Process))
	}
	if c.AgingStep < 0 || c.PollEvery < 0 {
		errs = append(errs, errors.New("aging step and poll period: want 0 (the default) or more"))
	}
	return errors.Join(errs...)
}

// newClient makes the go-redis client that URL names: Sentinel with
// master_name, a Cluster with addr or cluster=true, else a single node;
// with rediss://, TLS verified against caFile's certificates if given (the
// system's otherwise). pool, if above 0, is its pool of connections (per
// node, for a Cluster) instead of the URL's. Its errors never repeat the
// URL's password.
func newClient(raw, caFile string, pool int) (redis.UniversalClient, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return nil, fmt.Errorf("redis_url %q: want redis://host:port or rediss://host:port", Redact(raw))
	}
	var roots *x509.CertPool
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_file: %w", err)
		}
		if roots = x509.NewCertPool(); !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca_file %s: no PEM certificate in it", caFile)
		}
	}
	withCA := func(c *tls.Config) {
		if c != nil && roots != nil {
			c.RootCAs = roots
		}
	}
	bad := func(err error) error { return fmt.Errorf("redis_url %q: %s", Redact(raw), redactErr(err, u)) }
	q := u.Query()
	switch {
	case q.Has("master_name"):
		o, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, bad(err)
		}
		withCA(o.TLSConfig)
		o.ContextTimeoutEnabled = true
		if pool > 0 {
			o.PoolSize = pool
		}
		return redis.NewFailoverClient(o), nil
	case q.Has("addr") || q.Get("cluster") == "true":
		q.Del("cluster")
		u.RawQuery = q.Encode()
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, bad(err)
		}
		withCA(o.TLSConfig)
		o.MaintNotificationsConfig = noMaint()
		o.ContextTimeoutEnabled = true
		if pool > 0 {
			o.PoolSize = pool
		}
		return redis.NewClusterClient(o), nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, bad(err)
	}
	withCA(o.TLSConfig)
	o.MaintNotificationsConfig = noMaint()
	o.ContextTimeoutEnabled = true // a deadline bounds a command's wait for Redis, not only its read timeout
	if pool > 0 {
		o.PoolSize = pool
	}
	return redis.NewClient(o), nil
}

// noMaint turns off go-redis' maintenance notifications (a Redis Cloud
// feature), whose background goroutines outlive a closed client.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// Redact returns raw with every secret it may hold hidden, for logs and
// errors: llmlanes' one rule for a URL (its user information and its query
// values replaced by REDACTED, its fragment dropped). A URL that does not
// parse is not shown at all: what could not be parsed cannot be redacted.
func Redact(raw string) string { return redact.String(raw) }

// secretKey reports whether a query parameter's value may be a secret.
func secretKey(k string) bool {
	k = strings.ToLower(k)
	for _, w := range []string{"pass", "secret", "token", "key"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// secrets returns the secrets of u that an error's text may repeat (its
// password, its fragment, the values of its secret-looking query
// parameters), for redactErr: words of the text that are no secret stay.
func secrets(u *url.URL) []string {
	var out []string
	if u == nil {
		return nil
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, p)
		}
	}
	if u.Fragment != "" {
		out = append(out, u.Fragment)
	}
	for k, vs := range u.Query() {
		if secretKey(k) {
			for _, v := range vs {
				if v != "" {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// redactErr returns err's text with u's secrets, and any that look like
// one, hidden.
func redactErr(err error, u *url.URL) string {
	s := err.Error()
	for _, p := range secrets(u) {
		s = strings.ReplaceAll(s, p, redact.Marker)
	}
	return redactSecrets(s)
}

// secretInText finds what looks like a secret in free text: the password
// of a URL's user information, and a password-like query parameter's
// value.
var secretInText = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s/]*@|((?i)[a-z_]*(?:pass|secret|token)[a-z_]*=)[^&\s"]*`)

// redactSecrets hides in s what looks like a secret (see secretInText).
func redactSecrets(s string) string {
	return secretInText.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, "://") {
			return m[:strings.LastIndexByte(m[:len(m)-1], ':')+1] + redact.Marker + "@"
		}
		return m[:strings.IndexByte(m, '=')+1] + redact.Marker
	})
}

// RedisLogsTo sends what go-redis logs on its own (a pool that cannot
// dial, a Sentinel's new master) through log, at warning level, with its
// secrets redacted as Redact does, instead of go-redis's unstructured lines
// on stderr. go-redis has one logger for the whole process, so this is for
// a program to call once, at start (lanes-exporter does); a library using
// this package leaves it alone.
func RedisLogsTo(log *slog.Logger) { redis.SetLogger(redisLog{log}) }

type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis: "+redactSecrets(fmt.Sprintf(format, v...)))
}
