package exporter

import (
	"fmt"
	"log"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"
)

// serveReload reloads the configuration file: only when the process was
// started with --web.enable-lifecycle (as Prometheus does), and never for a
// request a browser page could send on its own (one with an Origin header,
// or a "simple" content type that needs no CORS preflight), so that no web
// page a local user opens can reload the exporter.
func (s *Server) serveReload(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, methodNotAllowedCode, "POST /-/reload reloads the configuration file")
		return
	case !s.lifecycle:
		writeError(w, lifecycleDisabledCode, "reloading over HTTP is off: start lanes-exporter with --web.enable-lifecycle, or send it SIGHUP")
		return
	case r.Header.Get("Origin") != "":
		writeError(w, crossOriginCode, "reload requests from web pages (with an Origin header) are refused")
		return
	case simpleContentType(r.Header.Get("Content-Type")):
		writeError(w, unsupportedMediaTypeCode, "send no body, or Content-Type: application/json")
		return
	}
	if err := s.Reload(); err != nil {
		writeError(w, reloadRefusedCode, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, `{"status":"reloaded"}`)
}

// simpleContentType reports whether ct is one a browser sends cross-origin
// without a preflight.
func simpleContentType(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return true // unparsable: refuse
	}
	switch mt {
	case "application/x-www-form-urlencoded", "multipart/form-data", "text/plain":
		return true
	}
	return false
}

// serveHealthy answers while the process runs (liveness).
func (s *Server) serveHealthy(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "lanes-exporter is healthy")
}

// serveReady answers 200 while the exporter takes calls, and 503 once
// shutdown has begun (readiness: a load balancer stops sending calls).
func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "lanes-exporter is shutting down")
		return
	}
	fmt.Fprintln(w, "lanes-exporter is ready")
}

// slogLogger sends what net/http logs (a reverse proxy's errors, a
// server's) through log, at warning level, at most logBurst lines at once
// and one a second after that (see limitedLog).
func slogLogger(l *slog.Logger) *log.Logger {
	return log.New(newLimitedLog(l, time.Now), "", 0)
}

func newLimitedLog(l *slog.Logger, now func() time.Time) *limitedLog {
	return &limitedLog{log: l, now: now, tokens: logBurst, at: now()}
}

// logBurst is how many of net/http's lines pass at once before the rate
// of one a second applies.
const logBurst = 20

// limitedLog writes net/http's log lines to a slog logger at warning
// level, no faster than a token bucket of logBurst refilled one a second:
// a client that floods the server with bad frames (an HTTP/2 client can
// make it log a line a frame) must not flood the log, nor fill a disk.
// The first line let through after some were dropped says how many.
type limitedLog struct {
	log     *slog.Logger
	now     func() time.Time
	mu      sync.Mutex
	tokens  float64
	at      time.Time // of the last refill
	dropped int
}

func (w *limitedLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	now := w.now()
	w.tokens = min(logBurst, w.tokens+now.Sub(w.at).Seconds())
	w.at = now
	if w.tokens < 1 {
		w.dropped++
		w.mu.Unlock()
		return len(p), nil
	}
	w.tokens--
	dropped := w.dropped
	w.dropped = 0
	w.mu.Unlock()
	if dropped > 0 {
		w.log.Warn(strings.TrimSpace(string(p)), "dropped_before", dropped)
	} else {
		w.log.Warn(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}
