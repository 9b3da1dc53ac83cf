package exporter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
)

// Credentials are forwarded to the upstream but never written to the log,
// even when the upstream fails and the proxy logs why.
func TestCredentialsNeverLogged(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String() + "/v1?api-key=sk-query-secret"
	l.Close()
	var logs logbuf.Buffer
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

// A Redis URL's secrets never show: for each form a URL comes in (a
// password in its user information, a Sentinel's ?password=, both, and a
// URL that does not parse), neither the startup log nor a refused
// reload (its log and its answer) holds the secret. (--check-config:
// cmd/lanes-exporter's TestCheckConfigRedactsRedisURLs.)
func TestRedisURLsRedacted(t *testing.T) {
	for i, u := range RedisURLForms {
		t.Run(fmt.Sprint("form ", i), func(t *testing.T) { // not the URL: it names the test's directory
			var logs logbuf.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			file := filepath.Join(t.TempDir(), "lanes.yaml")
			good := "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \"http://127.0.0.1:1/v1\"}]\n"
			yaml := good + fmt.Sprintf("shared: {redis_url: %q, lease_ttl: 1s}\n", u)
			os.WriteFile(file, []byte(yaml), 0o600)
			cfg, err := LoadConfig(file)
			if err != nil {
				// Refused at start: the error says so without the secret.
				if strings.Contains(err.Error(), "SECRET") {
					t.Fatalf("the start's error shows the secret: %v", err)
				}
				return
			}
			srv, err := New(cfg, Options{File: file, Log: log})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			// A refused reload: the same URL, and a bad lease.
			os.WriteFile(file, []byte(good+fmt.Sprintf("shared: {redis_url: %q, lease_ttl: -1s}\n", u)), 0o600)
			rerr := srv.Reload()
			if rerr == nil {
				t.Fatal("a bad lease_ttl was reloaded")
			}
			if strings.Contains(logs.String(), "SECRET") || strings.Contains(rerr.Error(), "SECRET") {
				t.Fatalf("a secret shows:\n%s\n%v", logs.String(), rerr)
			}
			if !strings.Contains(logs.String(), "lanes are shared in Redis") || !strings.Contains(logs.String(), "reload refused") {
				t.Fatalf("the log lacks the lines checked:\n%s", logs.String())
			}
		})
	}
	// The unparsable one is refused at start, naming the key.
	bad := RedisURLForms[len(RedisURLForms)-1]
	if _, err := ParseConfig("f.yaml", []byte("upstreams: [{name: gw, base_url: \"http://127.0.0.1:1/v1\"}]\nshared: {redis_url: "+strconv.Quote(bad)+"}\n")); err == nil || !strings.Contains(err.Error(), "shared") {
		t.Fatalf("an unparsable redis_url: %v", err)
	}
}

// RedisURLForms are the forms a Redis URL comes in, each holding a secret
// (SECRET...): the user information's password, a Sentinel's ?password=,
// the two together, and a URL that does not parse (last).
var RedisURLForms = []string{
	"redis://user:SECRET-1@127.0.0.1:1/0",
	"redis://127.0.0.1:1/0?master_name=lanes&password=SECRET-2",
	"redis://:SECRET-3@127.0.0.1:1/0?master_name=lanes&password=SECRET-4&addr=127.0.0.1:2",
	"redis://:Xy#SECRET-5@h:6379/0",
}
