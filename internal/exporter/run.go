package exporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
)

// Addresses says where a Server listens, and how.
//
// The proxy and the telemetry routes (metrics, the snapshot, the
// classification, the budget, the status page, reload) share one address by
// default. Telemetry gives the telemetry routes their own address, as
// HAProxy and Envoy keep their stats and admin port apart from the data
// port: the telemetry's can then be locked down (TLS, client certificates,
// basic auth) without touching the proxy's clients. Liveness and readiness
// (/-/healthy, /-/ready) are served on both, so that whatever stands in
// front of either can check it.
type Addresses struct {
	// Proxy is the proxy's address (":0" picks a port), and the
	// telemetry's too when Telemetry is "".
	Proxy string
	// ProxyWebConfig is a web configuration file of
	// prometheus/exporter-toolkit for the proxy's address: it takes
	// tls_server_config only (TLS and client certificates); basic_auth_users
	// is refused, since the proxy's clients send their model credentials in
	// Authorization. With one address, it is that address's.
	ProxyWebConfig string
	// Telemetry, when set, is the telemetry routes' own address.
	Telemetry string
	// TelemetryWebConfig is the same kind of file for Telemetry's address,
	// with all that exporter-toolkit takes: TLS, client certificates, basic
	// auth, headers, a rate limit. It needs Telemetry.
	TelemetryWebConfig string
}

// Listener is a running exporter: its HTTP servers and their addresses.
type Listener struct {
	Server        *Server
	Addr          string // the proxy's address, as actually listened on
	TelemetryAddr string // the telemetry's: Addr when they share one
	servers       []*http.Server
	done          chan error
}

// Start listens on addr (":0" picks a port) and serves s: the proxy and the
// telemetry on one address, without TLS.
func Start(s *Server, addr string) (*Listener, error) {
	return Listen(s, Addresses{Proxy: addr})
}

// Listen listens where a says and serves s. A web configuration file that
// is wrong (unreadable, an unknown key, a certificate that does not load,
// basic auth on the proxy's address) is an error here, before anything
// listens; once serving, certificates are read again for each new
// connection, so that renewed ones are picked up, as exporter-toolkit does.
func Listen(s *Server, a Addresses) (*Listener, error) {
	var proxyTLS *tlsSetup
	if a.ProxyWebConfig != "" {
		var err error
		if proxyTLS, err = readProxyTLS(a.ProxyWebConfig); err != nil {
			return nil, err
		}
	}
	if a.TelemetryWebConfig != "" {
		if a.Telemetry == "" {
			return nil, fmt.Errorf("a web config for the telemetry (%s) needs the telemetry's own address; with one address, the proxy's web config (TLS only) is that address's", a.TelemetryWebConfig)
		}
		if err := web.Validate(a.TelemetryWebConfig); err != nil {
			return nil, fmt.Errorf("web config %s: %w", a.TelemetryWebConfig, err)
		}
	}
	l := &Listener{Server: s}
	var lns []net.Listener
	listen := func(addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		lns = append(lns, ln)
		return ln, nil
	}
	handler := s.Handler()
	if a.Telemetry != "" {
		handler = s.proxyMux
	}
	pln, err := listen(a.Proxy)
	if err != nil {
		return nil, err
	}
	l.Addr, l.TelemetryAddr = pln.Addr().String(), pln.Addr().String()
	serves := []func() error{}
	proxy := s.httpServer(handler)
	l.servers = append(l.servers, proxy)
	if proxyTLS != nil {
		proxy.TLSConfig = proxyTLS.config
		serves = append(serves, func() error { return proxy.ServeTLS(pln, "", "") })
	} else {
		serves = append(serves, func() error { return proxy.Serve(pln) })
	}
	if a.Telemetry != "" {
		tln, err := listen(a.Telemetry)
		if err != nil {
			return nil, err
		}
		l.TelemetryAddr = tln.Addr().String()
		tel := s.httpServer(s.telemetryMux)
		l.servers = append(l.servers, tel)
		file := a.TelemetryWebConfig
		serves = append(serves, func() error {
			return web.Serve(tln, tel, &web.FlagConfig{WebConfigFile: &file}, s.log.With("listener", "telemetry"))
		})
	}
	l.done = make(chan error, len(serves))
	for _, serve := range serves {
		go func() { l.done <- serve() }()
	}
	return l, nil
}

// httpServer is an HTTP server of the exporter's, bounded by the server
// section (read at start, like the addresses).
func (s *Server) httpServer(h http.Handler) *http.Server {
	sc := s.cfg.Load().Server
	// HTTP/2 without TLS (h2c, prior knowledge) beside HTTP/1.1: a client
	// that queues many calls then sends them as streams of one connection,
	// each costing the proxy a goroutine, not a connection with its own
	// goroutines and buffers. With TLS, HTTP/2 is offered by ALPN.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h,
		Protocols:         protocols,
		ConnContext:       withConnState,
		ReadHeaderTimeout: time.Duration(sc.ReadHeaderTimeout),
		IdleTimeout:       time.Duration(sc.IdleTimeout),
		MaxHeaderBytes:    sc.MaxHeaderBytes,
		ErrorLog:          slogLogger(s.log)}
}

// Shutdown shuts the exporter down: readiness turns false and every call
// waiting for a slot is answered at once with 503 lane_shutting_down (as is
// every call that still arrives: none reaches the gateway); the servers
// stop accepting connections; calls holding a slot (streams included) may
// finish until ctx ends; then what is left is closed.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.Server.Stop()
	var err error
	for _, srv := range l.servers {
		serr := srv.Shutdown(ctx)
		if errors.Is(serr, context.DeadlineExceeded) || errors.Is(serr, context.Canceled) {
			l.Server.log.Warn("shutdown deadline passed; closing the remaining connections")
			serr = srv.Close()
		}
		err = errors.Join(err, serr)
	}
	for range l.servers {
		if serr := <-l.done; !errors.Is(serr, http.ErrServerClosed) && serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return errors.Join(err, l.Server.Shutdown(context.Background()))
}
