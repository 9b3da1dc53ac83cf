// Package dashboards generates the llmlanes Grafana dashboards with the
// Grafana Foundation SDK: "LLM lanes — overview" and "LLM lane — detail",
// for any metric prefix. `go run ./dashboards/gen` writes them as JSON under
// dashboards/generated/<prefix>/; a test fails when the committed JSON is
// stale.
package dashboards

import (
	"encoding/json"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Prefixes are the metric prefixes whose dashboards are generated and
// committed.
var Prefixes = []string{"llmlanes", "protoagent"}

var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// qb builds a dashboard's queries: in an expression, P_ stands for the
// metric prefix and SEL for the job, instance and lane selector.
type qb struct{ prefix, sel string }

func (b qb) expr(e string) string {
	return strings.NewReplacer("P_", b.prefix+"_", "SEL", b.sel).Replace(e)
}

func (b qb) q(e, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(ds).Expr(b.expr(e)).LegendFormat(legend).Range()
}

func (b qb) instant(e, ref string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(ds).Expr(b.expr(e)).Instant().Format(prometheus.PromQueryFormatTable).RefId(ref)
}

func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

func step(v *float64, color string) dashboard.Threshold {
	return dashboard.Threshold{Value: v, Color: color}
}

// series is a time series panel: every one has a description and a unit.
func series(title, desc, unit string, w, h uint32, targets ...cog.Builder[variants.Dataquery]) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit(unit).Span(w).Height(h).FillOpacity(10).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))
	for _, t := range targets {
		p = p.WithTarget(t)
	}
	return p
}

// statPanel is a stat panel that shows the name of each series that is 1.
func statPanel(title, desc string, w, h uint32, target cog.Builder[variants.Dataquery]) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit("none").Span(w).Height(h).
		WithTarget(target).TextMode(common.BigValueTextModeName).Orientation(common.VizOrientationAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false))
}

// tablePanel is an instant-query table.
func tablePanel(title, desc string, w, h uint32) *table.PanelBuilder {
	return table.NewPanelBuilder().Title(title).Description(desc).Datasource(ds).Unit("none").Span(w).Height(h).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{}))
}

func variables(prefix string, multiLane bool) []cog.Builder[dashboard.VariableModel] {
	query := func(name, label, q string) *dashboard.QueryVariableBuilder {
		return dashboard.NewQueryVariableBuilder(name).Label(label).Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc)
	}
	// "All" matches any value (.+), not a list of every value Grafana has
	// seen, which goes stale and grows with the lanes.
	lane := query("lane", "Lane", "label_values("+prefix+`_llm_inflight{job=~"$job",instance=~"$instance"}, lane)`)
	if multiLane {
		lane = lane.Multi(true).IncludeAll(true).AllValue(".+")
	}
	return []cog.Builder[dashboard.VariableModel]{
		dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus"),
		query("job", "Job", "label_values("+prefix+"_llm_inflight, job)").Multi(true).IncludeAll(true).AllValue(".+"),
		query("instance", "Instance", "label_values("+prefix+`_llm_inflight{job=~"$job"}, instance)`).Multi(true).IncludeAll(true).AllValue(".+"),
		lane,
		dashboard.NewTextBoxVariableBuilder("exporter").Label("lanes-exporter URL").
			Description("Where the classification (state, reasons, hold text) is served: hold texts are not metrics.").
			DefaultValue(dashboard.StringOrMap{String: cog.ToPtr("http://127.0.0.1:4470")}),
	}
}

// titleAndUID returns a dashboard's title and uid for prefix: they tell the
// dashboards of different prefixes apart.
func titleAndUID(title, uid, prefix string) (string, string) {
	if prefix == "llmlanes" {
		return title, "llmlanes-" + uid
	}
	return title + " (" + prefix + ")", "llmlanes-" + prefix + "-" + uid
}

func base(title, uid, desc string, prefix string, multiLane bool) *dashboard.DashboardBuilder {
	title, uid = titleAndUID(title, uid, prefix)
	b := dashboard.NewDashboardBuilder(title).Uid(uid).Description(desc).Tags([]string{"llmlanes", "llm"}).
		Refresh("30s").Time("now-1h", "now").Timezone(common.TimeZoneBrowser).Readonly().
		Link(dashboard.NewDashboardLinkBuilder("Lane classification and hold texts").Type(dashboard.DashboardLinkTypeLink).
			Url("${exporter}/api/telemetry/llm-lanes/classification").Icon("info"))
	for _, v := range variables(prefix, multiLane) {
		b = b.WithVariable(v)
	}
	return b
}

const laneSel = `job=~"$job",instance=~"$instance",lane=~"$lane"`

// Overview is "LLM lanes — overview": every lane's state and queue, this
// process's and other processes' (lanes-exporter targets).
func Overview(prefix string) (dashboard.Dashboard, error) {
	b := qb{prefix, laneSel}
	secs := func(v float64) *float64 { return &v }
	lanes := tablePanel("Lanes", "One row per lane: its classification (as the classification route and the alert rules see it), slots, queue by class, p90 wait and queue timeouts of the last 5 minutes. Hold texts are sentences, not metrics: the classification route (dashboard link) has them.", 24, 8).
		WithTarget(b.instant(`max by (job, instance, lane, state) (P_llm_lane_state{SEL} == 1)`, "state")).
		WithTarget(b.instant(`sum by (job, instance, lane) (P_llm_inflight{SEL})`, "inflight")).
		WithTarget(b.instant(`sum by (job, instance, lane) (P_llm_limit{SEL})`, "limit")).
		WithTarget(b.instant(`sum by (job, instance, lane) (P_llm_queue_depth{SEL,priority="interactive"})`, "queued_interactive")).
		WithTarget(b.instant(`sum by (job, instance, lane) (P_llm_queue_depth{SEL,priority="default"})`, "queued_default")).
		WithTarget(b.instant(`sum by (job, instance, lane) (P_llm_queue_depth{SEL,priority="bulk"})`, "queued_bulk")).
		WithTarget(b.instant(`histogram_quantile(0.9, sum by (job, instance, lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[5m])))`, "wait_p90")).
		WithTarget(b.instant(`sum by (job, instance, lane) (increase(P_llm_queue_timeouts_total{SEL}[5m]))`, "timeouts_5m")).
		WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]any{"Time": true, "Value #state": true},
			"renameByName": map[string]any{"Value #inflight": "in flight", "Value #limit": "limit",
				"Value #queued_interactive": "queued interactive", "Value #queued_default": "queued default",
				"Value #queued_bulk": "queued bulk", "Value #wait_p90": "p90 wait (s)", "Value #timeouts_5m": "queue timeouts 5m"},
		}})
	targets := tablePanel("Other processes' lanes", "Lanes of the processes whose snapshots lanes-exporter reads (its targets: Python agents, other services), by target: state, slots, queue and p90 wait.", 24, 7).
		WithTarget(b.instant(`max by (job, instance, target, lane, state) (P_target_llm_lane_state{job=~"$job",instance=~"$instance"} == 1)`, "state")).
		WithTarget(b.instant(`sum by (job, instance, target, lane) (P_target_llm_inflight{job=~"$job",instance=~"$instance"})`, "inflight")).
		WithTarget(b.instant(`sum by (job, instance, target, lane) (P_target_llm_limit{job=~"$job",instance=~"$instance"})`, "limit")).
		WithTarget(b.instant(`sum by (job, instance, target, lane) (P_target_llm_queue_depth{job=~"$job",instance=~"$instance"})`, "queued")).
		WithTarget(b.instant(`max by (job, instance, target, lane) (P_target_llm_wait_p90_seconds{job=~"$job",instance=~"$instance"})`, "wait_p90")).
		WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]any{"Time": true, "Value #state": true},
			"renameByName":  map[string]any{"Value #inflight": "in flight", "Value #limit": "limit", "Value #queued": "queued", "Value #wait_p90": "p90 wait (s)"},
		}})
	d := base("LLM lanes — overview", "overview",
		"Every llmlanes lane: state, slots, queue by class, waits, queue timeouts, the gateway's answers, other processes' lanes, and per-process budgets against capacity.", prefix, true).
		WithPanel(lanes).
		WithPanel(series("In flight vs limit", "Calls holding a slot, per lane, beside the lane's limit.", "short", 12, 8,
			b.q(`sum by (job, lane) (P_llm_inflight{SEL})`, "{{lane}} in flight"),
			b.q(`max by (job, lane) (P_llm_limit{SEL})`, "{{lane}} limit"))).
		WithPanel(series("Queue depth by priority", "Calls waiting for a slot, by class, in every selected lane.", "short", 12, 8,
			b.q(`sum by (job, priority) (P_llm_queue_depth{SEL})`, "{{priority}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Queue wait p50 / p90", "How long calls wait for a slot (grants and queue timeouts), per lane; orange past 30 s, red past 60 s.", "s", 12, 8,
			b.q(`histogram_quantile(0.5, sum by (job, lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p50"),
			b.q(`histogram_quantile(0.9, sum by (job, lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p90")).
			Thresholds(thresholds(step(nil, "green"), step(secs(30), "orange"), step(secs(60), "red")))).
		WithPanel(series("Queue timeouts and callers giving up", "Calls that waited the whole queue timeout and got a 503 lane_queue_timeout, and calls that left the queue because their callers gave up (caller_gone) or were answered 503 lane_deadline before their stated timeout (deadline), per second.", "ops", 12, 8,
			b.q(`sum by (job, lane) (rate(P_llm_queue_timeouts_total{SEL}[$__rate_interval]))`, "{{lane}} queue timeouts"),
			b.q(`sum by (job, lane, cause) (rate(P_llm_queue_gave_up_total{SEL}[$__rate_interval]))`, "{{lane}} gave up: {{cause}}"))).
		WithPanel(series("Upstream outcomes and retries", "The gateway's answers by outcome, and calls that were retries, per second.", "reqps", 12, 8,
			b.q(`sum by (job, outcome) (rate(P_llm_upstream_requests_total{SEL}[$__rate_interval]))`, "{{outcome}}"),
			b.q(`sum by (job) (rate(P_llm_upstream_retries_total{SEL}[$__rate_interval]))`, "retries"))).
		WithPanel(series("Upstream time to first byte p50 / p90", "From sending a call (its slot held) to the first byte of the answer: the gateway's own latency, queue excluded.", "s", 12, 8,
			b.q(`histogram_quantile(0.5, sum by (job, lane, le) (rate(P_llm_upstream_first_byte_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p50"),
			b.q(`histogram_quantile(0.9, sum by (job, lane, le) (rate(P_llm_upstream_first_byte_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p90"))).
		WithPanel(series("Tokens per minute vs budget", "Tokens the lanes' calls used a minute (prompt and completion, from the answers' usage), beside the lane's budget: its tokens_per_minute, else the limit the provider's rate-limit headers announced, and what remains of it now.", "short", 12, 8,
			b.q(`sum by (job, lane) (rate(P_llm_tokens_total{SEL}[$__rate_interval])) * 60`, "{{lane}} used a minute"),
			b.q(`max by (job, lane) (P_llm_token_budget_limit{SEL})`, "{{lane}} budget a minute"),
			b.q(`max by (job, lane) (P_llm_token_budget_remaining{SEL})`, "{{lane}} remaining"))).
		WithPanel(series("Token estimates vs use", "How far the calls' token estimates at admission were from what they used, p50 and p90 of (used - estimate) / estimate: below 0, the lane reserved more than the calls needed (given back when they ended).", "percentunit", 12, 8,
			b.q(`histogram_quantile(0.5, sum by (job, lane, le) (rate(P_llm_token_estimate_error_ratio_bucket{SEL}[$__rate_interval])))`, "{{lane}} p50"),
			b.q(`histogram_quantile(0.9, sum by (job, lane, le) (rate(P_llm_token_estimate_error_ratio_bucket{SEL}[$__rate_interval])))`, "{{lane}} p90"))).
		WithPanel(targets).
		WithPanel(series("Other processes: in flight vs limit", "Calls holding a slot in other processes' lanes (lanes-exporter targets), beside their limits.", "short", 12, 8,
			b.q(`sum by (job, target, lane) (P_target_llm_inflight{job=~"$job",instance=~"$instance"})`, "{{target}} {{lane}} in flight"),
			b.q(`max by (job, target, lane) (P_target_llm_limit{job=~"$job",instance=~"$instance"})`, "{{target}} {{lane}} limit"))).
		WithPanel(series("Shared lanes: slots held by process", "For lanes shared in Redis: the slots each process holds, across the fleet (every exporter reports the same figures, hence max).", "short", 12, 8,
			b.q(`max by (lane, process) (P_llm_shared_holders{SEL})`, "{{lane}} {{process}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Shared lanes: Redis in use", "1 while a shared lane's Redis is reachable and in use; 0 while the process falls back to its own lanes or refuses calls (on_redis_down).", "short", 12, 8,
			b.q(`min by (job, instance, lane) (P_llm_shared_up{SEL})`, "{{instance}} {{lane}}"))).
		WithPanel(series("Per-process budget vs gateway capacity", "Each lane's limits summed across this exporter and its targets, beside the upstream's configured capacity: above it, the processes together can overload the gateway.", "short", 12, 8,
			b.q(`max by (job, lane) (P_llm_lane_budget{job=~"$job",instance=~"$instance",lane=~"$lane"})`, "{{lane}} sum of limits"),
			b.q(`max by (job, lane) (P_llm_lane_capacity{job=~"$job",instance=~"$instance",lane=~"$lane"})`, "{{lane}} capacity")))
	return d.Build()
}

// Detail is "LLM lane — detail": one lane.
func Detail(prefix string) (dashboard.Dashboard, error) {
	b := qb{prefix, `job=~"$job",instance=~"$instance",lane="$lane"`}
	d := base("LLM lane — detail", "lane-detail",
		"One llmlanes lane: its state, the wait heatmap with exemplars linking to traces, waits and queue by class, tenants waiting and served, and upstream health.", prefix, false).
		WithPanel(statPanel("State", "The lane's classification, as the classification route and the alert rules see it: idle, healthy, local_queue or gateway_degraded.", 6, 5,
			b.q(`max by (state) (P_llm_lane_state{SEL} == 1)`, "{{state}}"))).
		WithPanel(statPanel("Reasons", "Every classification reason that holds. Gateway reasons (upstream_errors, retries) stay listed when the state is local_queue.", 6, 5,
			b.q(`max by (reason) (P_llm_lane_reason{SEL} == 1)`, "{{reason}}"))).
		WithPanel(series("In flight vs limit", "Calls holding a slot, the lane's limit, and the slots reserved for interactive calls.", "short", 12, 5,
			b.q(`sum(P_llm_inflight{SEL})`, "in flight"), b.q(`max(P_llm_limit{SEL})`, "limit"), b.q(`max(P_llm_reserve{SEL})`, "reserved for interactive"))).
		WithPanel(heatmap.NewPanelBuilder().Title("Queue wait").Datasource(ds).Span(24).Height(9).Unit("s").
			Description("Waits for a slot (grants and queue timeouts); exemplars (dots) link to the call's trace when tracing is on.").
			Calculate(false).ExemplarsColor("rgba(255,0,255,0.7)").
			Tooltip(heatmap.NewHeatmapTooltipBuilder().Mode(common.TooltipDisplayModeSingle)).
			WithTarget(prometheus.NewDataqueryBuilder().Datasource(ds).
				Expr(b.expr(`sum by (le) (increase(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval]))`)).
				Format(prometheus.PromQueryFormatHeatmap).LegendFormat("{{le}}").Exemplar(true).Range())).
		WithPanel(series("Wait p90 by class", "The 90th percentile of the wait for a slot, by the call's own class.", "s", 12, 8,
			b.q(`histogram_quantile(0.9, sum by (priority, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{priority}}"))).
		WithPanel(series("Queue depth by class", "Calls waiting for a slot, by class.", "short", 12, 8,
			b.q(`sum by (priority) (P_llm_queue_depth{SEL})`, "{{priority}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Queue by tenant", "Calls waiting for a slot, by tenant (X-LLM-Tenant; lanes whose calls name none show no tenant): who is waiting.", "short", 8, 8,
			b.q(`sum by (tenant) (P_llm_tenant_queue_depth{SEL})`, "{{tenant}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("In flight by tenant", "Calls holding a slot, by tenant: who is being served.", "short", 8, 8,
			b.q(`sum by (tenant) (P_llm_tenant_inflight{SEL})`, "{{tenant}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Slot-time by tenant", "Slot-time each tenant's calls held per second (slots in use, counted as calls end): the service fair shares are measured in, before weights.", "short", 8, 8,
			b.q(`sum by (tenant) (rate(P_llm_tenant_service_seconds_total{SEL}[$__rate_interval]))`, "{{tenant}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Upstream health", "The gateway's answers by outcome, retries and queue timeouts, per second.", "reqps", 24, 8,
			b.q(`sum by (outcome) (rate(P_llm_upstream_requests_total{SEL}[$__rate_interval]))`, "{{outcome}}"),
			b.q(`sum(rate(P_llm_upstream_retries_total{SEL}[$__rate_interval]))`, "retries"),
			b.q(`sum(rate(P_llm_queue_timeouts_total{SEL}[$__rate_interval]))`, "queue timeouts")))
	// The GenAI conventions' client metrics carry no lane: the lane's model
	// and server (hidden variables read from $lane) select them, unprefixed.
	g := qb{prefix, `job=~"$job",instance=~"$instance",gen_ai_request_model="$model",server_address="$server"`}
	lane := func(name, regex string) *dashboard.QueryVariableBuilder {
		return dashboard.NewQueryVariableBuilder(name).Datasource(ds).Hide(dashboard.VariableHideHideVariable).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(" + prefix + `_llm_inflight{job=~"$job",instance=~"$instance",lane="$lane"}, lane)`)}).
			Regex(regex).Refresh(dashboard.VariableRefreshOnTimeRangeChanged)
	}
	d = d.WithVariable(lane("model", `/\|(.+)$/`)).WithVariable(lane("server", `/^[a-zA-Z]+:\/\/([^/:|]+)/`)).
		WithRow(dashboard.NewRowBuilder("GenAI conventions (gen_ai.client.*: what dashboards written for OpenTelemetry's GenAI conventions read)")).
		WithPanel(series("Operation duration p90", "gen_ai.client.operation.duration: each call as its caller saw it, its queue wait included, by error.type (none for a success; the project's codes, or the gateway's status).", "s", 12, 8,
			g.q(`histogram_quantile(0.9, sum by (error_type, le) (rate(gen_ai_client_operation_duration_seconds_bucket{SEL}[$__rate_interval])))`, "{{error_type}}"))).
		WithPanel(series("Operations by error.type", "Calls per second by error.type, from gen_ai.client.operation.duration's count.", "reqps", 12, 8,
			g.q(`sum by (error_type) (rate(gen_ai_client_operation_duration_seconds_count{SEL}[$__rate_interval]))`, "{{error_type}}"))).
		WithPanel(series("Tokens by type", "gen_ai.client.token.usage: input and output tokens per second, from the settled usage.", "short", 8, 8,
			g.q(`sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum{SEL}[$__rate_interval]))`, "{{gen_ai_token_type}}"))).
		WithPanel(series("Time to first chunk p90", "gen_ai.client.operation.time_to_first_chunk: streamed calls, from sending to the first chunk.", "s", 8, 8,
			g.q(`histogram_quantile(0.9, sum by (le) (rate(gen_ai_client_operation_time_to_first_chunk_seconds_bucket{SEL}[$__rate_interval])))`, "p90"))).
		WithPanel(series("Time per output chunk p90", "gen_ai.client.operation.time_per_output_chunk: streamed calls, each chunk after the first.", "s", 8, 8,
			g.q(`histogram_quantile(0.9, sum by (le) (rate(gen_ai_client_operation_time_per_output_chunk_seconds_bucket{SEL}[$__rate_interval])))`, "p90")))
	return d.Build()
}

// Files renders both dashboards for prefix as indented JSON, by file name.
func Files(prefix string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for name, f := range map[string]func(string) (dashboard.Dashboard, error){
		"llm-lanes-overview.json": Overview, "llm-lane-detail.json": Detail,
	} {
		d, err := f(prefix)
		if err != nil {
			return nil, err
		}
		b, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			return nil, err
		}
		out[name] = append(b, '\n')
	}
	return out, nil
}

// Substitute gives an expression's Grafana template variables values
// that match everything ($job, $instance, $lane, $model, $server) and a 1m rate interval, so that
// Prometheus or promtool can parse and run it.
func Substitute(expr string) string {
	return strings.NewReplacer(`"$job"`, `".*"`, `"$instance"`, `".*"`, `=~"$lane"`, `=~".*"`, `="$lane"`, `=~".*"`,
		`="$model"`, `=~".*"`, `="$server"`, `=~".*"`, "$__rate_interval", "1m").Replace(expr)
}

// Exprs returns the Prometheus expression of every panel target in a
// rendered dashboard, for tests.
func Exprs(dashboardJSON []byte) ([]string, error) {
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			if t.Expr != "" {
				out = append(out, t.Expr)
			}
		}
	}
	return out, nil
}
