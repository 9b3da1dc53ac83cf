package exporter

import (
	"fmt"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/sharedlane"
	"github.com/llmlanes/llmlanes/telemetry"
)

// configKey is one key of the configuration file, as the reference in
// docs/LANES-EXPORTER.md lists it: its default (from the constants the
// defaults are applied from), what it does, and where it is explained.
// TestConfigReference keeps configKeys, Config's yaml keys and the doc in
// step.
type configKey struct {
	key, def, does, see string
}

const (
	seeLane     = "[DESIGN.md](DESIGN.md), \"Semantics of a lane\""
	seeDeadline = "[DESIGN.md](DESIGN.md), \"The caller's deadline\""
	seeTenants  = "[DESIGN.md](DESIGN.md), \"Tenants and fair shares\""
	seeTokens   = "[DESIGN.md](DESIGN.md), \"Token budgets\""
	seeGateway  = "[In front of LiteLLM](#in-front-of-litellm)"
	seeProxy    = "[The proxy, the bounds and the routes](#the-proxy-the-bounds-and-the-routes)"
	seeAdaptive = "[Adaptive limit](#adaptive-limit-opt-in)"
	seeShared   = "[Shared lanes](#shared-lanes-sharedlane-redis)"
	seeClassify = "[DESIGN.md](DESIGN.md), \"Classification\""
	seeReload   = "[Configuration, reload and shutdown](#configuration-reload-and-shutdown)"
)

// dur writes a default duration as the file would: 500ms, 300s, 1h.
func dur(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%gs", d.Seconds())
}

// size writes a default size in bytes, and in KiB or MiB.
func size(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d (%d MiB)", n, n>>20)
	}
	return fmt.Sprintf("%d (%d KiB)", n, n>>10)
}

var configKeys = []configKey{
	{"listen", DefaultListen, "where the proxy and the exporter listen (`--listen` overrides it); at restart only", seeReload},
	{"limiter.max_inflight", "0", "most calls one lane lets through at once; 0 turns the limiter off (calls pass straight through)", seeLane},
	{"limiter.queue_timeout", dur(limiter.DefaultQueueTimeout), "longest a call waits for a slot, then 503 `lane_queue_timeout`", seeLane},
	{"limiter.interactive_reserve", fmt.Sprint(limiter.DefaultConfig().InteractiveReserve), "slots only `interactive` calls may take (clamped to max_inflight − 1)", seeLane},
	{"limiter.deadline", limiter.AnswerEarly.String(), "`answer_early`: a queued call whose client's stated timeout its wait would pass is answered 503 `lane_deadline` now; `wait`: at the margin", seeDeadline},
	{"limiter.deadline_margin", dur(limiter.DefaultDeadlineMargin), "how long before the client's stated timeout a queued call is answered", seeDeadline},
	{"limiter.adaptive", "absent (off)", "present: max_inflight is the ceiling of a limit learned from the gateway", seeAdaptive},
	{"limiter.adaptive.min_inflight", "1", "the learned limit's floor", seeAdaptive},
	{"limiter.adaptive.initial", "0 (min_inflight)", "where the limit starts after the probe", seeAdaptive},
	{"limiter.fairness.tenant_from", "header", "a call's tenant: `header` (X-LLM-Tenant), `credential` (a short hash of its key) or `header:NAME`", seeTenants},
	{"limiter.fairness.weights", "{}", "a tenant's share of slot-time against a weight-1 tenant's", seeTenants},
	{"limiter.fairness.max_inflight_per_tenant", "0 (no cap)", "most slots one tenant holds at once in a lane", seeTenants},
	{"limiter.tokens_per_minute", "0 (none)", "each lane's token budget a minute (a token bucket)", seeTokens},
	{"limiter.max_inflight_tokens", "0 (none)", "most estimated tokens in flight at once in a lane", seeTokens},
	{"limiter.default_max_output_tokens", fmt.Sprint(lanehttp.DefaultMaxOutputTokens), "the output bound of a call that names none, for its estimate", seeTokens},
	{"limiter.cold_start", "false", "a new lane sends one call until the first answer's headers; not with `shared`", seeTokens},
	{"limiter.provider_window", dur(limiter.DefaultProviderWindow), "the window the provider refills its announced budgets over; no header binds longer", seeGateway},
	{"upstreams[].name", "required", "the upstream's name in `/proxy/<name>/`", seeProxy},
	{"upstreams[].base_url", "required", "where `/proxy/<name>/<rest>` goes (`<base_url>/<rest>`); no other host is reachable", seeProxy},
	{"upstreams[].capacity", "0 (unknown)", "the gateway's real parallel capacity, shown beside the lanes' limits", seeProxy},
	{"upstreams[].models", "[] (any)", "the only models a call may name (ids or globs); others 403 `model_not_allowed`", seeProxy},
	{"upstreams[].provider", "openai (anthropic for `/messages`)", "the GenAI provider its spans and GenAI metrics name", "[OBSERVABILITY.md](OBSERVABILITY.md)"},
	{"upstreams[].cancel_propagates", "false", "whether the upstream stops a call's work when its client goes; false: the slot is held until the answer ends", seeGateway},
	{"upstreams[].headers", "gateway", "whose rate-limit headers it sends: `gateway`, `provider` or `ignore`", seeGateway},
	{"metrics.prefix", telemetry.DefaultPrefix, "the metric names' prefix; at restart only", "[OBSERVABILITY.md](OBSERVABILITY.md)"},
	{"proxy.max_body_bytes", size(DefaultMaxBodyBytes), "a larger request body gets a 413", seeProxy},
	{"proxy.body_read_timeout", dur(DefaultBodyReadTimeout), "a body still arriving after this gets a 408", seeProxy},
	{"proxy.body_min_rate", fmt.Sprint(DefaultBodyMinRate), "bytes a second: a body arriving slower on average, after the grace, gets a 408", seeProxy},
	{"proxy.body_min_rate_grace", dur(DefaultBodyMinRateGrace), "how long a body may arrive slower than body_min_rate", seeProxy},
	{"proxy.dial_timeout", dur(DefaultDialTimeout), "connecting to the gateway; at restart only", seeProxy},
	{"proxy.tls_handshake_timeout", dur(DefaultTLSHandshakeTimeout), "the gateway's TLS handshake; at restart only", seeProxy},
	{"proxy.response_header_timeout", dur(DefaultResponseHeaderTimeout), "from the slot to the answer's headers, then 504 `upstream_stall`", seeProxy},
	{"proxy.stall_timeout", dur(DefaultStallTimeout), "to the first body byte and between chunks, then 504 `upstream_stall`", seeProxy},
	{"proxy.server_timing", "true", "adds `Server-Timing` (queue wait, time to the upstream's headers) to every answer", seeProxy},
	{"proxy.write_timeout", dur(DefaultWriteTimeout), "a client that reads nothing of its answer this long is cut", seeProxy},
	{"proxy.stream_keepalive", "true", "a streamed call queued longer than stream_keepalive_every is committed and kept alive with SSE comments", seeDeadline},
	{"proxy.stream_keepalive_every", dur(DefaultStreamKeepaliveEvery), "the keep-alive period (half the client's read timeout if shorter)", seeDeadline},
	{"limits.max_lanes", fmt.Sprint(limiter.DefaultMaxLanes), "a call that would make one more lane gets a 503 `lane_limit_reached`", seeProxy},
	{"limits.lane_idle_ttl", dur(limiter.DefaultLaneIdleTTL), "a lane with no call this long is forgotten, with its metrics", seeProxy},
	{"limits.max_queued_bytes", size(DefaultMaxQueuedBytes), "request bodies held by calls in progress, all together; past it 503 `queued_bytes_limit`", seeProxy},
	{"limits.max_connection_queued_bytes", "max_queued_bytes / 8, at least one body's peak", "what one connection's calls hold together", seeProxy},
	{"limits.max_model_bytes", fmt.Sprint(DefaultMaxModelBytes), "a longer model id gets a 400 `model_too_long`", seeProxy},
	{"limits.max_tenants", fmt.Sprint(limiter.DefaultMaxTenants), "tenants a lane tracks by name; any more share `other`", seeTenants},
	{"limits.max_tenant_series", fmt.Sprint(otelbridge.DefaultMaxTenantSeries), "(lane, tenant) series of the tenant metrics, all lanes; past it `other`", "[OBSERVABILITY.md](OBSERVABILITY.md)"},
	{"server.read_header_timeout", dur(DefaultReadHeaderTimeout), "a client's request headers must arrive within this; at restart only", seeProxy},
	{"server.idle_timeout", dur(DefaultIdleTimeout), "an idle keep-alive connection is closed after this; at restart only", seeProxy},
	{"server.max_header_bytes", size(DefaultMaxHeaderBytes), "the largest request headers; at restart only", seeProxy},
	{"classification.wait_p90", dur(classify.DefaultThresholds().WaitP90), "`local_queue` when the 5-minute p90 wait is above this", seeClassify},
	{"classification.upstream_errors", fmt.Sprint(classify.DefaultThresholds().UpstreamErrors), "`gateway_degraded` with this many 429/5xx/transport errors/stalls in 5 minutes…", seeClassify},
	{"classification.error_ratio", fmt.Sprint(classify.DefaultThresholds().ErrorRatio), "…that are at least this share of the exchanges", seeClassify},
	{"classification.retries", fmt.Sprint(classify.DefaultThresholds().Retries), "`gateway_degraded` with this many SDK retries in 5 minutes", seeClassify},
	{"classification.clear_after", "0s", "above 0: gateway reasons hold only while the last upstream error is this recent", "[INCIDENT-REPLAY.md](INCIDENT-REPLAY.md)"},
	{"targets[].name", "required", "another process's snapshot, re-exported and classified under this name", seeReload},
	{"targets[].url", "required", "its lane snapshot URL (`…/api/telemetry/llm-lanes`)", seeReload},
	{"targets[].interval", dur(DefaultTargetInterval), "how often it is read", seeReload},
	{"shared", "absent (lanes of this process's own)", "present: the lanes are kept in Redis, shared with every process naming the same Redis and prefix", seeShared},
	{"shared.redis_url", "required", "`redis://` or `rediss://`; Sentinel and Cluster by query", seeShared},
	{"shared.tls_ca_file", "\"\"", "`rediss://` with a private CA: its PEM certificates", seeShared},
	{"shared.key_prefix", sharedlane.DefaultKeyPrefix, "same prefix and same lane key: one lane", seeShared},
	{"shared.lease_ttl", dur(sharedlane.DefaultLeaseTTL), "a dead process's slots are free within this", seeShared},
	{"shared.on_redis_down", sharedlane.OnDownLocal, "`local`: lanes of this process's own of local_max_inflight; `closed`: 503", seeShared},
	{"shared.local_max_inflight", fmt.Sprint(sharedlane.DefaultLocalMaxInflight), "the limit of a local lane while Redis is down", seeShared},
	{"shared.process", "host:pid", "this process among a lane's holders", seeShared},
}

// configReference renders configKeys as the Markdown table of
// docs/LANES-EXPORTER.md.
func configReference() string {
	var b strings.Builder
	b.WriteString("| key | default | what it does | explained in |\n| --- | --- | --- | --- |\n")
	for _, k := range configKeys {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.key, k.def, k.does, k.see)
	}
	return b.String()
}
