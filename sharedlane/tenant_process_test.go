package sharedlane

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Two lanes-exporter processes share a lane of 2 in a real redis-server.
// Tenant A holds both slots and queues 20 bulk calls, half through each
// process; then tenant B queues 2 bulk calls. B's first call is granted
// within the next two grants, not after A's twenty. Each step frees one
// slot at the gateway and waits for the one call it lets through, so the
// order is the shared lane's. A lease_ttl of 5 s, not the default 15 s:
// the lane grants nothing for one lease_ttl after Redis starts, and 5 s
// still keeps a waiter's place across a loaded machine's late renewal
// (a place that lapsed would queue again, behind the others). It reads an order, not a figure taken at
// the gateway, so it runs beside the tests that hold the process turn.
func TestTenantsShareAcrossProcesses(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	arrivals := make(chan string, 64)
	release := make(chan struct{})
	done := make(chan struct{})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		arrivals <- req.Header.Get("X-Test-Call")
		select {
		case <-release:
		case <-done:
		case <-req.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer gw.Close()
	defer close(done)
	var procs []*exporterProc
	for _, name := range []string{"p1", "p2"} {
		addr := freeAddr(t)
		procs = append(procs, runExporter(t, name, addr, fmt.Sprintf(`listen: %s
limiter: {max_inflight: 2, queue_timeout: 300s, interactive_reserve: 0}
proxy: {response_header_timeout: 60s}
upstreams: [{name: gw, base_url: "%s/v1"}]
shared: {redis_url: "%s", process: %s, lease_ttl: 5s}
`, addr, gw.URL, r.URL(), name)))
	}
	var wg sync.WaitGroup
	send := func(p *exporterProc, id, tenant string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/proxy/gw/chat/completions",
				strings.NewReader(`{"model":"protolabs/smart"}`))
			req.Header.Set("X-Test-Call", id)
			req.Header.Set("X-LLM-Priority", "bulk")
			req.Header.Set("X-LLM-Tenant", tenant)
			res, err := client.Do(req)
			if err != nil {
				t.Errorf("%s: %v", id, err)
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Errorf("%s: %d %s", id, res.StatusCode, b)
			}
		}()
	}
	next := func() string {
		t.Helper()
		select {
		case id := <-arrivals:
			return id
		case <-time.After(20 * time.Second):
			t.Fatal("no call reached the gateway")
			return ""
		}
	}
	// queued waits until the shared lane has n waiters (the snapshot's
	// figures are the lane's, from Redis).
	queued := func(n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d queued", n), func() bool {
			s := procs[0].snapshot(t)
			return s != nil && s["queued"] == float64(n)
		})
	}
	send(procs[0], "a-run-1", "board-a")
	send(procs[1], "a-run-2", "board-a")
	next()
	next()
	for i := 1; i <= 20; i++ {
		send(procs[i%2], fmt.Sprintf("a-%d", i), "board-a")
		queued(i)
	}
	for i := 1; i <= 2; i++ {
		send(procs[i%2], fmt.Sprintf("b-%d", i), "board-b")
		queued(20 + i)
	}
	var order []string
	for range 22 {
		release <- struct{}{}
		order = append(order, next())
	}
	for range 2 {
		release <- struct{}{}
	}
	wg.Wait()
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
	t.Logf("grants after board-b queued: %v", order)
}
