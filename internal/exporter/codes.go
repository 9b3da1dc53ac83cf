package exporter

import (
	"net/http"
	"slices"

	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// The error codes only lanes-exporter's proxy and routes send; the calls'
// own (a queue timeout, a token budget, a stalled gateway) are package
// lanehttp's, and every answer of either kind is written from its table
// (writeError), so that a code's status and retry header are said once.
const (
	// Sent by the proxy, for a call it refuses before its lane:
	unknownUpstreamCode  = "unknown_upstream"
	upstreamPathCode     = "upstream_path_not_found"
	invalidPathCode      = "invalid_path"
	invalidPriorityCode  = "invalid_priority"
	invalidTenantCode    = "invalid_tenant"
	invalidBodyCode      = "invalid_body"
	bodyReadTimeoutCode  = "body_read_timeout"
	queuedBytesLimitCode = "queued_bytes_limit"
	modelTooLongCode     = "model_too_long"
	invalidModelCode     = "invalid_model"
	modelNotAllowedCode  = "model_not_allowed"

	// Sent by the lifecycle route, POST /-/reload:
	methodNotAllowedCode     = "method_not_allowed"
	lifecycleDisabledCode    = "lifecycle_disabled"
	crossOriginCode          = "cross_origin"
	unsupportedMediaTypeCode = "unsupported_media_type"
	reloadRefusedCode        = "reload_refused"

	// Sent by the read-only routes:
	invalidQueryCode = "invalid_query"
)

// codeTable is lanes-exporter's own codes; read only.
var codeTable = []lanehttp.Code{
	{Name: unknownUpstreamCode, Status: http.StatusNotFound, NoRetry: true, When: "no upstream of that name is configured"},
	{Name: upstreamPathCode, Status: http.StatusNotFound, NoRetry: true, When: "the upstream answered 404 to a path that repeats the end of its base_url (a client base URL of /proxy/<upstream>/v1/ in front of a base_url ending in /v1): the message says what was forwarded where"},
	{Name: invalidPathCode, Status: http.StatusBadRequest, NoRetry: true, When: "the path has . or .. segments"},
	{Name: invalidPriorityCode, Status: http.StatusBadRequest, NoRetry: true, When: "X-LLM-Priority names no class"},
	{Name: invalidTenantCode, Status: http.StatusBadRequest, NoRetry: true, When: "X-LLM-Tenant (or the header `tenant_from` names) is not 1 to 64 bytes of A-Z a-z 0-9 . _ : -"},
	{Name: invalidBodyCode, Status: http.StatusBadRequest, NoRetry: true, When: "the body could not be read (malformed, cut short)"},
	{Name: bodyReadTimeoutCode, Status: http.StatusRequestTimeout, When: "the body did not arrive within `proxy.body_read_timeout`"},
	{Name: queuedBytesLimitCode, Status: http.StatusServiceUnavailable, When: "the bodies of the calls in progress take `limits.max_queued_bytes`; Retry-After 1"},
	{Name: modelTooLongCode, Status: http.StatusBadRequest, NoRetry: true, When: "the model id is over `limits.max_model_bytes`"},
	{Name: invalidModelCode, Status: http.StatusBadRequest, NoRetry: true, When: "the model id has a character no model id needs"},
	{Name: modelNotAllowedCode, Status: http.StatusForbidden, NoRetry: true, When: "the model is not in the upstream's `models`"},
	{Name: methodNotAllowedCode, Status: http.StatusMethodNotAllowed, NoRetry: true, When: "POST /-/reload: another method"},
	{Name: lifecycleDisabledCode, Status: http.StatusForbidden, NoRetry: true, When: "POST /-/reload: started without --web.enable-lifecycle"},
	{Name: crossOriginCode, Status: http.StatusForbidden, NoRetry: true, When: "POST /-/reload: a request from a web page (with an Origin)"},
	{Name: unsupportedMediaTypeCode, Status: http.StatusUnsupportedMediaType, NoRetry: true, When: "POST /-/reload: a body that is not JSON"},
	{Name: reloadRefusedCode, Status: http.StatusBadRequest, NoRetry: true, When: "POST /-/reload: the new configuration is refused; the old one stays"},
	{Name: invalidQueryCode, Status: http.StatusBadRequest, NoRetry: true, When: "a query parameter that does not parse (the history route's `since`)"},
}

// Codes returns lanes-exporter's own table of error codes (a copy); the
// rest of the codes it sends are lanehttp.Codes.
func Codes() []lanehttp.Code { return slices.Clone(codeTable) }

// codeOf returns the code named name, in lanes-exporter's table or package
// lanehttp's; a name in neither is a mistake of this package's.
func codeOf(name string) lanehttp.Code {
	if i := slices.IndexFunc(codeTable, func(c lanehttp.Code) bool { return c.Name == name }); i >= 0 {
		return codeTable[i]
	}
	if c, ok := lanehttp.CodeOf(name); ok {
		return c
	}
	panic("exporter: no error code " + name)
}

// writeError answers w with the code named code and the message msg, with
// the status and retry header of its table.
func writeError(w http.ResponseWriter, code, msg string) {
	c := codeOf(code)
	c.Write(w, c.Body(msg))
}
