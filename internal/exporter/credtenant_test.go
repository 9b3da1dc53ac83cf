package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
	"github.com/llmlanes/llmlanes/limiter"
)

// A tenant taken from a header that carries a credential is always a hash
// of it, never its value: with tenant_from naming Authorization, api-key,
// x-api-key, Proxy-Authorization or Cookie (in any case), and in
// credential mode. Credential mode reads the credential the upstream
// authenticates (x-api-key, then Azure's api-key, then Authorization),
// with the scheme's case ignored: junk Authorization values beside one
// x-api-key are one tenant, "Bearer" and "bearer" one tenant, Azure's
// api-key a tenant rather than default. No secret reaches the snapshot,
// the classification, /metrics or the log. Real HTTP through the proxy.
func TestTenantCredentialsNeverShown(t *testing.T) {
	g, base := newSayingGateway(t)
	type call map[string]string
	for _, c := range []struct {
		from    string
		calls   []call
		tenants int // distinct tenants the calls make
	}{
		{"header:api-key", []call{{"api-key": "sk-azure-SECRET-1"}}, 1},
		{"header:Authorization", []call{{"Authorization": "Bearer sk-SECRET-2"}, {"Authorization": "bearer sk-SECRET-2"}}, 1},
		{"header:x-api-key", []call{{"X-Api-Key": "sk-ant-SECRET-3"}}, 1},
		{"header:cookie", []call{{"Cookie": "session=SECRET-4"}}, 1},
		{"header:Proxy-Authorization", []call{{"Proxy-Authorization": "Basic U0VDUkVULTU="}}, 1},
		{"credential", []call{
			{"Authorization": "Bearer junk-SECRET-6a", "X-Api-Key": "sk-ant-SECRET-6"},
			{"Authorization": "Bearer junk-SECRET-6b", "X-Api-Key": "sk-ant-SECRET-6"},
			{"Authorization": "Bearer junk-SECRET-6c", "X-Api-Key": "sk-ant-SECRET-6"},
		}, 1},
		{"credential", []call{{"Authorization": "Bearer sk-SECRET-7"}, {"Authorization": "BEARER  sk-SECRET-7"}}, 1},
		{"credential", []call{{"Api-Key": "azure-SECRET-8"}}, 1},
	} {
		t.Run(c.from, func(t *testing.T) {
			var logs logbuf.Buffer
			srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 2, fairness: {tenant_from: %q}}\nupstreams:\n  - {name: gw, base_url: %s}\n", c.from, base),
				Options{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			t.Cleanup(func() { srv.Shutdown(context.Background()) })
			front := httptest.NewServer(srv.Handler())
			t.Cleanup(front.Close)
			for _, h := range c.calls {
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(chatBody("abcd", 10)))
				for k, v := range h {
					req.Header.Set(k, v)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("%v: %s", h, res.Status)
				}
			}
			var names []string
			for _, tn := range srv.Limiter().Snapshot().Lanes[0].Tenants {
				if tn.Tenant != limiter.DefaultTenant && !slices.Contains(names, tn.Tenant) {
					names = append(names, tn.Tenant)
				}
			}
			if len(names) != c.tenants || !strings.HasPrefix(names[0], "cred:") || len(names[0]) != len("cred:")+12 {
				t.Fatalf("tenants %q, want %d of the form cred:<12 hex digits>", names, c.tenants)
			}
			_, snap := get(t, front.URL+"/api/telemetry/llm-lanes")
			_, cls := get(t, front.URL+"/api/telemetry/llm-lanes/classification")
			_, metrics := get(t, front.URL+"/metrics")
			_, status := get(t, front.URL+"/")
			if !strings.Contains(metrics, `tenant="`+names[0]+`"`) {
				t.Fatalf("no series of tenant %s in /metrics", names[0])
			}
			for where, text := range map[string]string{"snapshot": snap, "classification": cls, "metrics": metrics, "status page": status, "log": logs.String()} {
				if strings.Contains(text, "SECRET") {
					t.Fatalf("a secret in the %s:\n%s", where, grepLines(text, "SECRET"))
				}
			}
		})
	}
	if g.received.Load() == 0 {
		t.Fatal("the gateway received nothing")
	}
}

// X-LLM-Tenant given twice, or naming a reserved tenant (default, other),
// is a 400 that never reaches the gateway, whatever the order; an invalid
// value is refused without being quoted back.
func TestTenantHeaderAmbiguous(t *testing.T) {
	g, base := newSayingGateway(t)
	front, _, _ := newFront(t, fmt.Sprintf("limiter: {max_inflight: 2}\nupstreams:\n  - {name: gw, base_url: %s}\n", base), false)
	for _, values := range [][]string{{"good", "b@d"}, {"b@d", "good"}, {"good", "good"}, {"default"}, {"other"}, {"b@d-SECRET"}} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(chatBody("abcd", 10)))
		for _, v := range values {
			req.Header.Add(TenantHeader, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4096)
		n, _ := res.Body.Read(b)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b[:n]), "invalid_tenant") || strings.Contains(string(b[:n]), "SECRET") {
			t.Fatalf("X-LLM-Tenant %q: %s %s, want a 400 invalid_tenant that quotes no value", values, res.Status, b[:n])
		}
	}
	if n := g.received.Load(); n != 0 {
		t.Fatalf("the gateway received %d calls, want none", n)
	}
}
