package exporter

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// rotatorRun drives, on the fake clock, a lane of 2 slots through the
// proxy with three clients that each keep 3 calls outstanding: two honest
// tenants (board-a, board-b) and a third that names tenant "rot", or with
// rotate a new name per call (rot-1, rot-2, ...). The gateway holds every
// call until the test answers it: the oldest first, one a second, steps
// times. It returns the calls each client got through.
func rotatorRun(t *testing.T, rotate bool, steps int) map[string]int {
	t.Helper()
	clock := limitertest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var pending []chan struct{}
	closing := false // the test is over: answer at once
	got := map[string]int{}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, rest, _ := strings.Cut(string(b), "client ")
		client := rest[:1]
		done := make(chan struct{})
		mu.Lock()
		if closing {
			mu.Unlock()
			return
		}
		got[client]++
		pending = append(pending, done)
		mu.Unlock()
		select {
		case <-done:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}`)
	}))
	srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 2, interactive_reserve: 0}\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", gw.URL), Options{Clock: clock})
	front := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		mu.Lock()
		closing = true
		for _, c := range pending {
			close(c)
		}
		pending = nil
		mu.Unlock()
		wg.Wait()
		front.Close()
		gw.Close()
		srv.Shutdown(context.Background())
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var outstanding, names atomic.Int64
	call := func(who, tenant string) int {
		code, _ := postChat(ctx, client, front.URL, "m", tenant, "client "+who)
		return code
	}
	loop := func(who, tenant string) {
		defer wg.Done()
		for ctx.Err() == nil {
			name := tenant
			if who == "R" && rotate {
				name = fmt.Sprintf("rot-%d", names.Add(1))
			}
			if code := call(who, name); code != 200 && ctx.Err() == nil {
				t.Errorf("client %s: status %d", who, code)
			}
		}
		outstanding.Add(-1)
	}
	for _, c := range [][2]string{{"A", "board-a"}, {"B", "board-b"}, {"R", "rot"}} {
		for range 3 {
			outstanding.Add(1)
			wg.Add(1)
			go loop(c[0], c[1])
		}
	}
	// settle waits until each loop's call is at the gateway or queued,
	// and both slots are held.
	settle := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			var queued, inflight int
			if ls := srv.Limiter().Snapshot().Lanes; len(ls) > 0 {
				queued, inflight = ls[0].Queued, ls[0].Inflight
			}
			mu.Lock()
			atGateway := len(pending)
			mu.Unlock()
			if int(outstanding.Load()) == queued+atGateway && inflight == atGateway && atGateway == 2 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("calls neither at the gateway nor queued: %d outstanding, %d queued, %d in flight, %d at the gateway", outstanding.Load(), queued, inflight, atGateway)
			}
		}
	}
	for range steps {
		settle()
		clock.Advance(time.Second)
		mu.Lock()
		first := pending[0]
		pending = pending[1:]
		mu.Unlock()
		close(first)
	}
	settle()
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(got)
}

// A caller that names a new tenant for every call used to get 134 grants
// against 51 for each of two honest tenants (80/78/78 with fixed names):
// every new name was lifted level with the tenant served next, and won
// the tie. Newcomers are now lifted to the lane's newcomers' mark, which
// each moves on by its charge: the names of one rotator are served as one
// tenant. Through the proxy, on the fake clock, 300 calls answered one a
// second: the rotator gets at most 1.5 times an honest tenant's grants.
func TestProxyRotatingTenant(t *testing.T) {
	for _, rotate := range []bool{false, true} {
		got := rotatorRun(t, rotate, 300)
		honest := min(got["A"], got["B"])
		t.Logf("rotating %v: grants %v", rotate, got)
		if float64(got["R"]) > 1.5*float64(honest) {
			t.Errorf("rotating %v: the third client got %d grants, over 1.5 × the honest tenants' %d", rotate, got["R"], honest)
		}
		if honest < 80 {
			t.Errorf("rotating %v: an honest tenant got %d of 300 grants, want about a third", rotate, honest)
		}
	}
}

// A rotator's names are forgotten once idle, so that the table of names
// (limits.max_tenants, 100 by default) has room for the tenants active
// after it: 150 calls of a rotator that makes up a name for each fill it,
// and a tenant that comes next is "other"; 6 minutes later, one is tracked
// by its own name again, and the rotator's are gone.
func TestProxyRotatorForgotten(t *testing.T) {
	clock := limitertest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(gw.Close)
	srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 2}\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", gw.URL), Options{Clock: clock})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	call := func(tenant string) {
		t.Helper()
		if code, _ := postChat(context.Background(), http.DefaultClient, front.URL, "m", tenant, "hi"); code != 200 {
			t.Fatalf("%s: status %d", tenant, code)
		}
	}
	tenants := func() []string {
		var names []string
		for _, ts := range srv.Limiter().Snapshot().Lanes[0].AllTenants {
			names = append(names, ts.Tenant)
		}
		slices.Sort(names)
		return names
	}
	for i := range 150 {
		call(fmt.Sprintf("rot-%d", i))
		clock.Advance(100 * time.Millisecond)
	}
	call("late")
	if names := tenants(); slices.Contains(names, "late") || !slices.Contains(names, limiter.OtherTenant) || len(names) != limiter.DefaultMaxTenants+2 {
		t.Fatalf("after 150 names the table holds %d tenants (late among them: %v), want %d named, other and default, late folded into other",
			len(names), slices.Contains(names, "late"), limiter.DefaultMaxTenants)
	}
	clock.Advance(6 * time.Minute)
	call("later")
	if names := tenants(); !slices.Equal(names, []string{limiter.DefaultTenant, "later"}) {
		t.Fatalf("6 minutes on, the tenants are %v, want only default and later: the rotator's names and other forgotten", names)
	}
}

// Tenant series are bounded across lanes, not only per lane: with
// limits.max_tenant_series 10, three models (lanes) of six tenants each
// show 10 tenants by name on /metrics and the rest as "other", one series
// per lane at most.
func TestProxyTenantSeriesBound(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(gw.Close)
	srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 2}\nlimits: {max_tenant_series: 10}\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", gw.URL), Options{})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	for m := range 3 {
		for tn := range 6 {
			if code, _ := postChat(context.Background(), http.DefaultClient, front.URL, fmt.Sprint("m", m), fmt.Sprint("t", tn), "hi"); code != 200 {
				t.Fatalf("model m%d, tenant t%d: status %d", m, tn, code)
			}
		}
	}
	_, metrics := get(t, front.URL+"/metrics")
	var named, other int
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, "llmlanes_llm_tenant_service_seconds_total{") {
			continue
		}
		if strings.Contains(line, `tenant="other"`) {
			other++
		} else {
			named++
		}
	}
	if named != 10 || other != 2 {
		t.Fatalf("tenant service series: %d by name and %d other, want 10 (the bound) and 2 (the lanes past it)\n%s", named, other, metrics)
	}
}

// postChat posts a chat completion of model, saying content, to the proxy at
// front's upstream gw as tenant (none if ""), and returns its status and
// headers, its body read and closed; 0 and nil if the request failed.
func postChat(ctx context.Context, c *http.Client, front, model, tenant, content string) (int, http.Header) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front+"/proxy/gw/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":10}`, model, content)))
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, nil
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header
}
