package exporter

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/history"
	"github.com/llmlanes/llmlanes/limiter"
)

// The status page's last 15 minutes: every HistoryInterval, on the
// server's clock, the exporter records each of its lanes' figures, from
// one snapshot and that snapshot's classification, and HistoryPath serves
// them. Other processes' lanes (targets) are not recorded: their own
// exporters have their history.
const (
	HistoryInterval = 2 * time.Second
	HistoryWindow   = 15 * time.Minute
	HistoryPath     = "/api/telemetry/llm-lanes/history"
)

// sampler records the history every HistoryInterval until stopped.
type sampler struct {
	s     *Server
	clock limiter.Clock

	mu      sync.Mutex // guards timer and stopped
	timer   limiter.Timer
	stopped bool
}

func (p *sampler) schedule() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.timer = p.clock.AfterFunc(HistoryInterval, p.tick)
	}
}

func (p *sampler) tick() {
	snap := p.s.tel.Snapshot()
	p.s.history.Record(samplesOf(snap, p.s.tel.ClassifyLanes(snap), p.clock.Now()))
	p.schedule()
}

func (p *sampler) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
	}
}

// samplesOf is one sample of each lane of snap, at now; cls is snap's
// classification, lane by lane.
func samplesOf(snap limiter.Snapshot, cls []classify.Classification, now time.Time) map[string]history.Sample {
	out := make(map[string]history.Sample, len(snap.Lanes))
	for i, l := range snap.Lanes {
		wait := float32(math.NaN())
		if l.WaitP90 != nil {
			wait = float32(*l.WaitP90)
		}
		q := l.QueuedByPriority
		out[l.Lane] = history.Sample{At: now.UnixMilli(), Inflight: int32(l.Inflight), Limit: int32(l.Limit),
			Interactive: int32(q.Interactive), Default: int32(q.Default), Bulk: int32(q.Bulk), WaitP90: wait,
			QueueTimeouts: int32(l.QueueTimeouts5m), UpstreamErrors: int32(cls[i].Counts.UpstreamErrors), State: history.StateOf(cls[i].State)}
	}
	return out
}

// serveHistory answers with every lane's samples, or those later than
// ?since= (Unix milliseconds: the last t the caller has).
func (s *Server) serveHistory(w http.ResponseWriter, r *http.Request) {
	var since int64
	if v := r.URL.Query().Get("since"); v != "" {
		var err error
		if since, err = strconv.ParseInt(v, 10, 64); err != nil {
			writeError(w, invalidQueryCode, "since: want Unix milliseconds, got "+strconv.Quote(v))
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(history.Page{IntervalS: HistoryInterval.Seconds(), WindowS: HistoryWindow.Seconds(),
		States: classify.States(), Lanes: history.ColumnsOf(s.history.Since(since))})
}
