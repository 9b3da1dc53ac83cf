package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// BudgetView is what a lanes-exporter reports about the lane's budget in
// one set-up of TwoProcesses: its budget route's answer and its
// over-commit gauge, the series LLMLanesBudgetOvercommitted alerts on.
type BudgetView struct {
	Setup  string
	Budget exporter.Budget
	Gauge  string // the llmlanes_llm_lane_overcommitted sample, as scraped
}

// CheckBudget runs a real lanes-exporter on loopback for each set-up of
// TwoProcesses and reads its budget: once watching the agents' own lanes
// (each of Limit slots, as targets), once as the shared exporter (one lane
// of SharedLimit slots), both against an upstream of Capacity.
func CheckBudget(ctx context.Context, o Options) ([]BudgetView, error) {
	gw := httptest.NewServer(gatewaysim.New(gatewaysim.Config{Capacity: o.Capacity, TokenTime: time.Millisecond, Tokens: 1, Seed: 1}))
	defer gw.Close()
	base := gw.URL + "/v1"
	key := limiter.LaneKey(base, "protolabs/smart")

	// Each agent's process serves its lane's snapshot.
	var targets []string
	for a := range o.Agents {
		tel, err := telemetry.New(telemetry.Options{})
		if err != nil {
			return nil, err
		}
		defer tel.Shutdown(ctx)
		lim, err := limiter.New(limiter.Config{MaxInflight: o.Limit, InteractiveReserve: o.Reserve, QueueTimeout: o.QueueTimeout})
		if err != nil {
			return nil, err
		}
		s, err := lim.Acquire(ctx, key) // the lane exists once it has had a call
		if err != nil {
			return nil, err
		}
		s.Release()
		tel.Watch(lim)
		srv := httptest.NewServer(tel.Handler())
		defer srv.Close()
		targets = append(targets, fmt.Sprintf("{name: agent-%c, url: %q, interval: 1h}", 'a'+a, srv.URL+telemetry.SnapshotPath))
	}
	up := fmt.Sprintf("upstreams: [{name: gw, base_url: %q, capacity: %d}]\n", base, o.Capacity)
	perProcess, err := exporterBudget(ctx, "limiter: {max_inflight: 0}\n"+up+"targets: ["+strings.Join(targets, ", ")+"]\n", key, "", o.Agents)
	if err != nil {
		return nil, err
	}
	perProcess.Setup = "lanes (one per agent)"
	shared, err := exporterBudget(ctx, fmt.Sprintf("limiter: {max_inflight: %d, interactive_reserve: %d}\n", o.SharedLimit, o.SharedReserve)+up, key, "/proxy/gw/chat/completions", 1)
	if err != nil {
		return nil, err
	}
	shared.Setup = "shared-exporter"
	return []BudgetView{perProcess, shared}, nil
}

// exporterBudget starts lanes-exporter with yaml, makes one call through
// path if given, waits until the lane's budget counts want processes, and
// reads the budget and the gauge.
func exporterBudget(ctx context.Context, yaml, key, path string, want int) (BudgetView, error) {
	var v BudgetView
	cfg, err := exporter.ParseConfig("replay.yaml", []byte(yaml))
	if err != nil {
		return v, err
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	srv, err := exporter.New(cfg, exporter.Options{Base: tr})
	if err != nil {
		return v, err
	}
	defer srv.Shutdown(ctx)
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	client := &http.Client{Transport: tr}
	if path != "" {
		res, err := client.Post(front.URL+path, "application/json", strings.NewReader(`{"model":"protolabs/smart"}`))
		if err != nil {
			return v, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	get := func(p string) ([]byte, error) {
		res, err := client.Get(front.URL + p)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		return io.ReadAll(res.Body)
	}
	// The targets' first polls run as the exporter starts.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := get(telemetry.SnapshotPath + "/budget")
		if err != nil {
			return v, err
		}
		var body struct{ Lanes []exporter.Budget }
		if err := json.Unmarshal(b, &body); err != nil {
			return v, fmt.Errorf("budget route: %w", err)
		}
		for _, l := range body.Lanes {
			if l.Lane == key && len(l.Limits) == want {
				v.Budget = l
			}
		}
		if v.Budget.Lane != "" {
			break
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("budget route never counted %d processes: %s", want, b)
		}
	}
	m, err := get(telemetry.MetricsPath)
	if err != nil {
		return v, err
	}
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, "llmlanes_llm_lane_overcommitted{") {
			v.Gauge = line
		}
	}
	return v, nil
}
