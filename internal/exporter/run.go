package exporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Listener is a running exporter: its HTTP server and address.
type Listener struct {
	Server *Server
	Addr   string // the address actually listened on
	http   *http.Server
	done   chan error
}

// Start listens on addr (":0" picks a port) and serves s.
func Start(s *Server, addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	sc := s.cfg.Load().Server // read at start, like listen
	// HTTP/2 without TLS (h2c, prior knowledge) beside HTTP/1.1: a client
	// that queues many calls then sends them as streams of one connection,
	// each costing the proxy a goroutine, not a connection with its own
	// goroutines and buffers.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	l := &Listener{Server: s, Addr: ln.Addr().String(), done: make(chan error, 1),
		http: &http.Server{Handler: s.Handler(),
			Protocols:         protocols,
			ConnContext:       withConnState,
			ReadHeaderTimeout: time.Duration(sc.ReadHeaderTimeout),
			IdleTimeout:       time.Duration(sc.IdleTimeout),
			MaxHeaderBytes:    sc.MaxHeaderBytes,
			ErrorLog:          slogLogger(s.log)}}
	go func() { l.done <- l.http.Serve(ln) }()
	return l, nil
}

// Shutdown shuts the exporter down: readiness turns false and every call
// waiting for a slot is answered at once with 503 lane_shutting_down (as is
// every call that still arrives: none reaches the gateway); the server
// stops accepting connections; calls holding a slot (streams included) may
// finish until ctx ends; then what is left is closed.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.Server.Stop()
	err := l.http.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		l.Server.log.Warn("shutdown deadline passed; closing the remaining connections")
		err = l.http.Close()
	}
	if serr := <-l.done; !errors.Is(serr, http.ErrServerClosed) && serr != nil {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, l.Server.Shutdown(context.Background()))
}
