package main

import (
	"encoding/json"
	"fmt"
	"log"
	"strconv"
	"strings"
	"time"
)

// overloadParams are the overload measurement's settings.
type overloadParams struct {
	Capacity   int       `json:"capacity"`    // the gateway's C, and the lane's limit
	WorkMs     int       `json:"work_ms"`     // a call's work at full speed
	TimeoutS   int       `json:"timeout_s"`   // the SDK-like client's timeout per attempt
	MaxRetries int       `json:"max_retries"` // its retries
	WarmS      int       `json:"warm_s"`
	WindowS    int       `json:"window_s"`
	NoLoadS    int       `json:"no_load_s"`
	Levels     []float64 `json:"levels"` // the load, in multiples of C
}

// overloadPaths are what the overload measurement compares: the two
// proxies as the same lane, and the gateway with no limiter in front.
var overloadPaths = []string{"lanes", "haproxy", "none"}

var overloadNames = map[string]string{"lanes": "lanes-exporter", "haproxy": "HAProxy", "none": "no limiter"}

// levelKey names a load level in the samples: "2x".
func levelKey(l float64) string { return strconv.FormatFloat(l, 'g', -1, 64) + "x" }

// capacityPerMin is the most calls the gateway completes a minute.
func (p overloadParams) capacityPerMin() float64 {
	return float64(p.Capacity) * 60000 / float64(p.WorkMs)
}

// overload: for each load level and path, a fresh gateway of capacity C,
// the path in front of it, and SDK-like callers arriving at level x C's
// rate; first each path's no-load latency, interactive calls one at a
// time.
func (b *bench) overload() error {
	p := b.p.Overload
	log.Printf("overload: a gateway of capacity %d, calls of %d ms, load %v x capacity", p.Capacity, p.WorkMs, p.Levels)
	run := func(path string, rate float64, warm, window int) error {
		gw, err := startSelf(b.self, "gateway", "-role", "gateway", "-c", strconv.Itoa(p.Capacity), "-ms", strconv.Itoa(p.WorkMs))
		if err != nil {
			return err
		}
		defer gw.stop()
		stats := gw.url + "/stats"
		gw.url += "/v1/chat/completions"
		url := gw.url
		if path != "none" {
			px, err := b.startOverloadProxy(path, gw.url, p.Capacity)
			if err != nil {
				return err
			}
			defer px.stop()
			url = px.url
		}
		out, err := loadCommand(b.self, []string{"-mode", "overload", "-url", url, "-stats", stats,
			"-rate", strconv.FormatFloat(rate, 'f', 3, 64), "-warm", strconv.Itoa(warm), "-d", fmt.Sprint(time.Duration(window) * time.Second),
			"-timeout", strconv.Itoa(p.TimeoutS), "-retries", strconv.Itoa(p.MaxRetries)}).Output()
		if err != nil {
			return fmt.Errorf("%s: load: %w", path, err)
		}
		var r overloadResult
		if err := json.Unmarshal(out, &r); err != nil {
			return err
		}
		b.addOverload(path, rate, r)
		return nil
	}
	for _, path := range overloadPaths {
		if err := run(path, 0, 0, p.NoLoadS); err != nil {
			return err
		}
	}
	for i, l := range p.Levels {
		for j := range overloadPaths {
			path := overloadPaths[(i+j)%len(overloadPaths)]
			log.Printf("overload: %s at %s", path, levelKey(l))
			if err := run(path, l*p.capacityPerMin()/60, p.WarmS, p.WindowS); err != nil {
				return err
			}
		}
	}
	return nil
}

// startOverloadProxy starts a proxy as the lane in front of the gateway:
// lanes-exporter on its defaults but for the limit (its interactive
// reserve, deadline and queue timeout the documented ones), HAProxy as in
// haproxyConfig.
func (b *bench) startOverloadProxy(path, gateway string, limit int) (*proc, error) {
	if path == "lanes" {
		return startLanes(b.o.lanes, b.dir, gateway, limit, true, nil)
	}
	return startHAProxy(b.dir, gateway, limit)
}

// addOverload keeps a run's figures: rate 0 is the no-load latency.
func (b *bench) addOverload(path string, rate float64, r overloadResult) {
	if rate == 0 {
		b.s.add(path, "noload_p50_ms", median(r.InteractiveOkMs))
		return
	}
	p := b.p.Overload
	level := levelKey(rate * 60 / p.capacityPerMin())
	pre := "overload_" + level + "_"
	b.s.add(path, pre+"calls_per_min", float64(r.Ok)*60/r.WindowS)
	if len(r.InteractiveOkMs) > 0 { // none answered: no latency to show
		b.s.add(path, pre+"interactive_p50_ms", quantile(r.InteractiveOkMs, 0.5))
		b.s.add(path, pre+"interactive_p99_ms", quantile(r.InteractiveOkMs, 0.99))
	}
	failed := 0.0
	if r.Calls > 0 {
		failed = 100 * float64(r.Calls-r.Ok) / float64(r.Calls)
	}
	b.s.add(path, pre+"failed_pct", failed)
	wasted := 0.0
	if w := r.Gateway.UsefulS + r.Gateway.WastedS; w > 0 {
		wasted = 100 * r.Gateway.WastedS / w
	}
	b.s.add(path, pre+"wasted_pct", wasted)
	retries := 0.0
	if r.Calls > 0 {
		retries = 100 * float64(r.Retries) / float64(r.Calls)
	}
	b.s.add(path, pre+"retries_per_100", retries)
	b.s.add(path, pre+"max_at_gateway", float64(r.Gateway.MaxActive))
}

// quantile of sorted v; 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[min(len(v)-1, int(q*float64(len(v))))]
}

// overloadRows are the figures of each load level.
var overloadRows = []struct{ key, label string }{
	{"calls_per_min", "calls answered a minute"},
	{"interactive_p50_ms", "interactive p50, ms"},
	{"interactive_p99_ms", "interactive p99, ms"},
	{"wasted_pct", "backend work wasted, %"},
	{"retries_per_100", "SDK retries per 100 calls"},
	{"failed_pct", "calls failed, %"},
	{"max_at_gateway", "most calls at the gateway at once"},
}

// overloadSection renders the table and checks lanes-exporter's goals: at
// 2x and above, at least 95% of the gateway's capacity answered, the
// interactive p99 under twice its no-load latency, at most 5% of the
// backend's work wasted.
func overloadSection(p overloadParams, s samples, r *report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Goodput under overload\n\n"+
		"A gateway of capacity C = %d (calls of %d ms of work; past C calls at work it shares itself among them, as a batching "+
		"model server does, and stops a call whose client goes) and callers arriving at random (Poisson) at 1x to 3x the rate it "+
		"completes, in the mix %s. Each caller is an SDK-like client (`internal/tools/proxybench/sdkload.go`): the official OpenAI "+
		"SDKs' rules, timeout %d s per attempt stated in `X-Stainless-Timeout`, %d retries of a timeout, a lost connection, 408, 409, "+
		"429 or 5xx unless `x-should-retry` says otherwise, Retry-After honoured. The same load goes through lanes-exporter "+
		"(a lane of C on its documented defaults), HAProxy as the same lane, and straight to the gateway; a fresh gateway and proxy "+
		"for each run, %d s of warm-up, then %d s measured. *Calls answered a minute* counts callers answered 2xx; C completes "+
		"%.0f a minute. *Interactive* latencies are a caller's, retries included; no-load: interactive calls one at a time for %d s. "+
		"*Wasted*: the gateway's work on calls whose client had gone, of all its work. *Most calls at the gateway*: "+
		"HAProxy frees a slot when its client aborts, before the gateway has seen the connection close, so its count can pass C "+
		"by the calls being stopped.\n\n",
		p.Capacity, p.WorkMs, mixText(), p.TimeoutS, p.MaxRetries, p.WarmS, p.WindowS, p.capacityPerMin(), p.NoLoadS)
	fmt.Fprintf(&b, "| load | measure | %s | %s | %s |\n| --- | --- | ---: | ---: | ---: |\n",
		overloadNames["lanes"], overloadNames["haproxy"], overloadNames["none"])
	fmt.Fprintf(&b, "| none | interactive p50, ms |")
	for _, path := range overloadPaths {
		fmt.Fprintf(&b, " %s |", spread(s[path+"/noload_p50_ms"]))
	}
	b.WriteString("\n")
	for _, l := range p.Levels {
		pre := "overload_" + levelKey(l) + "_"
		for _, row := range overloadRows {
			fmt.Fprintf(&b, "| %s | %s |", levelKey(l), row.label)
			for _, path := range overloadPaths {
				v := s[path+"/"+pre+row.key]
				cell := spread(v)
				if row.key == "max_at_gateway" && len(v) > 0 {
					cell = fmt.Sprintf("%.0f", median(v))
				}
				if len(v) == 0 && len(s[path+"/"+pre+"calls_per_min"]) > 0 {
					cell = "none answered"
				}
				if row.key == "calls_per_min" && len(v) > 0 {
					cell += fmt.Sprintf(" (%.0f%% of C)", 100*median(v)/p.capacityPerMin())
				}
				fmt.Fprintf(&b, " %s |", cell)
			}
			b.WriteString("\n")
		}
		if l < 2 {
			continue
		}
		calls := median(s["lanes/"+pre+"calls_per_min"])
		r.Goals = append(r.Goals, goal{fmt.Sprintf("overload %s: lanes-exporter answers at least 95%% of the gateway's capacity a minute", levelKey(l)),
			fmt.Sprintf("%.0f of %.0f calls/min = %.0f%% (HAProxy %.0f%%, no limiter %.0f%%)", calls, p.capacityPerMin(), 100*calls/p.capacityPerMin(),
				100*median(s["haproxy/"+pre+"calls_per_min"])/p.capacityPerMin(), 100*median(s["none/"+pre+"calls_per_min"])/p.capacityPerMin()),
			calls >= 0.95*p.capacityPerMin()})
		p99, base := median(s["lanes/"+pre+"interactive_p99_ms"]), median(s["lanes/noload_p50_ms"])
		ms := func(path string) string {
			if v := s[path+"/"+pre+"interactive_p99_ms"]; len(v) > 0 {
				return fmt.Sprintf("%.0f ms", median(v))
			}
			return "none answered"
		}
		r.Goals = append(r.Goals, goal{fmt.Sprintf("overload %s: lanes-exporter's interactive p99 under 2x its no-load latency", levelKey(l)),
			fmt.Sprintf("%s vs %.0f ms = %.2fx (HAProxy %s, no limiter %s)", ms("lanes"), base, p99/base, ms("haproxy"), ms("none")),
			p99 > 0 && p99 < 2*base})
		wasted := median(s["lanes/"+pre+"wasted_pct"])
		r.Goals = append(r.Goals, goal{fmt.Sprintf("overload %s: at most 5%% of the backend's work wasted on callers gone, through lanes-exporter", levelKey(l)),
			fmt.Sprintf("%.1f%% (HAProxy %.1f%%, no limiter %.1f%%)", wasted, median(s["haproxy/"+pre+"wasted_pct"]), median(s["none/"+pre+"wasted_pct"])),
			wasted <= 5})
	}
	return b.String()
}

func mixText() string {
	var parts []string
	for _, m := range classMix {
		parts = append(parts, fmt.Sprintf("%.0f%% %s", 100*m.weight, m.class))
	}
	return strings.Join(parts, ", ")
}
