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

// credentialHeaders are the request headers that carry a secret: a tenant
// taken from one of them (tenant_from: header:NAME) is always hashed
// (credentialTenant), never its value.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "X-Api-Key", "Api-Key", "Cookie"}

// upstreamCredentials are the headers tenant_from: credential reads, in
// this order, the first present: the credential the upstream authenticates.
// x-api-key (Anthropic) and api-key (Azure OpenAI) come before
// Authorization (OpenAI's Bearer), because a client that sends one of them
// is authenticated by it, and an Authorization beside it (junk, or the
// proxy's own) must not make a tenant of its own. Proxy-Authorization
// authenticates a proxy, not the upstream, and is not read.
var upstreamCredentials = []string{"X-Api-Key", "Api-Key", "Authorization"}

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
		name = http.CanonicalHeaderKey(name)
		for _, c := range credentialHeaders {
			if name == c {
				// A secret is never a tenant name: the header is read as a
				// credential, hashed.
				return tenantSource{credential: true, header: name}, nil
			}
		}
		return tenantSource{header: name}, nil
	}
	return tenantSource{}, fmt.Errorf("is %q: want header (X-LLM-Tenant), credential or header:NAME", s)
}

// Tenant names a client may not take: limiter.DefaultTenant is the calls
// that name none, limiter.OtherTenant those past limits.max_tenants.
var reservedTenants = []string{limiter.DefaultTenant, limiter.OtherTenant}

// tenantOf returns the tenant of r under src: "" when it names none, or
// an error for a header whose value is not a tenant name, is repeated, or
// is reserved. A credential becomes credentialTenant's hash, so that the
// tenant (a metric label, a snapshot key) never shows the secret; an error
// never quotes a header's value.
func (src tenantSource) tenantOf(r *http.Request) (string, error) {
	if src.credential {
		if src.header != "" {
			return credentialTenant(src.header, r.Header.Values(src.header)), nil
		}
		for _, h := range upstreamCredentials {
			if v := r.Header.Values(h); len(v) > 0 {
				return credentialTenant(h, v), nil
			}
		}
		return "", nil
	}
	h := src.header
	if h == "" { // the zero tenantSource: the default, X-LLM-Tenant
		h = TenantHeader
	}
	vs := r.Header.Values(h)
	switch {
	case len(vs) == 0 || vs[0] == "" && len(vs) == 1:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("%s: given %d times: want one tenant name", h, len(vs))
	}
	v := vs[0]
	if err := limiter.ValidTenant(v); err != nil {
		return "", fmt.Errorf("%s: a value of %d bytes: want 1 to %d bytes of A-Z a-z 0-9 . _ : -", h, len(v), limiter.MaxTenantLen)
	}
	for _, name := range reservedTenants {
		if v == name {
			return "", fmt.Errorf("%s: %q is reserved (the calls that name no tenant, or those past limits.max_tenants): choose another name", h, v)
		}
	}
	return v, nil
}

// credentialTenant is the tenant of a call whose credential, in header h,
// is values: "cred:" and the first 12 hex digits of the SHA-256 of the
// credential, normalized so that the same secret is the same tenant
// however it is written: an Authorization's scheme in any case ("Bearer",
// "bearer"), spaces around it. An empty credential is no tenant.
func credentialTenant(h string, values []string) string {
	v := strings.TrimSpace(strings.Join(values, ","))
	if v == "" {
		return ""
	}
	if h == "Authorization" || h == "Proxy-Authorization" {
		if scheme, rest, ok := strings.Cut(v, " "); ok {
			v = strings.ToLower(scheme) + " " + strings.TrimSpace(rest)
		}
	}
	sum := sha256.Sum256([]byte(v))
	return "cred:" + hex.EncodeToString(sum[:6])
}
