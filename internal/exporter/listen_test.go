package exporter

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"golang.org/x/crypto/bcrypt"

	"github.com/llmlanes/llmlanes/internal/tools/tlstest"
)

// authGateway is a gateway that records the Authorization of each call.
type authGateway struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string
}

func newAuthGateway(t *testing.T) *authGateway {
	g := &authGateway{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		g.mu.Lock()
		g.auth = append(g.auth, r.Header.Get("Authorization"))
		g.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}]}`)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *authGateway) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.auth...)
}

// listenTest builds an exporter in front of gw and listens where a says.
func listenTest(t *testing.T, gw string, a Addresses) (*Listener, error) {
	t.Helper()
	cfg, err := ParseConfig("l.yaml", []byte(fmt.Sprintf("limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: %q}]\n", gw+"/v1")))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, a)
	if err != nil {
		srv.Shutdown(context.Background())
		return nil, err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l.Shutdown(ctx)
	})
	return l, nil
}

// webConfig writes an exporter-toolkit web config file.
func webConfig(t *testing.T, dir, name, body string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The telemetry on its own address, locked down by an exporter-toolkit web
// config (TLS and basic auth): /metrics without credentials is 401, with
// them 200, over TLS only; the proxy, on its own address, serves a model
// call from the real openai-go client with the client's Authorization
// untouched; neither address serves the other's routes, and both answer
// readiness.
func TestTelemetryListenerLockedDown(t *testing.T) {
	dir := t.TempDir()
	caFile, cert, key := tlstest.SelfSigned(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("scrape-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	web := webConfig(t, dir, "web.yml", fmt.Sprintf("tls_server_config: {cert_file: %s, key_file: %s}\nbasic_auth_users: {prometheus: %q}\n", cert, key, hash))
	gw := newAuthGateway(t)
	l, err := listenTest(t, gw.URL, Addresses{Proxy: "127.0.0.1:0", Telemetry: "127.0.0.1:0", TelemetryWebConfig: web})
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr == l.TelemetryAddr {
		t.Fatalf("one address, %s, for both", l.Addr)
	}
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlstest.Pool(t, caFile)}}}
	defer tlsClient.CloseIdleConnections()
	get := func(c *http.Client, url, user, pw string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	tel := "https://" + l.TelemetryAddr
	if code, _ := get(tlsClient, tel+"/metrics", "", ""); code != 401 {
		t.Fatalf("/metrics without credentials: %d", code)
	}
	if code, _ := get(tlsClient, tel+"/metrics", "prometheus", "wrong"); code != 401 {
		t.Fatalf("/metrics with a wrong password: %d", code)
	}
	if code, body := get(tlsClient, tel+"/metrics", "prometheus", "scrape-pw"); code != 200 || !strings.Contains(body, "llmlanes_build_info") {
		t.Fatalf("/metrics with credentials: %d %.200s", code, body)
	}
	if code, _ := get(http.DefaultClient, "http://"+l.TelemetryAddr+"/metrics", "prometheus", "scrape-pw"); code == 200 {
		t.Fatal("the telemetry answered without TLS")
	}

	// The proxy's address: a model call, its Authorization forwarded as
	// sent; no telemetry there.
	c := openai.NewClient(option.WithBaseURL("http://"+l.Addr+"/proxy/gw/"), option.WithAPIKey("sk-model-key"), option.WithMaxRetries(0))
	got, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || got.Choices[0].Message.Content != "hi" {
		t.Fatalf("a model call on the proxy's address: %v %+v", err, got)
	}
	if seen := gw.seen(); len(seen) != 1 || seen[0] != "Bearer sk-model-key" {
		t.Fatalf("the gateway saw Authorization %q, want the client's", seen)
	}
	for _, path := range []string{"/metrics", "/api/telemetry/llm-lanes", "/api/telemetry/llm-lanes/classification", "/api/telemetry/llm-lanes/budget", "/"} {
		if code, _ := get(http.DefaultClient, "http://"+l.Addr+path, "", ""); code != 404 {
			t.Errorf("the proxy's address serves %s: %d", path, code)
		}
	}
	if code, _ := get(tlsClient, tel+"/proxy/gw/chat/completions", "prometheus", "scrape-pw"); code != 404 && code != 405 {
		t.Errorf("the telemetry's address serves the proxy: %d", code)
	}
	if code, _ := get(http.DefaultClient, "http://"+l.Addr+"/-/ready", "", ""); code != 200 {
		t.Errorf("readiness on the proxy's address: %d", code)
	}
	if code, _ := get(tlsClient, tel+"/-/ready", "prometheus", "scrape-pw"); code != 200 {
		t.Errorf("readiness on the telemetry's address: %d", code)
	}
}

// The proxy's own address takes TLS from the same kind of file: a model
// call over HTTPS, HTTP/2 by ALPN, the client's Authorization untouched.
func TestProxyTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, cert, key := tlstest.SelfSigned(t, dir)
	web := webConfig(t, dir, "proxy-web.yml", fmt.Sprintf("tls_server_config: {cert_file: %s, key_file: %s}\n", cert, key))
	gw := newAuthGateway(t)
	l, err := listenTest(t, gw.URL, Addresses{Proxy: "127.0.0.1:0", ProxyWebConfig: web})
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlstest.Pool(t, caFile)}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "https://"+l.Addr+"/proxy/gw/chat/completions", strings.NewReader(`{"model":"m"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-over-tls")
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Proto != "HTTP/2.0" {
		t.Fatalf("a model call over TLS: %d %s", res.StatusCode, res.Proto)
	}
	if seen := gw.seen(); len(seen) != 1 || seen[0] != "Bearer sk-over-tls" {
		t.Fatalf("the gateway saw Authorization %q", seen)
	}
	// One address: the telemetry is there too, over the same TLS.
	res, err = (&http.Client{Transport: tr}).Get("https://" + l.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || l.TelemetryAddr != l.Addr {
		t.Fatalf("/metrics on the one address: %d (telemetry at %s)", res.StatusCode, l.TelemetryAddr)
	}
}

// A bad web config is refused at start, saying what is wrong, and nothing
// listens.
func TestBadWebConfigRefused(t *testing.T) {
	dir := t.TempDir()
	_, cert, key := tlstest.SelfSigned(t, dir)
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	gw := newAuthGateway(t)
	for _, tc := range []struct {
		name string
		a    func() Addresses
		want string
	}{
		{"a certificate that is not there", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", Telemetry: "127.0.0.1:0",
				TelemetryWebConfig: webConfig(t, dir, "a.yml", "tls_server_config: {cert_file: nope.pem, key_file: nope.key}\n")}
		}, "nope.pem"},
		{"an unknown key", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", Telemetry: "127.0.0.1:0", TelemetryWebConfig: webConfig(t, dir, "b.yml", "tls_server_confg: {}\n")}
		}, "field tls_server_confg not found"},
		{"a file that is not there", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", Telemetry: "127.0.0.1:0", TelemetryWebConfig: filepath.Join(dir, "missing.yml")}
		}, "missing.yml: no such file"},
		{"basic auth on the proxy's address", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", ProxyWebConfig: webConfig(t, dir, "c.yml",
				fmt.Sprintf("tls_server_config: {cert_file: %s, key_file: %s}\nbasic_auth_users: {u: %q}\n", cert, key, hash))}
		}, "the proxy's address takes no basic auth"},
		{"no TLS in the proxy's file", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", ProxyWebConfig: webConfig(t, dir, "d.yml", "http_server_config: {http2: true}\n")}
		}, "no tls_server_config"},
		{"a rate limit on the proxy's address", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", ProxyWebConfig: webConfig(t, dir, "e.yml",
				fmt.Sprintf("tls_server_config: {cert_file: %s, key_file: %s}\nrate_limit: {interval: 1s, burst: 1}\n", cert, key))}
		}, "apply to the telemetry's own address only"},
		{"a telemetry web config with one address", func() Addresses {
			return Addresses{Proxy: "127.0.0.1:0", TelemetryWebConfig: webConfig(t, dir, "f.yml", "{}\n")}
		}, "needs the telemetry's own address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := listenTest(t, gw.URL, tc.a())
			if err == nil {
				t.Fatalf("listening on %s", l.Addr)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("the error %q does not say %q", err, tc.want)
			}
		})
	}
}
