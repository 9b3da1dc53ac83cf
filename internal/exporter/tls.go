package exporter

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v2"
)

// tlsSetup is the proxy address's TLS, from a web configuration file.
type tlsSetup struct{ config *tls.Config }

// readWebConfig reads a web configuration file as exporter-toolkit does:
// strictly (an unknown key is an error), with its defaults (TLS 1.2 to
// 1.3, HTTP/2 on), and paths relative to the file's directory.
func readWebConfig(path string) (*web.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &web.Config{
		TLSConfig:  web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13},
		HTTPConfig: web.HTTPConfig{HTTP2: true},
	}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, err
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	return c, nil
}

// readProxyTLS reads the proxy address's web configuration file: TLS only.
// Basic auth is refused (the proxy's clients send their model credentials
// in Authorization, which basic auth would take), and so are the headers
// and the rate limit, which are for the telemetry's address: a key that
// would be silently ignored is an error instead.
func readProxyTLS(path string) (*tlsSetup, error) {
	c, err := readWebConfig(path)
	if err != nil {
		return nil, fmt.Errorf("web config %s: %w", path, err)
	}
	switch {
	case len(c.Users) > 0:
		return nil, fmt.Errorf("web config %s: basic_auth_users: the proxy's address takes no basic auth, since its clients send their model credentials in Authorization; give the telemetry its own address (--web.listen-address) and put basic auth in its web config", path)
	case len(c.HTTPConfig.Header) > 0 || c.RateLimiterConfig.Interval != 0:
		return nil, fmt.Errorf("web config %s: http_server_config.headers and rate_limit apply to the telemetry's own address only; the proxy's address takes tls_server_config", path)
	case !c.TLSConfig.IsEnabled():
		return nil, fmt.Errorf("web config %s: no tls_server_config: the proxy's web config is for TLS", path)
	}
	if _, err := web.ConfigToTLSConfig(&c.TLSConfig); err != nil {
		return nil, fmt.Errorf("web config %s: %w", path, err)
	}
	protos := []string{"h2", "http/1.1"}
	if !c.HTTPConfig.HTTP2 {
		protos = protos[1:]
	}
	// Read again for each connection, so that a renewed certificate is
	// used without a restart; a file broken since start fails the
	// handshakes (and says why in the log), not the connections in progress.
	config := &tls.Config{NextProtos: protos, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := readWebConfig(path)
		if err != nil {
			return nil, err
		}
		tc, err := web.ConfigToTLSConfig(&c.TLSConfig)
		if err != nil {
			return nil, err
		}
		tc.NextProtos = protos
		return tc, nil
	}}
	return &tlsSetup{config: config}, nil
}
