package lanehttp

// The error codes: every answer that a Transport, or lanes-exporter, gives
// in place of the gateway's carries one of these as the "code" of its
// OpenAI-style body ({"error": {"message", "type", "code", ...}}), so that
// a client can branch on it. This is the one table of them; the status of
// each is beside it.
const (
	// Sent by a Transport (and so by lanes-exporter), for a call that got
	// no slot or could not be read:

	// QueueTimeoutCode: 503, the call waited the whole queue timeout;
	// x-should-retry: false, Retry-After the estimated wait.
	QueueTimeoutCode = "lane_queue_timeout"
	// LaneLimitCode: 503, the call's lane does not exist and max_lanes
	// lanes do; x-should-retry: false.
	LaneLimitCode = "lane_limit_reached"
	// ShuttingDownCode: 503, the process is shutting down; retryable, to
	// another instance.
	ShuttingDownCode = "lane_shutting_down"
	// LaneUnavailableCode: 503, the lane is shared and its store is
	// unreachable, with the backend set to refuse calls then; retryable.
	LaneUnavailableCode = "lane_unavailable"
	// TokenBudgetCode: 413, the call's token estimate is larger than a
	// whole token budget of its lane (it could never be granted); the
	// message names the budget. x-should-retry: false.
	TokenBudgetCode = "token_budget_exceeded"
	// RequestTooLargeCode: 413, the body is over the limit.
	RequestTooLargeCode = "request_too_large"
	// InvalidJSONCode: 400, the body is not a JSON object.
	InvalidJSONCode = "invalid_json"
	// MissingModelCode: 400, the body names no model.
	MissingModelCode = "missing_model"

	// Sent by lanes-exporter's proxy:

	// UnknownUpstreamCode: 404, no upstream of that name is configured.
	UnknownUpstreamCode = "unknown_upstream"
	// InvalidPathCode: 400, the path has . or .. segments.
	InvalidPathCode = "invalid_path"
	// InvalidPriorityCode: 400, X-LLM-Priority names no class.
	InvalidPriorityCode = "invalid_priority"
	// InvalidTenantCode: 400, X-LLM-Tenant (or the header tenant_from
	// names) is not 1 to 64 bytes of A-Z a-z 0-9 . _ : -.
	InvalidTenantCode = "invalid_tenant"
	// InvalidBodyCode: 400, the body could not be read (malformed, cut
	// short).
	InvalidBodyCode = "invalid_body"
	// BodyReadTimeoutCode: 408, the body did not arrive within
	// proxy.body_read_timeout.
	BodyReadTimeoutCode = "body_read_timeout"
	// QueuedBytesLimitCode: 503, the bodies of the calls in progress take
	// limits.max_queued_bytes; Retry-After 1.
	QueuedBytesLimitCode = "queued_bytes_limit"
	// ModelTooLongCode: 400, the model id is over limits.max_model_bytes.
	ModelTooLongCode = "model_too_long"
	// InvalidModelCode: 400, the model id has a character no model id needs.
	InvalidModelCode = "invalid_model"
	// ModelNotAllowedCode: 403, the model is not in the upstream's models.
	ModelNotAllowedCode = "model_not_allowed"
	// UpstreamStallCode: 504, the gateway sent no headers or no body within
	// the proxy's timeouts.
	UpstreamStallCode = "upstream_stall"
	// UpstreamUnreachableCode: 502, the gateway could not be reached.
	UpstreamUnreachableCode = "upstream_unreachable"

	// Sent by lanes-exporter's lifecycle route, POST /-/reload:

	// MethodNotAllowedCode: 405, a method other than POST.
	MethodNotAllowedCode = "method_not_allowed"
	// LifecycleDisabledCode: 403, started without --web.enable-lifecycle.
	LifecycleDisabledCode = "lifecycle_disabled"
	// CrossOriginCode: 403, a request from a web page (with an Origin).
	CrossOriginCode = "cross_origin"
	// UnsupportedMediaTypeCode: 415, a body that is not JSON.
	UnsupportedMediaTypeCode = "unsupported_media_type"
	// ReloadRefusedCode: 400, the new configuration is refused; the old one
	// stays.
	ReloadRefusedCode = "reload_refused"

	// Sent by lanes-exporter's read-only routes:

	// InvalidQueryCode: 400, a query parameter that does not parse (the
	// history route's since).
	InvalidQueryCode = "invalid_query"
)
