package exporter

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/classify"
	"github.com/llmlanes/llmlanes/internal/history"
)

func historyPage(t *testing.T, r *proxyRig, query string) history.Page {
	t.Helper()
	code, body := get(t, r.front.URL+HistoryPath+query)
	if code != 200 {
		t.Fatalf("GET %s%s: %d %s", HistoryPath, query, code, body)
	}
	var p history.Page
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return p
}

// The history route serves what the sampler records every HistoryInterval
// on the server's clock: each lane's figures and state, later than
// ?since=; a lane the limiter forgets loses its history; a bad since is a
// 400; the route is read-only.
func TestHistoryRoute(t *testing.T) {
	r := newProxy(t, "limiter: {max_inflight: 1, queue_timeout: 300s, interactive_reserve: 0}\nlimits: {lane_idle_ttl: 1m}\n"+
		"upstreams: [{name: gw, base_url: \"UPSTREAM\"}]\n")
	if p := historyPage(t, r, ""); len(p.Lanes) != 0 || p.IntervalS != 2 || p.WindowS != 900 {
		t.Fatalf("before any call: %+v", p)
	}
	held, err := r.srv.Limiter().Acquire(context.Background(), r.lane("m"))
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(HistoryInterval - time.Millisecond)
	if p := historyPage(t, r, ""); len(p.Lanes) != 0 {
		t.Fatalf("a sample before the first interval: %+v", p)
	}
	r.clock.Advance(time.Millisecond)
	p := historyPage(t, r, "")
	if len(p.Lanes) != 1 || p.Lanes[0].Lane != r.lane("m") || len(p.Lanes[0].At) != 1 {
		t.Fatalf("after one interval: %+v", p)
	}
	first := p.Lanes[0]
	if first.Inflight[0] != 1 || first.Limit[0] != 1 || first.At[0] != r.clock.Now().UnixMilli() || first.WaitP90[0] == nil || *first.WaitP90[0] != 0 ||
		p.States[first.State[0]] != classify.Healthy {
		t.Fatalf("the first sample: %+v (states %v)", first, p.States)
	}

	// Two calls queue behind the held one, one interactive.
	for _, prio := range []string{"interactive", "bulk"} {
		go func() {
			res, err := r.post(context.Background(), "/proxy/gw/chat/completions", "q-"+prio, prio, `{"model":"m"}`)
			if err == nil {
				res.Body.Close()
			}
		}()
		r.waitQueued("m", map[string]int{"interactive": 1, "bulk": 2}[prio])
	}
	r.clock.Advance(HistoryInterval)
	p = historyPage(t, r, "")
	l := p.Lanes[0]
	if len(l.At) != 2 || l.Interactive[1] != 1 || l.Bulk[1] != 1 || l.Default[1] != 0 || l.At[1]-l.At[0] != 2000 {
		t.Fatalf("two samples, the second with 1 interactive and 1 bulk queued: %+v", l)
	}
	if since := historyPage(t, r, "?since="+strconv.FormatInt(l.At[0], 10)); len(since.Lanes) != 1 || len(since.Lanes[0].At) != 1 || since.Lanes[0].At[0] != l.At[1] {
		t.Fatalf("since the first sample: %+v", since)
	}
	if since := historyPage(t, r, "?since="+strconv.FormatInt(l.At[1], 10)); len(since.Lanes) != 1 || len(since.Lanes[0].At) != 0 {
		t.Fatalf("since the last sample: %+v, want the lane with no samples", since)
	}
	held.Release() // the queued calls go through and end
	for deadline := time.Now().Add(10 * time.Second); r.snapshot("m").Inflight+r.snapshot("m").Queued > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the queued calls never ended: %+v", r.snapshot("m"))
		}
	}

	// Idle past lane_idle_ttl and its sweep: the lane, and its history, go.
	r.clock.Advance(3 * time.Minute)
	if p := historyPage(t, r, ""); len(p.Lanes) != 0 {
		t.Fatalf("a forgotten lane kept its history: %d lanes", len(p.Lanes))
	}

	code, body := get(t, r.front.URL+HistoryPath+"?since=yesterday")
	if code != 400 || !strings.Contains(body, `"invalid_query"`) || !strings.Contains(body, "since") {
		t.Fatalf("a bad since: %d %s", code, body)
	}
	if code, _ := postJSON(t, r.front.URL+HistoryPath, "{}"); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %d, want 405", HistoryPath, code)
	}
}
