package otelbridge_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmlanes/llmlanes/limiter"
)

// genaiPoints collects the bridge's GenAI metrics through a real SDK
// reader, by metric name.
func genaiPoints(t *testing.T, r *rig) map[string]metricdata.Aggregation {
	t.Helper()
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(r.b.GenAIProducer()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func attrString(s attribute.Set, k attribute.Key) string {
	v, _ := s.Value(k)
	return v.Emit()
}

// Through lanehttp in process, with a real SDK reader: a call that queued 3 s
// and took 2 s at the gateway, a streamed call of three chunks a second
// apart, a gateway's 500 and a queue timeout. The duration counts every
// call, its queue wait included; usage is the settled usage; the stream's
// first chunk and the chunks after it are timed; failures carry error.type
// from the project's codes, or the status.
func TestGenAIMetrics(t *testing.T) {
	next := make(chan struct{})
	var r *rig
	r = newRig(t, nil, func(w http.ResponseWriter, req *http.Request) bool {
		switch req.Header.Get("X-Case") {
		case "stream":
			w.Header().Set("Content-Type", "text/event-stream")
			for i, ev := range []string{`{"choices":[{"delta":{"content":"a"}}]}`, `{"choices":[{"delta":{"content":"b"}}]}`,
				`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`} {
				if i > 0 {
					<-next // the client has read the last chunk
					r.clock.Advance(time.Second)
				}
				fmt.Fprintf(w, "data: %s\n\n", ev)
				w.(http.Flusher).Flush()
			}
			return true
		case "fail":
			r.clock.Advance(time.Second)
			w.WriteHeader(http.StatusInternalServerError)
			return true
		}
		r.clock.Advance(2 * time.Second)
		fmt.Fprint(w, `{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7}}`)
		return true
	})

	if code, err := r.call(3 * time.Second); err != nil || code != 200 {
		t.Fatalf("queued call: %d %v", code, err)
	}

	req, _ := http.NewRequest(http.MethodPost, r.gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"protolabs/smart","stream":true}`))
	req.Header.Set("X-Case", "stream")
	res, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(res.Body)
	chunks := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") {
			chunks++
			if chunks < 3 {
				next <- struct{}{}
			}
		}
	}
	res.Body.Close()
	if chunks != 3 {
		t.Fatalf("%d chunks", chunks)
	}

	req, _ = http.NewRequest(http.MethodPost, r.gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"protolabs/smart"}`))
	req.Header.Set("X-Case", "fail")
	res, err = r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 500 {
		t.Fatalf("failing call: %d", res.StatusCode)
	}

	if code, err := r.call(limiter.DefaultQueueTimeout); err != nil || code != 503 {
		t.Fatalf("timed out call: %d %v", code, err)
	}

	m := genaiPoints(t, r)
	u, _ := url.Parse(r.gw.URL)
	dur, ok := m["gen_ai.client.operation.duration"].(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("no gen_ai.client.operation.duration: %v", m)
	}
	byErr := map[string]metricdata.HistogramDataPoint[float64]{}
	var calls uint64
	for _, p := range dur.DataPoints {
		for k, want := range map[attribute.Key]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
			"gen_ai.request.model": "protolabs/smart", "server.address": u.Hostname(), "server.port": u.Port()} {
			if got := attrString(p.Attributes, k); got != want {
				t.Errorf("duration %v: %s %q, want %q", p.Attributes.ToSlice(), k, got, want)
			}
		}
		byErr[attrString(p.Attributes, "error.type")] = p
		calls += p.Count
	}
	if calls != 4 {
		t.Fatalf("the duration counts %d calls, want 4", calls)
	}
	// The queued call: 3 s waiting and 2 s at the gateway; the stream 2 s.
	if p := byErr[""]; p.Count != 2 || p.Sum != 7 {
		t.Errorf("successful calls: %d, %v s; want 2 calls, 7 s (the queue wait included)", p.Count, p.Sum)
	}
	if p := byErr["500"]; p.Count != 1 || p.Sum != 1 {
		t.Errorf("the 500: %d, %v s; want 1 call of 1 s", p.Count, p.Sum)
	}
	if p := byErr["lane_queue_timeout"]; p.Count != 1 || p.Sum != limiter.DefaultQueueTimeout.Seconds() {
		t.Errorf("the queue timeout: %d, %v s; want 1 call of %v", p.Count, p.Sum, limiter.DefaultQueueTimeout)
	}

	usage, ok := m["gen_ai.client.token.usage"].(metricdata.Histogram[int64])
	if !ok {
		t.Fatalf("no gen_ai.client.token.usage: %v", m)
	}
	sums := map[string]int64{}
	for _, p := range usage.DataPoints {
		if attrString(p.Attributes, "error.type") != "" || attrString(p.Attributes, "gen_ai.request.model") != "protolabs/smart" {
			t.Errorf("usage %v", p.Attributes.ToSlice())
		}
		sums[attrString(p.Attributes, "gen_ai.token.type")] += p.Sum
	}
	if sums["input"] != 16 || sums["output"] != 10 {
		t.Errorf("token usage %v, want input 16 and output 10 (the answers' usage)", sums)
	}

	first, ok := m["gen_ai.client.operation.time_to_first_chunk"].(metricdata.Histogram[float64])
	per, ok2 := m["gen_ai.client.operation.time_per_output_chunk"].(metricdata.Histogram[float64])
	if !ok || !ok2 || len(first.DataPoints) != 1 || len(per.DataPoints) != 1 {
		t.Fatalf("chunk metrics: %v %v", m["gen_ai.client.operation.time_to_first_chunk"], m["gen_ai.client.operation.time_per_output_chunk"])
	}
	// A first byte at once is noted as 1 ns (0 means none came).
	if p := first.DataPoints[0]; p.Count != 1 || p.Sum > 1e-6 {
		t.Errorf("time to the first chunk: %d, %v s; want the stream, at once", p.Count, p.Sum)
	}
	if p := per.DataPoints[0]; p.Count != 2 || math.Abs(p.Sum-2) > 1e-6 {
		t.Errorf("time per chunk: %d chunks, %v s; want the 2 after the first, 1 s apart", p.Count, p.Sum)
	}
}

// A provider named for an upstream's base URL names its calls' series.
func TestGenAIProviderByBase(t *testing.T) {
	r := newRig(t, nil, nil)
	r.b.SetProviders(map[string]string{r.gw.URL + "/v1/": "azure.ai.openai"})
	if code, err := r.call(0); err != nil || code != 200 {
		t.Fatalf("call: %d %v", code, err)
	}
	dur := genaiPoints(t, r)["gen_ai.client.operation.duration"].(metricdata.Histogram[float64])
	if len(dur.DataPoints) != 1 || attrString(dur.DataPoints[0].Attributes, "gen_ai.provider.name") != "azure.ai.openai" {
		t.Fatalf("duration %+v", dur.DataPoints)
	}
}
