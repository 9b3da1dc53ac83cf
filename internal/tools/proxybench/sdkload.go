package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sdkCaller makes a call as the official OpenAI SDKs do (openai-node and
// openai-python's _base_client, read for this): each attempt has the
// call's timeout, stated in X-Stainless-Timeout (whole seconds, as
// openai-node sends a per-request timeout) and numbered in
// X-Stainless-Retry-Count; up to maxRetries retries of an attempt that
// timed out, lost its connection, or was answered 408, 409, 429 or 5xx,
// unless the answer says x-should-retry (false: never; true: always);
// before a retry it sleeps the answer's Retry-After (retry-after-ms, or
// seconds) when above 0 and at most 60 s, else
// min(0.5 s x 2^retry, 8 s) less up to a quarter at random.
type sdkCaller struct {
	client     *http.Client
	url        string
	timeout    time.Duration
	maxRetries int
}

// sdkOutcome is one call's end.
type sdkOutcome struct {
	class    string
	ok       bool
	attempts int
	start    time.Time
	end      time.Time
}

const sdkBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func (c *sdkCaller) call(ctx context.Context, class string, rng *rand.Rand) sdkOutcome {
	o := sdkOutcome{class: class, start: time.Now()}
	for retry := 0; ; retry++ {
		o.attempts++
		status, h, err := c.attempt(ctx, class, retry)
		if err == nil && status < 300 {
			o.ok = true
			break
		}
		if ctx.Err() != nil || retry >= c.maxRetries || !shouldRetry(status, h) {
			break
		}
		select {
		case <-time.After(retryDelay(retry, h, rng)):
		case <-ctx.Done():
		}
	}
	o.end = time.Now()
	return o
}

// attempt makes one attempt: its status and headers, or the error of one
// that got no answer (its timeout, a lost connection): status 0 then.
func (c *sdkCaller) attempt(ctx context.Context, class string, retry int) (int, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(sdkBody))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-LLM-Priority", class)
	req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(retry))
	req.Header.Set("X-Stainless-Timeout", strconv.Itoa(int(c.timeout.Seconds())))
	res, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		return 0, nil, err
	}
	return res.StatusCode, res.Header, nil
}

// shouldRetry is the SDKs' rule; status 0 is an attempt with no answer.
func shouldRetry(status int, h http.Header) bool {
	if status == 0 {
		return true
	}
	switch h.Get("X-Should-Retry") {
	case "true":
		return true
	case "false":
		return false
	}
	return status == 408 || status == 409 || status == 429 || status >= 500
}

func retryDelay(retry int, h http.Header, rng *rand.Rand) time.Duration {
	if h != nil {
		if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 && ms <= 60000 {
			return time.Duration(ms * float64(time.Millisecond))
		}
		if s, err := strconv.ParseFloat(h.Get("Retry-After"), 64); err == nil && s > 0 && s <= 60 {
			return time.Duration(s * float64(time.Second))
		}
	}
	d := min(0.5*math.Pow(2, float64(retry)), 8)
	return time.Duration(d * (1 - 0.25*rng.Float64()) * float64(time.Second))
}

// overloadResult is what the overload load generator prints: its figures
// over the measured window, and the gateway's over the same window.
type overloadResult struct {
	Calls            int       `json:"calls"`   // calls that ended in the window
	Ok               int       `json:"ok"`      // of them, answered
	Retries          int       `json:"retries"` // their attempts beyond the first
	InteractiveOkMs  []float64 `json:"interactive_ok_ms"`
	InteractiveCalls int       `json:"interactive_calls"`
	WindowS          float64   `json:"window_s"`
	Gateway          struct {
		Completed int     `json:"completed"`
		UsefulS   float64 `json:"useful_s"`
		WastedS   float64 `json:"wasted_s"`
		MaxActive int     `json:"max_active"` // the most calls at work at once, up to the window's end
	} `json:"gateway"`
}

// classMix is the overload's mix of classes: each call's class drawn with
// these weights.
var classMix = []struct {
	class  string
	weight float64
}{{"interactive", 0.1}, {"default", 0.3}, {"bulk", 0.6}}

func drawClass(rng *rand.Rand) string {
	x := rng.Float64()
	for _, m := range classMix {
		if x < m.weight {
			return m.class
		}
		x -= m.weight
	}
	return classMix[len(classMix)-1].class
}

// runOverload sends calls at rate a second, Poisson arrivals, for warm then
// window, each an SDK-like call; calls that end inside the window are
// counted, and the gateway's counts (statsURL) read at its start and end.
// With rate 0 it makes calls interactive calls one after another instead
// (the no-load latency).
func runOverload(url, statsURL string, rate float64, warm, window, timeout time.Duration, maxRetries int) (overloadResult, error) {
	var r overloadResult
	sdk := &sdkCaller{client: client(false, 4096), url: url, timeout: timeout, maxRetries: maxRetries}
	rng := rand.New(rand.NewPCG(1, 2))
	if rate == 0 {
		end := time.Now().Add(window)
		for time.Now().Before(end) {
			o := sdk.call(context.Background(), "interactive", rng)
			r.Calls++
			r.InteractiveCalls++
			if o.ok {
				r.Ok++
				r.InteractiveOkMs = append(r.InteractiveOkMs, float64(o.end.Sub(o.start).Microseconds())/1000)
			}
		}
		r.WindowS = window.Seconds()
		return r, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var outcomes []sdkOutcome
	t0 := time.Now()
	from, to := t0.Add(warm), t0.Add(warm+window)
	var before, after gatewayStats
	var statsErr error
	statsRead := make(chan struct{})
	go func() {
		defer close(statsRead)
		time.Sleep(time.Until(from))
		before, statsErr = readGatewayStats(statsURL)
		time.Sleep(time.Until(to))
		var err error
		after, err = readGatewayStats(statsURL)
		statsErr = errors.Join(statsErr, err)
	}()
	for next := t0; next.Before(to); next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))) {
		time.Sleep(time.Until(next))
		class := drawClass(rng)
		seed := rng.Uint64()
		go func() {
			o := sdk.call(ctx, class, rand.New(rand.NewPCG(seed, 3)))
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}()
	}
	<-statsRead // the window's end, and the gateway's counts at it
	mu.Lock()
	defer mu.Unlock()
	if statsErr != nil {
		return r, statsErr
	}
	for _, o := range outcomes {
		if o.end.Before(from) || o.end.After(to) {
			continue
		}
		r.Calls++
		r.Retries += o.attempts - 1
		if o.class == "interactive" {
			r.InteractiveCalls++
		}
		if o.ok {
			r.Ok++
			if o.class == "interactive" {
				r.InteractiveOkMs = append(r.InteractiveOkMs, float64(o.end.Sub(o.start).Microseconds())/1000)
			}
		}
	}
	slices.Sort(r.InteractiveOkMs)
	r.WindowS = window.Seconds()
	r.Gateway.Completed = after.Completed - before.Completed
	r.Gateway.UsefulS = after.UsefulS - before.UsefulS
	r.Gateway.WastedS = after.WastedS - before.WastedS
	r.Gateway.MaxActive = after.MaxActive
	return r, nil
}

func readGatewayStats(url string) (gatewayStats, error) {
	var s gatewayStats
	res, err := http.Get(url)
	if err != nil {
		return s, err
	}
	defer res.Body.Close()
	return s, json.NewDecoder(res.Body).Decode(&s)
}
