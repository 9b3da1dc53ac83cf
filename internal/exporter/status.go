package exporter

import (
	_ "embed"
	"net/http"
)

// statusPage is the status page at /: one self-contained HTML file (no
// CDN, no external fonts) that polls the classification and snapshot
// routes every two seconds.
//
//go:embed status.html
var statusPage []byte

func (s *Server) serveStatus(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
	w.Write(statusPage)
}
