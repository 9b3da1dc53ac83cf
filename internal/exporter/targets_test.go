package exporter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// 7. Targets: a snapshot target is re-exported and classified, a down target is
// reported (not fatal), and the budget across processes is set beside the
// upstream's capacity.
func TestTargets(t *testing.T) {
	up := newUpstream(t)
	laneKey := up.srv.URL + "/v1|protolabs/smart"
	vera := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"enabled": true, "generated_at": "2026-09-28T09:26:00Z",
 "lanes": [{"lane": %q, "limit": 6, "reserve": 1, "inflight": 5, "queued": 9,
            "queued_by_priority": {"interactive": 0, "default": 2, "bulk": 7},
            "oldest_wait_s": 212.4, "wait_p50_s_5m": 38.0, "wait_p90_s_5m": 171.0,
            "queue_timeouts_5m": 2, "saturated": true}]}`, laneKey)
	}))
	defer vera.Close()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	downURL := "http://" + l.Addr().String() + "/api/telemetry/llm-lanes"
	l.Close() // nothing listens there

	srv := newTestServer(t, fmt.Sprintf(`
limiter: {max_inflight: 6}
upstreams: [{name: gw, base_url: "%s/v1", capacity: 8}]
targets:
  - {name: vera, url: "%s/api/telemetry/llm-lanes", interval: 1h}
  - {name: down, url: "%s", interval: 1h}
`, up.srv.URL, vera.URL, downURL))
	defer srv.Shutdown(context.Background())
	front := httptest.NewServer(srv.Handler())
	defer front.Close()
	// This process uses the lane too.
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(chat))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	// The first poll runs at start; wait for both to be done.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		srcs := srv.targets().sources()
		if srcs[0].Up && srcs[1].Error != "not polled yet" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("targets %+v", srcs)
		}
	}

	_, metrics := get(t, front.URL+"/metrics")
	for _, want := range []string{
		`llmlanes_target_up{target="vera"} 1`,
		`llmlanes_target_up{target="down"} 0`,
		`llmlanes_target_llm_inflight{lane="` + laneKey + `",target="vera"} 5`,
		`llmlanes_target_llm_queue_depth{lane="` + laneKey + `",priority="bulk",target="vera"} 7`,
		`llmlanes_target_llm_saturated{lane="` + laneKey + `",target="vera"} 1`,
		`llmlanes_target_llm_wait_p90_seconds{lane="` + laneKey + `",target="vera"} 171`,
		`llmlanes_target_llm_lane_state{lane="` + laneKey + `",state="local_queue",target="vera"} 1`,
		`llmlanes_llm_lane_budget{lane="` + laneKey + `"} 12`,
		`llmlanes_llm_lane_capacity{lane="` + laneKey + `",upstream="gw"} 8`,
		`llmlanes_llm_lane_overcommitted{lane="` + laneKey + `"} 1`,
		`llmlanes_upstream_capacity{upstream="gw"} 8`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	_, body := get(t, front.URL+"/api/telemetry/llm-lanes/classification")
	var rep struct {
		Lanes []struct {
			Lane, Target, State string
			HoldText            string `json:"hold_text"`
		}
		Targets []struct {
			Name  string
			Up    bool
			Error string
		}
	}
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range rep.Lanes {
		if c.Target == "vera" && c.Lane == laneKey {
			found = c.State == "local_queue" && c.HoldText == "gate queue: 9 calls waiting, p90 wait 171 s, 2 queue timeouts in 5 min"
		}
	}
	if !found || len(rep.Targets) != 2 || rep.Targets[1].Up || !strings.Contains(rep.Targets[1].Error, "refused") {
		t.Fatalf("classification %s", body)
	}

	_, body = get(t, front.URL+"/api/telemetry/llm-lanes/budget")
	var b struct{ Lanes []Budget }
	json.Unmarshal([]byte(body), &b)
	if len(b.Lanes) != 1 || b.Lanes[0].Total != 12 || b.Lanes[0].Limits["self"] != 6 || b.Lanes[0].Limits["vera"] != 6 ||
		b.Lanes[0].Capacity != 8 || !b.Lanes[0].Overcommitted || b.Lanes[0].Upstream != "gw" {
		t.Fatalf("budget %s", body)
	}
}
