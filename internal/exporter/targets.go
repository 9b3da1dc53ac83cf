package exporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/otelbridge"
	"github.com/llmlanes/llmlanes/telemetry"
)

// A target is another process's lane snapshot endpoint (a Python agent's
// /api/telemetry/llm-lanes, say). The exporter polls it, re-exports its
// lanes as metrics labelled by target, classifies them, and adds their
// limits to the per-lane budget it shows beside the upstream's capacity.
// A target that is down is reported (target_up 0, and its error), never
// fatal; its last good snapshot is kept out of the figures while it is down.
type target struct {
	cfg Target
	mu  sync.Mutex
	src telemetry.Source
}

// pollers runs one goroutine per target until stopped.
type pollers struct {
	list   []*target
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *Server) startTargets(cfg []Target) *pollers {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pollers{cancel: cancel}
	client := &http.Client{Transport: s.base}
	for _, c := range cfg {
		t := &target{cfg: c, src: telemetry.Source{Name: c.Name, Error: "not polled yet"}}
		p.list = append(p.list, t)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			every := time.Duration(c.Interval)
			// A reload restarts the pollers; a target is still polled at
			// most once per minPollGap, however often the file is reloaded.
			if v, ok := s.lastPoll.Load(c.URL); ok {
				if wait := minPollGap - time.Since(v.(time.Time)); wait > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
				}
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				s.lastPoll.Store(c.URL, time.Now())
				t.poll(ctx, client, every, s.cfg.Load().Limits.MaxLanes)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	return p
}

func (p *pollers) stop() {
	p.cancel()
	p.wg.Wait()
}

// maxSnapshotBytes bounds a target's answer.
const maxSnapshotBytes = 8 << 20

// minPollGap is the least time between two polls of one target.
const minPollGap = time.Second

// poll fetches the target's snapshot. Of its lanes, at most maxLanes are
// kept (the first, in key order), as for this process's own lanes: another
// process's answer cannot blow up this one's metrics.
func (t *target) poll(ctx context.Context, client *http.Client, timeout time.Duration, maxLanes int) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	snap, err := fetchSnapshot(ctx, client, t.cfg.URL)
	if err == nil && len(snap.Lanes) > maxLanes {
		snap.Lanes = snap.Lanes[:maxLanes]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if errors.Is(context.Cause(ctx), context.Canceled) {
			return // shutting down, not a failed poll
		}
		t.src.Up, t.src.Error = false, err.Error()
		return
	}
	t.src = telemetry.Source{Name: t.cfg.Name, Up: true, Snapshot: snap}
}

func fetchSnapshot(ctx context.Context, client *http.Client, url string) (limiter.Snapshot, error) {
	var snap limiter.Snapshot
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return snap, err
	}
	req.Header.Set("Accept", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return snap, fmt.Errorf("fetch: %w", withoutURL(err))
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return snap, fmt.Errorf("fetch: status %s", res.Status)
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxSnapshotBytes)).Decode(&snap); err != nil {
		return snap, fmt.Errorf("not a lane snapshot: %w", err)
	}
	return snap, nil
}

// sources returns the targets' state for classification: only targets
// that are up contribute lanes.
func (p *pollers) sources() []telemetry.Source {
	out := make([]telemetry.Source, 0, len(p.list))
	for _, t := range p.list {
		t.mu.Lock()
		src := t.src
		t.mu.Unlock()
		if !src.Up {
			src.Snapshot = limiter.Snapshot{}
		}
		out = append(out, src)
	}
	return out
}

// Budget is one lane's share-out across processes: the limits of this
// exporter and of every target that has the lane, beside the configured
// capacity of the upstream the lane calls.
type Budget struct {
	Lane          string         `json:"lane"`
	Upstream      string         `json:"upstream,omitempty"`
	Capacity      int            `json:"capacity"` // 0: not configured
	Limits        map[string]int `json:"limits"`   // process ("self" or a target's name) → limit
	Total         int            `json:"total"`
	Overcommitted bool           `json:"overcommitted"` // total above a configured capacity
}

// budgets computes every lane's budget.
func (s *Server) budgets() []Budget {
	cfg := s.cfg.Load()
	by := map[string]*Budget{}
	add := func(lane, who string, limit int) {
		b := by[lane]
		if b == nil {
			b = &Budget{Lane: lane, Limits: map[string]int{}}
			base, _ := limiter.SplitLaneKey(lane)
			for _, u := range cfg.Upstreams {
				if u.BaseURL == limiter.CanonicalBase(base) {
					b.Upstream, b.Capacity = u.Name, u.Capacity
				}
			}
			by[lane] = b
		}
		b.Limits[who] += limit
		b.Total += limit
	}
	for _, l := range s.tel.Snapshot().Lanes { // a scrape's own snapshot, while it runs
		add(l.Lane, "self", l.Limit)
	}
	for _, src := range s.targets().sources() {
		for _, l := range src.Snapshot.Lanes {
			add(l.Lane, src.Name, l.Limit)
		}
	}
	out := make([]Budget, 0, len(by))
	for _, b := range by {
		b.Overcommitted = b.Capacity > 0 && b.Total > b.Capacity
		out = append(out, *b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lane < out[j].Lane })
	return out
}

func (s *Server) serveBudget(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(map[string]any{"lanes": s.budgets()})
}

// targetCollector re-exports the targets' lanes, the budgets and the
// upstreams' capacity at scrape time.
type targetCollector struct {
	s     *Server
	descs [nTargetDefs]*prometheus.Desc
}

// The targets' and budgets' metrics, by their place in targetDefs.
const (
	tUp = iota
	tInflight
	tLimit
	tDepth
	tSaturated
	tP90
	tTimeouts
	tState
	tBudget
	tCapacity
	tOvercommitted
	tUpstreamCapacity
	nTargetDefs
)

// targetDefs declares the metrics lanes-exporter adds for its targets and
// the lanes' budgets (all gauges, Prometheus names as they are); read
// only.
var targetDefs = [nTargetDefs]otelbridge.Def{
	tUp:               {Name: "target_up", Labels: []string{"target"}, Description: "1 if the last poll of the target's snapshot succeeded."},
	tInflight:         {Name: "target_llm_inflight", Labels: []string{"target", "lane"}, Description: "A target process's calls holding a lane slot."},
	tLimit:            {Name: "target_llm_limit", Labels: []string{"target", "lane"}, Description: "A target process's lane limit."},
	tDepth:            {Name: "target_llm_queue_depth", Labels: []string{"target", "lane", "priority"}, Description: "A target process's calls waiting for a lane slot, by class."},
	tSaturated:        {Name: "target_llm_saturated", Labels: []string{"target", "lane"}, Description: "1 when a target process's lane has queued for 60 s or more."},
	tP90:              {Name: "target_llm_wait_p90_seconds", Labels: []string{"target", "lane"}, Description: "A target process's 5-minute p90 wait."},
	tTimeouts:         {Name: "target_llm_queue_timeouts_5m", Labels: []string{"target", "lane"}, Description: "A target process's queue timeouts in the last 5 minutes."},
	tState:            {Name: "target_llm_lane_state", Labels: []string{"target", "lane", "state"}, Description: "A target process's lane classification (1 for the current state)."},
	tBudget:           {Name: "llm_lane_budget", Labels: []string{"lane"}, Description: "Sum of the lane's limits across this exporter and its targets."},
	tCapacity:         {Name: "llm_lane_capacity", Labels: []string{"lane", "upstream"}, Description: "Configured parallel capacity of the upstream the lane calls (absent if unknown)."},
	tOvercommitted:    {Name: "llm_lane_overcommitted", Labels: []string{"lane"}, Description: "1 when the lane's budget across processes exceeds its upstream's capacity."},
	tUpstreamCapacity: {Name: "upstream_capacity", Labels: []string{"upstream"}, Description: "Configured parallel capacity of an upstream (0 if unknown)."},
}

// TargetDefs returns the table of the gauges lanes-exporter adds for its
// targets and the lanes' budgets (a copy).
func TargetDefs() []otelbridge.Def { return append([]otelbridge.Def(nil), targetDefs[:]...) }

func newTargetCollector(s *Server, p string) *targetCollector {
	c := &targetCollector{s: s}
	for i, d := range targetDefs {
		c.descs[i] = prometheus.NewDesc(p+"_"+d.Name, d.Description, d.Labels, nil)
	}
	return c
}

func (c *targetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *targetCollector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	b01 := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	th := c.s.cfg.Load().res.thresholds
	for _, src := range c.s.targets().sources() {
		g(c.descs[tUp], b01(src.Up), src.Name)
		for _, l := range src.Snapshot.Lanes {
			g(c.descs[tInflight], float64(l.Inflight), src.Name, l.Lane)
			g(c.descs[tLimit], float64(l.Limit), src.Name, l.Lane)
			q := l.QueuedByPriority
			g(c.descs[tDepth], float64(q.Interactive), src.Name, l.Lane, "interactive")
			g(c.descs[tDepth], float64(q.Default), src.Name, l.Lane, "default")
			g(c.descs[tDepth], float64(q.Bulk), src.Name, l.Lane, "bulk")
			g(c.descs[tSaturated], b01(l.Saturated), src.Name, l.Lane)
			if l.WaitP90 != nil {
				g(c.descs[tP90], float64(*l.WaitP90), src.Name, l.Lane)
			}
			g(c.descs[tTimeouts], float64(l.QueueTimeouts5m), src.Name, l.Lane)
			st := classify.Lane(l, th).State
			for _, s := range classify.States() {
				g(c.descs[tState], b01(s == st), src.Name, l.Lane, string(s))
			}
		}
	}
	for _, b := range c.s.budgets() {
		g(c.descs[tBudget], float64(b.Total), b.Lane)
		if b.Capacity > 0 {
			g(c.descs[tCapacity], float64(b.Capacity), b.Lane, b.Upstream)
		}
		g(c.descs[tOvercommitted], b01(b.Overcommitted), b.Lane)
	}
	for _, u := range c.s.cfg.Load().Upstreams {
		g(c.descs[tUpstreamCapacity], float64(u.Capacity), u.Name)
	}
}
