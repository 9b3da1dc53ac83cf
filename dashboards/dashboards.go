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
// metric prefix and SEL for the instance and lane selector.
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

func series(title, unit string, w, h uint32, targets ...cog.Builder[variants.Dataquery]) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Datasource(ds).Unit(unit).Span(w).Height(h).FillOpacity(10)
	for _, t := range targets {
		p = p.WithTarget(t)
	}
	return p
}

func variables(prefix string, multiLane bool) []cog.Builder[dashboard.VariableModel] {
	lane := dashboard.NewQueryVariableBuilder("lane").Label("lane").Datasource(ds).
		Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(" + prefix + `_llm_inflight{instance=~"$instance"}, lane)`)}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged)
	if multiLane {
		lane = lane.Multi(true).IncludeAll(true)
	}
	return []cog.Builder[dashboard.VariableModel]{
		dashboard.NewDatasourceVariableBuilder("datasource").Label("data source").Type("prometheus"),
		dashboard.NewQueryVariableBuilder("instance").Label("instance").Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(" + prefix + "_llm_inflight, instance)")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Multi(true).IncludeAll(true),
		lane,
		dashboard.NewTextBoxVariableBuilder("exporter").Label("lanes-exporter URL").
			Description("Where the classification (state, reasons, hold text) is served: hold texts are not metrics."),
	}
}

func base(title, uid, desc string, prefix string, multiLane bool) *dashboard.DashboardBuilder {
	b := dashboard.NewDashboardBuilder(title).Uid(uid).Description(desc).Tags([]string{"llmlanes", "llm"}).
		Refresh("30s").Time("now-1h", "now").Timezone(common.TimeZoneBrowser).Editable().
		Link(dashboard.NewDashboardLinkBuilder("Lane classification and hold texts").Type(dashboard.DashboardLinkTypeLink).
			Url("${exporter}/api/telemetry/llm-lanes/classification").Icon("info"))
	for _, v := range variables(prefix, multiLane) {
		b = b.WithVariable(v)
	}
	return b
}

// Overview is "LLM lanes — overview": every lane's state and queue.
func Overview(prefix string) (dashboard.Dashboard, error) {
	b := qb{prefix, `instance=~"$instance",lane=~"$lane"`}
	secs := func(v float64) *float64 { return &v }
	lanes := table.NewPanelBuilder().Title("Lanes").Datasource(ds).Span(24).Height(8).
		Description("One row per lane: its classification, slots, queue by class, p90 wait and queue timeouts of the last 5 minutes. Hold texts are sentences, not metrics: the classification route (dashboard link) has them.").
		WithTarget(b.instant(`max by (instance, lane, state) (P_llm_lane_state{SEL} == 1)`, "state")).
		WithTarget(b.instant(`sum by (instance, lane) (P_llm_inflight{SEL})`, "inflight")).
		WithTarget(b.instant(`sum by (instance, lane) (P_llm_limit{SEL})`, "limit")).
		WithTarget(b.instant(`sum by (instance, lane) (P_llm_queue_depth{SEL,priority="interactive"})`, "queued_interactive")).
		WithTarget(b.instant(`sum by (instance, lane) (P_llm_queue_depth{SEL,priority="default"})`, "queued_default")).
		WithTarget(b.instant(`sum by (instance, lane) (P_llm_queue_depth{SEL,priority="bulk"})`, "queued_bulk")).
		WithTarget(b.instant(`histogram_quantile(0.9, sum by (instance, lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[5m])))`, "wait_p90")).
		WithTarget(b.instant(`sum by (instance, lane) (increase(P_llm_queue_timeouts_total{SEL}[5m]))`, "timeouts_5m")).
		WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]any{"Time": true, "Value #state": true},
			"renameByName": map[string]any{"Value #inflight": "in flight", "Value #limit": "limit",
				"Value #queued_interactive": "queued interactive", "Value #queued_default": "queued default",
				"Value #queued_bulk": "queued bulk", "Value #wait_p90": "p90 wait (s)", "Value #timeouts_5m": "queue timeouts 5m"},
		}})
	d := base("LLM lanes — overview", "llmlanes-overview",
		"Every llmlanes lane: state, slots, queue by class, waits, queue timeouts, the gateway's answers, and per-process budgets against capacity.", prefix, true).
		WithPanel(lanes).
		WithPanel(series("In flight vs limit", "short", 12, 8,
			b.q(`sum by (lane) (P_llm_inflight{SEL})`, "{{lane}} in flight"),
			b.q(`max by (lane) (P_llm_limit{SEL})`, "{{lane}} limit"))).
		WithPanel(series("Queue depth by priority", "short", 12, 8,
			b.q(`sum by (priority) (P_llm_queue_depth{SEL})`, "{{priority}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Queue wait p50 / p90", "s", 12, 8,
			b.q(`histogram_quantile(0.5, sum by (lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p50"),
			b.q(`histogram_quantile(0.9, sum by (lane, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p90")).
			Thresholds(thresholds(step(nil, "green"), step(secs(30), "orange"), step(secs(60), "red")))).
		WithPanel(series("Queue timeouts", "ops", 12, 8,
			b.q(`sum by (lane) (rate(P_llm_queue_timeouts_total{SEL}[$__rate_interval]))`, "{{lane}}"))).
		WithPanel(series("Upstream outcomes and retries", "reqps", 12, 8,
			b.q(`sum by (outcome) (rate(P_llm_upstream_requests_total{SEL}[$__rate_interval]))`, "{{outcome}}"),
			b.q(`sum(rate(P_llm_upstream_retries_total{SEL}[$__rate_interval]))`, "SDK retries"))).
		WithPanel(series("Upstream time to first byte p50 / p90", "s", 12, 8,
			b.q(`histogram_quantile(0.5, sum by (lane, le) (rate(P_llm_upstream_first_byte_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p50"),
			b.q(`histogram_quantile(0.9, sum by (lane, le) (rate(P_llm_upstream_first_byte_seconds_bucket{SEL}[$__rate_interval])))`, "{{lane}} p90"))).
		WithPanel(series("Per-process budget vs gateway capacity", "short", 24, 8,
			b.q(`max by (lane) (P_llm_lane_budget{SEL})`, "{{lane}} sum of limits"),
			b.q(`max by (lane) (P_llm_lane_capacity{SEL})`, "{{lane}} capacity")))
	return d.Build()
}

// Detail is "LLM lane — detail": one lane.
func Detail(prefix string) (dashboard.Dashboard, error) {
	b := qb{prefix, `instance=~"$instance",lane="$lane"`}
	d := base("LLM lane — detail", "llmlanes-lane-detail",
		"One llmlanes lane: its state, the wait heatmap with exemplars linking to traces, waits and queue by class, and upstream health.", prefix, false).
		WithPanel(stat.NewPanelBuilder().Title("State").Datasource(ds).Span(6).Height(5).
			Description("The lane's classification, as the classification route and the alert rules see it: idle, healthy, local_queue or gateway_degraded.").
			WithTarget(b.q(`max by (state) (P_llm_lane_state{SEL} == 1)`, "{{state}}")).
			TextMode(common.BigValueTextModeName)).
		WithPanel(stat.NewPanelBuilder().Title("Reasons").Datasource(ds).Span(6).Height(5).
			Description("Every classification reason that holds. Gateway reasons (upstream_errors, retries) stay listed when the state is local_queue.").
			WithTarget(b.q(`max by (reason) (P_llm_lane_reason{SEL} == 1)`, "{{reason}}")).
			TextMode(common.BigValueTextModeName)).
		WithPanel(series("In flight vs limit", "short", 12, 5,
			b.q(`sum(P_llm_inflight{SEL})`, "in flight"), b.q(`max(P_llm_limit{SEL})`, "limit"), b.q(`max(P_llm_reserve{SEL})`, "reserved for interactive"))).
		WithPanel(heatmap.NewPanelBuilder().Title("Queue wait").Datasource(ds).Span(24).Height(9).
			Description("Waits for a slot; exemplars (dots) link to the call's trace when tracing is on.").
			Calculate(false).ExemplarsColor("rgba(255,0,255,0.7)").
			WithTarget(prometheus.NewDataqueryBuilder().Datasource(ds).
				Expr(b.expr(`sum by (le) (increase(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval]))`)).
				Format(prometheus.PromQueryFormatHeatmap).LegendFormat("{{le}}").Exemplar(true).Range())).
		WithPanel(series("Wait p90 by class", "s", 12, 8,
			b.q(`histogram_quantile(0.9, sum by (priority, le) (rate(P_llm_queue_wait_seconds_bucket{SEL}[$__rate_interval])))`, "{{priority}}"))).
		WithPanel(series("Queue depth by class", "short", 12, 8,
			b.q(`sum by (priority) (P_llm_queue_depth{SEL})`, "{{priority}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))).
		WithPanel(series("Upstream health", "reqps", 24, 8,
			b.q(`sum by (outcome) (rate(P_llm_upstream_requests_total{SEL}[$__rate_interval]))`, "{{outcome}}"),
			b.q(`sum(rate(P_llm_upstream_retries_total{SEL}[$__rate_interval]))`, "SDK retries"),
			b.q(`sum(rate(P_llm_queue_timeouts_total{SEL}[$__rate_interval]))`, "queue timeouts")))
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
// that match everything ($instance, $lane) and a 1m rate interval, so that
// Prometheus or promtool can parse and run it.
func Substitute(expr string) string {
	return strings.NewReplacer(`"$instance"`, `".*"`, `=~"$lane"`, `=~".*"`, `="$lane"`, `=~".*"`,
		"$__rate_interval", "1m").Replace(expr)
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
