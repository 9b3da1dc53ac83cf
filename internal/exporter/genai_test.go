package exporter

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// Through lanes-exporter, the GenAI conventions' client metrics come out of
// /metrics under their own Prometheus names, with no prefix: a whole call
// and a streamed one that succeed, and one the gateway fails (500); the
// duration counts the three, the input tokens are the answers' usage, the
// failure carries error_type, and the stream is timed.
func TestProxyGenAIMetrics(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), `"bad"`):
			w.WriteHeader(http.StatusInternalServerError)
		case strings.Contains(string(b), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7}}`)
		}
	}))
	t.Cleanup(gw.Close)
	front, _, _ := newFront(t, fmt.Sprintf("limiter: {max_inflight: 2}\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", gw.URL), false)
	for _, body := range []string{`{"model":"m","messages":[]}`, `{"model":"m","stream":true,"messages":[]}`, `{"model":"bad","messages":[]}`} {
		res, err := http.Post(front.URL+"/proxy/gw/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	_, metrics := get(t, front.URL+"/metrics")
	if strings.Contains(metrics, "llmlanes_gen_ai") {
		t.Fatal("a GenAI metric carries the lane metrics' prefix")
	}
	sum := func(name string, labels ...string) (float64, int) {
		var v float64
		n := 0
	lines:
		for _, line := range strings.Split(metrics, "\n") {
			if !strings.HasPrefix(line, name+"{") {
				continue
			}
			for _, l := range labels {
				if !strings.Contains(line, l) {
					continue lines
				}
			}
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			v += f
			n++
		}
		return v, n
	}
	common := []string{`gen_ai_operation_name="chat"`, `gen_ai_provider_name="openai"`, `server_address="127.0.0.1"`}
	if v, _ := sum("gen_ai_client_operation_duration_seconds_count", common...); v != 3 {
		t.Errorf("gen_ai_client_operation_duration_seconds_count sums to %v, want the 3 calls:\n%s", v, genaiLines(metrics))
	}
	if v, _ := sum("gen_ai_client_operation_duration_seconds_count", `error_type="500"`, `gen_ai_request_model="bad"`); v != 1 {
		t.Errorf("the failed call: %v, want 1 with error_type 500", v)
	}
	if v, _ := sum("gen_ai_client_token_usage_sum", `gen_ai_token_type="input"`); v != 16 {
		t.Errorf("input tokens %v, want 16 (11 and 5)", v)
	}
	if v, _ := sum("gen_ai_client_token_usage_sum", `gen_ai_token_type="output"`); v != 10 {
		t.Errorf("output tokens %v, want 10", v)
	}
	if v, _ := sum("gen_ai_client_operation_time_to_first_chunk_seconds_count", `gen_ai_request_model="m"`); v != 1 {
		t.Errorf("time to first chunk: %v streams, want 1", v)
	}
	if _, n := sum("gen_ai_client_operation_time_per_output_chunk_seconds_count", `gen_ai_request_model="m"`); n != 1 {
		t.Errorf("time per output chunk: %d series, want 1", n)
	}
}

func genaiLines(metrics string) string {
	var out []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "gen_ai_") && !strings.Contains(l, "_bucket") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
