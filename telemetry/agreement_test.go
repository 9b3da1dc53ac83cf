package telemetry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// agreementCase drives a real lane (limit 1, on a fake clock) into one
// situation; the test then reads its state from the classification route,
// from the exporter's gauges, and from the alert rules evaluated by
// promtool over those gauges, and all three must agree with want.
type agreementCase struct {
	name    string
	drive   func(s *stack) (cleanup func())
	want    classify.State
	reasons []string
}

// exchanges reports n exchanges of lane with outcome o.
func exchanges(s *stack, n int, o limiter.Outcome, retry bool) {
	for range n {
		s.lim.RecordExchange(context.Background(), lane, limiter.Exchange{Outcome: o, Retry: retry, Duration: time.Second})
	}
}

// saturate queues one call behind a held slot for 90 s.
func saturate(s *stack) func() {
	held := s.take(limiter.Default)
	w := s.wait(limiter.Bulk)
	s.clock.Advance(90 * time.Second)
	return func() {
		held.Release()
		r := <-w
		r.slot.Release()
	}
}

// slowGrants makes two calls wait 45 s each, then empties the queue.
func slowGrants(s *stack) func() {
	held := s.take(limiter.Default)
	w1, w2 := s.wait(limiter.Bulk), s.wait(limiter.Bulk)
	s.clock.Advance(45 * time.Second)
	held.Release()
	r := <-w1
	r.slot.Release()
	r = <-w2
	r.slot.Release()
	return func() {}
}

func quickCall(s *stack) func() {
	slot := s.take(limiter.Default)
	slot.Release()
	return func() {}
}

var agreementCases = []agreementCase{
	{"idle: no call for over 5 minutes", func(s *stack) func() {
		quickCall(s)
		s.clock.Advance(320 * time.Second)
		return func() {}
	}, classify.Idle, nil},
	{"healthy: calls flow", quickCall, classify.Healthy, nil},
	{"saturated, healthy gateway", func(s *stack) func() {
		c := saturate(s)
		exchanges(s, 10, limiter.OutcomeOK, false)
		return c
	}, classify.LocalQueue, []string{"saturated"}},
	{"p90 wait over the threshold, not saturated", slowGrants, classify.LocalQueue, []string{"wait_p90"}},
	{"failing gateway, free lane", func(s *stack) func() {
		quickCall(s)
		exchanges(s, 4, limiter.OutcomeServerError, false)
		exchanges(s, 2, limiter.OutcomeRateLimited, false)
		return func() {}
	}, classify.GatewayDegraded, []string{"upstream_errors"}},
	{"retries alone", func(s *stack) func() {
		quickCall(s)
		exchanges(s, 3, limiter.OutcomeOK, true)
		return func() {}
	}, classify.GatewayDegraded, []string{"retries"}},
	{"saturated in front of a failing gateway", func(s *stack) func() {
		c := saturate(s)
		exchanges(s, 5, limiter.OutcomeServerError, true)
		return c
	}, classify.LocalQueue, []string{"saturated", "upstream_errors", "retries"}},
	{"slow grants in front of a failing gateway", func(s *stack) func() {
		c := slowGrants(s)
		exchanges(s, 3, limiter.OutcomeTransportError, false)
		return c
	}, classify.LocalQueue, []string{"wait_p90", "upstream_errors"}},
	{"queue timeouts", func(s *stack) func() {
		held := s.take(limiter.Default)
		w := s.wait(limiter.Bulk)
		s.clock.Advance(limiter.DefaultQueueTimeout)
		<-w
		held.Release()
		return func() {}
	}, classify.LocalQueue, []string{"wait_p90", "queue_timeouts"}},
	{"one queue timeout, free lane now, failing gateway", func(s *stack) func() {
		held := s.take(limiter.Default)
		w := s.wait(limiter.Bulk)
		s.clock.Advance(limiter.DefaultQueueTimeout)
		<-w
		held.Release()
		for range 20 { // calls flow again: the p90 wait is 0
			quickCall(s)
		}
		exchanges(s, 20, limiter.OutcomeServerError, false)
		return func() {}
	}, classify.GatewayDegraded, []string{"queue_timeouts", "upstream_errors"}},
}

// TestClassificationTableAgrees: the classification route, the lane-state
// gauges and the alert rules (promtool over those gauges) give the same
// state for every case.
func TestClassificationTableAgrees(t *testing.T) {
	var series []string // promtool input, from the gauges
	var firing []string // ALERTS promtool must find
	for i, c := range agreementCases {
		instance := fmt.Sprintf("case-%d", i)
		s := newStack(t, limiter.Config{MaxInflight: 1}, telemetry.Options{})
		cleanup := c.drive(s)

		// 1. The route.
		_, body, _ := s.get("/api/telemetry/llm-lanes/classification?lane=" + lane)
		var cl classify.Classification
		if err := json.Unmarshal([]byte(body), &cl); err != nil {
			t.Fatalf("%s: %v: %s", c.name, err, body)
		}
		want := c.reasons
		if want == nil {
			want = []string{}
		}
		if cl.State != c.want || !slices.Equal(cl.Reasons, want) {
			t.Errorf("%s: route says %s %v, want %s %v", c.name, cl.State, cl.Reasons, c.want, want)
		}

		// 2. The gauges.
		states, reasons, saturated := gauges(t, s)
		var on []string
		for st, v := range states {
			if v == 1 {
				on = append(on, st)
			}
		}
		if len(on) != 1 || on[0] != string(c.want) || len(states) != len(classify.States()) {
			t.Errorf("%s: lane_state gauges %v, want only %s at 1", c.name, states, c.want)
		}
		var gr []string
		for _, r := range classify.Reasons() {
			if reasons[r] == 1 {
				gr = append(gr, r)
			}
		}
		if !slices.Equal(gr, c.reasons) {
			t.Errorf("%s: lane_reason gauges %v, want %v", c.name, reasons, c.reasons)
		}

		// 3. The rules, fed the gauges as Prometheus would scrape them.
		labels := fmt.Sprintf(`instance=%q,job="lanes-exporter",lane=%q`, instance, lane)
		for st, v := range states {
			series = append(series, fmt.Sprintf("llmlanes_llm_lane_state{%s,state=%q}\t%gx15", labels, st, v))
		}
		for r, v := range reasons {
			series = append(series, fmt.Sprintf("llmlanes_llm_lane_reason{%s,reason=%q}\t%gx15", labels, r, v))
		}
		series = append(series, fmt.Sprintf("llmlanes_llm_saturated{%s}\t%gx15", labels, saturated))
		if cl.State == classify.GatewayDegraded {
			for _, r := range cl.Reasons {
				if classify.IsGatewayReason(r) {
					firing = append(firing, fmt.Sprintf(`ALERTS{alertname="LLMLanesGatewayDegraded",alertstate="firing",instance=%q,job="lanes-exporter",lane=%q,reason=%q,severity="critical"}`, instance, lane, r))
				}
			}
		}
		if slices.Contains(cl.Reasons, classify.ReasonSaturated) {
			firing = append(firing, fmt.Sprintf(`ALERTS{alertname="LLMLanesLaneSaturated",alertstate="firing",instance=%q,job="lanes-exporter",lane=%q,severity="warning"}`, instance, lane))
		}
		cleanup()
	}
	promtoolAgrees(t, series, firing)
}

// gauges reads the lane's state and reason gauges and the saturated gauge
// from the registry.
func gauges(t *testing.T, s *stack) (states, reasons map[string]float64, saturated float64) {
	t.Helper()
	fams, err := s.tel.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	states, reasons = map[string]float64{}, map[string]float64{}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if label(m, "lane") != lane {
				continue
			}
			switch f.GetName() {
			case "llmlanes_llm_lane_state":
				states[label(m, "state")] = m.GetGauge().GetValue()
			case "llmlanes_llm_lane_reason":
				reasons[label(m, "reason")] = m.GetGauge().GetValue()
			case "llmlanes_llm_saturated":
				saturated = m.GetGauge().GetValue()
			}
		}
	}
	return states, reasons, saturated
}

// promtoolAgrees runs the alert rules over the series for 15 minutes and
// checks that exactly the expected alerts fire at 10 minutes.
func promtoolAgrees(t *testing.T, series, firing []string) {
	t.Helper()
	rules, err := filepath.Abs("../alerts/llmlanes.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files: [%q]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", rules)
	sort.Strings(series)
	for _, s := range series {
		name, values, _ := strings.Cut(s, "\t")
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", name, values)
	}
	b.WriteString("    promql_expr_test:\n      - expr: 'ALERTS{alertstate=\"firing\",alertname=~\"LLMLanesGatewayDegraded|LLMLanesLaneSaturated\"}'\n        eval_time: 10m\n        exp_samples:\n")
	sort.Strings(firing)
	for _, f := range firing {
		fmt.Fprintf(&b, "          - labels: '%s'\n            value: 1\n", f)
	}
	file := filepath.Join(t.TempDir(), "agreement.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("promtool", "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("the alert rules disagree with the classification route: promtool: %v\n%s\n--- test file:\n%s", err, out, b.String())
	}
	if len(firing) < 4 {
		t.Fatalf("only %d alerts expected: the table lost its teeth", len(firing))
	}
}
