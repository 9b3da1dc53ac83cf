package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	l := &Listener{Server: s, Addr: ln.Addr().String(), done: make(chan error, 1),
		http: &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}}
	go func() { l.done <- l.http.Serve(ln) }()
	return l, nil
}

// Shutdown stops accepting connections, lets requests in progress (streams
// included) finish until ctx ends, then closes what is left.
func (l *Listener) Shutdown(ctx context.Context) error {
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
