package exporter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// tenantGateway records each call's X-Test-Call and headers as it
// arrives, then holds the call until the test sends one value on release.
type tenantGateway struct {
	srv      *httptest.Server
	arrivals chan string
	release  chan struct{}
	mu       sync.Mutex
	hdrs     []http.Header
}

func newTenantGateway(t *testing.T) *tenantGateway {
	g := &tenantGateway{arrivals: make(chan string, 100), release: make(chan struct{})}
	done := make(chan struct{})
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		g.mu.Lock()
		g.hdrs = append(g.hdrs, r.Header.Clone())
		g.mu.Unlock()
		g.arrivals <- r.Header.Get("X-Test-Call")
		select {
		case <-g.release:
		case <-done:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(func() { close(done); g.srv.Close() })
	return g
}

func (g *tenantGateway) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-g.arrivals:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the gateway")
		return ""
	}
}

func tenantPost(url, id, tenant string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/proxy/gw/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Call", id)
	req.Header.Set(PriorityHeader, "bulk")
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// sendTenant posts call id as tenant's through the proxy at url in the
// background, on wg; anything but a 200 fails t.
func sendTenant(t *testing.T, wg *sync.WaitGroup, url, id, tenant string) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		if code, body, err := tenantPost(url, id, tenant); err != nil || code != 200 {
			t.Errorf("%s: %d %s %v", id, code, body, err)
		}
	}()
}

// waitLane waits until the lane's snapshot satisfies ok.
func waitLane(t *testing.T, srv *Server, ok func(limiter.LaneSnapshot) bool) limiter.LaneSnapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ls := srv.Limiter().Snapshot().Lanes; len(ls) == 1 && ok(ls[0]) {
			return ls[0]
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the lane never got there: %+v", srv.Limiter().Snapshot().Lanes)
	return limiter.LaneSnapshot{}
}

// Through the proxy: in a lane of 2 held by tenant A, A queues 20 bulk
// calls, then tenant B queues 2. B's first call is granted within the
// next two grants, not after A's twenty; X-LLM-Tenant never reaches the
// gateway. Each step frees one slot and waits for the one call it lets
// through, so the order is the lane's and nothing else's.
func TestProxyTenantFairShare(t *testing.T) {
	g := newTenantGateway(t)
	front, srv, _ := newFront(t, fmt.Sprintf(`
limiter: {max_inflight: 2, interactive_reserve: 0, queue_timeout: 300s}
proxy: {response_header_timeout: 20s}
upstreams:
  - {name: gw, base_url: %s}
`, g.srv.URL), false)
	var wg sync.WaitGroup
	send := func(id, tenant string) { sendTenant(t, &wg, front.URL, id, tenant) }
	send("a-run-1", "board-a")
	send("a-run-2", "board-a")
	got := map[string]bool{g.next(t): true, g.next(t): true}
	if !got["a-run-1"] || !got["a-run-2"] {
		t.Fatalf("first at the gateway: %v", got)
	}
	for i := 1; i <= 20; i++ {
		send(fmt.Sprintf("a-%d", i), "board-a")
		waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == i })
	}
	for i := 1; i <= 2; i++ {
		send(fmt.Sprintf("b-%d", i), "board-b")
		waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 20+i })
	}
	l := waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return true })
	if len(l.Tenants) != 3 || l.Tenants[0].Tenant != "board-a" || l.Tenants[0].Queued != 20 || l.Tenants[0].Inflight != 2 ||
		l.Tenants[1].Tenant != "board-b" || l.Tenants[1].Queued != 2 {
		t.Fatalf("snapshot tenants %+v", l.Tenants)
	}
	var order []string
	for range 22 {
		g.release <- struct{}{}
		order = append(order, g.next(t))
	}
	first := -1
	for i, id := range order {
		if strings.HasPrefix(id, "b-") {
			first = i
			break
		}
	}
	if first < 0 || first > 1 {
		t.Fatalf("board-b's first call was grant %d after it queued, want one of the next two: %v", first+1, order)
	}
	for range 2 {
		g.release <- struct{}{}
	}
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range g.hdrs {
		if h.Get(TenantHeader) != "" {
			t.Fatal("X-LLM-Tenant reached the gateway")
		}
	}
}

// A bad X-LLM-Tenant is a 400 naming the header, and nothing is queued or
// forwarded; a tenant_from of another header reads that one.
func TestProxyTenantHeaderRefused(t *testing.T) {
	g := newTenantGateway(t)
	front, srv, _ := newFront(t, fmt.Sprintf(`
limiter: {max_inflight: 2}
upstreams:
  - {name: gw, base_url: %s}
`, g.srv.URL), false)
	for _, bad := range []string{strings.Repeat("x", 65), "board a", "board/a", "bøard", "a\"b"} {
		code, body, err := tenantPost(front.URL, "bad", bad)
		if err != nil || code != 400 || !strings.Contains(body, `"invalid_tenant"`) || !strings.Contains(body, "X-LLM-Tenant") {
			t.Fatalf("tenant %q: %d %s %v", bad, code, body, err)
		}
	}
	if n := len(srv.Limiter().Snapshot().Lanes); n != 0 {
		t.Fatalf("%d lanes after refused calls", n)
	}
	select {
	case id := <-g.arrivals:
		t.Fatalf("%s reached the gateway", id)
	default:
	}
	if _, err := parseTenantFrom("header:X-Team"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"headers", "header:", "header:a b", "cookie"} {
		if _, err := parseTenantFrom(bad); err == nil {
			t.Fatalf("tenant_from %q accepted", bad)
		}
	}
}

// tenant_from: credential names a caller by a short hash of its
// credential: the same key is the same tenant, and the secret is in no
// tenant name.
func TestTenantFromCredential(t *testing.T) {
	src, err := parseTenantFrom("credential")
	if err != nil {
		t.Fatal(err)
	}
	req := func(h, v string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		if h != "" {
			r.Header.Set(h, v)
		}
		return r
	}
	a, _ := src.tenantOf(req("Authorization", "Bearer sk-secret-one"))
	a2, _ := src.tenantOf(req("Authorization", "Bearer sk-secret-one"))
	b, _ := src.tenantOf(req("X-Api-Key", "sk-secret-two"))
	none, _ := src.tenantOf(req("", ""))
	if a != a2 || a == b || !strings.HasPrefix(a, "cred:") || len(a) != len("cred:")+12 || strings.Contains(a, "secret") || none != "" {
		t.Fatalf("tenants %q %q %q %q", a, a2, b, none)
	}
	if err := limiter.ValidTenant(a); err != nil {
		t.Fatal(err)
	}
}

// The tenants' series: one per tenant the lane tracks, past
// limits.max_tenants under "other", and gone with their lane.
func TestTenantSeriesBounded(t *testing.T) {
	g := newTenantGateway(t)
	front, srv, _ := newFront(t, fmt.Sprintf(`
limiter: {max_inflight: 8}
limits: {max_tenants: 2, lane_idle_ttl: 1s}
upstreams:
  - {name: gw, base_url: %s}
`, g.srv.URL), false)
	var wg sync.WaitGroup
	for _, tn := range []string{"t1", "t2", "t3", "t4"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenantPost(front.URL, tn, tn)
		}()
		g.next(t)
	}
	l := waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Inflight == 4 })
	names := map[string]int{}
	for _, s := range l.AllTenants {
		names[s.Tenant] = s.Inflight
	}
	if len(names) != 4 || names["t1"] != 1 || names["t2"] != 1 || names["other"] != 2 || names["default"] != 0 {
		t.Fatalf("tenants %+v, want t1, t2, other (2) and default", l.AllTenants)
	}
	_, metrics := get(t, front.URL+"/metrics")
	for _, want := range []string{`llmlanes_llm_tenant_inflight{lane="`, `tenant="other"} 2`, `llmlanes_llm_tenant_queue_depth{`, `llmlanes_llm_tenant_service_seconds_total{`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
	if strings.Contains(metrics, `tenant="t3"`) {
		t.Fatal("a tenant past the bound has its own series")
	}
	for range 4 {
		g.release <- struct{}{}
	}
	wg.Wait()
	l = waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Inflight == 0 })
	for _, s := range l.AllTenants {
		if s.Tenant != "default" && s.Service <= 0 {
			t.Fatalf("tenant %+v: no slot-time counted", s)
		}
	}
}

// limiter.fairness.max_inflight_per_tenant through the proxy: with slots
// free, a tenant at its cap waits and another tenant's call goes through;
// its call goes on once its slot is given back. Idle past lane_idle_ttl
// (a fake clock), the lane's tenant series go with it.
func TestProxyTenantCapAndSeriesEnd(t *testing.T) {
	g := newTenantGateway(t)
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	srv := newTestServerWith(t, fmt.Sprintf(`
limiter: {max_inflight: 4, fairness: {max_inflight_per_tenant: 1}}
limits: {lane_idle_ttl: 10m}
proxy: {response_header_timeout: 1h}
upstreams:
  - {name: gw, base_url: %s}
`, g.srv.URL), Options{Clock: clock})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	front := httptest.NewServer(srv.Handler())
	t.Cleanup(front.Close)
	var wg sync.WaitGroup
	send := func(id, tenant string) { sendTenant(t, &wg, front.URL, id, tenant) }
	send("a-1", "board-a")
	if id := g.next(t); id != "a-1" {
		t.Fatalf("first at the gateway: %s", id)
	}
	send("a-2", "board-a")
	waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Queued == 1 && l.Inflight == 1 })
	send("b-1", "board-b")
	if id := g.next(t); id != "b-1" {
		t.Fatalf("with 3 slots free, %s reached the gateway, want board-b's call (board-a is at its cap)", id)
	}
	g.release <- struct{}{} // one of the two held calls ends
	g.release <- struct{}{}
	if id := g.next(t); id != "a-2" {
		t.Fatalf("after the releases %s reached the gateway, want a-2", id)
	}
	g.release <- struct{}{}
	wg.Wait()
	waitLane(t, srv, func(l limiter.LaneSnapshot) bool { return l.Inflight == 0 })
	_, metrics := get(t, front.URL+"/metrics")
	if !strings.Contains(metrics, `tenant="board-a"`) {
		t.Fatal("no tenant series to begin with")
	}
	clock.Advance(12 * time.Minute)
	if _, metrics = get(t, front.URL+"/metrics"); strings.Contains(metrics, "llm_tenant_") || srv.Limiter().Lanes() != 0 {
		t.Fatalf("the idle lane's tenant series are still there:\n%s", metrics)
	}
}
