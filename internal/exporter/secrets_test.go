package exporter

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Credentials are forwarded to the upstream but never written to the log,
// even when the upstream fails and the proxy logs why.
func TestCredentialsNeverLogged(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String() + "/v1?api-key=sk-query-secret"
	l.Close()
	var logs bytes.Buffer
	cfg, err := ParseConfig("s.yaml", []byte("limiter: {max_inflight: 2}\nupstreams: [{name: dead, base_url: \"http://"+strings.TrimPrefix(strings.Split(dead, "?")[0], "http://")+"\"}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	srv, err := New(cfg, Options{Base: base, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/dead/chat/completions?api-key=sk-query-secret", strings.NewReader(chat))
	req.Header.Set("Authorization", "Bearer sk-header-secret")
	req.Header.Set("X-Api-Key", "sk-anthropic-secret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "upstream_unreachable") {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if !strings.Contains(logs.String(), "upstream unreachable") {
		t.Fatalf("nothing logged: %q", logs.String())
	}
	for _, secret := range []string{"sk-header-secret", "sk-anthropic-secret", "sk-query-secret"} {
		if strings.Contains(logs.String(), secret) || strings.Contains(string(b), secret) {
			t.Fatalf("%s leaked: log %q body %s", secret, logs.String(), b)
		}
	}
	srv.Shutdown(t.Context())
}
