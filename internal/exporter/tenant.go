package exporter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/llmlanes/llmlanes/limiter"
)

// TenantHeader carries a proxied call's tenant; it is stripped before
// forwarding.
const TenantHeader = "X-LLM-Tenant"

// tenantSource is where a call's tenant comes from (limiter.fairness.tenant_from).
type tenantSource struct {
	credential bool
	header     string // TenantHeader by default
}

// parseTenantFrom parses tenant_from: "" or "header", "credential", or
// "header:NAME".
func parseTenantFrom(s string) (tenantSource, error) {
	switch {
	case s == "" || s == "header":
		return tenantSource{header: TenantHeader}, nil
	case s == "credential":
		return tenantSource{credential: true}, nil
	case strings.HasPrefix(s, "header:"):
		name := strings.TrimPrefix(s, "header:")
		if !httpguts.ValidHeaderFieldName(name) {
			return tenantSource{}, fmt.Errorf("is %q: %q is not a header name", s, name)
		}
		return tenantSource{header: name}, nil
	}
	return tenantSource{}, fmt.Errorf("is %q: want header (X-LLM-Tenant), credential or header:NAME", s)
}

// tenantOf returns the tenant of r under src: "" when it names none, or
// an error for a header whose value is not a tenant name. A credential
// becomes "cred:" and the first 12 hex digits of its SHA-256, so that the
// tenant (a metric label) never shows the secret.
func (src tenantSource) tenantOf(r *http.Request) (string, error) {
	if src.credential {
		c := r.Header.Get("Authorization")
		if c == "" {
			c = r.Header.Get("X-Api-Key")
		}
		if c == "" {
			return "", nil
		}
		sum := sha256.Sum256([]byte(c))
		return "cred:" + hex.EncodeToString(sum[:6]), nil
	}
	h := src.header
	if h == "" { // the zero tenantSource: the default, X-LLM-Tenant
		h = TenantHeader
	}
	v := r.Header.Get(h)
	if v == "" {
		return "", nil
	}
	if err := limiter.ValidTenant(v); err != nil {
		return "", fmt.Errorf("%s: %s", h, strings.TrimPrefix(err.Error(), "limiter: "))
	}
	return v, nil
}
