// Package demo is lanes-exporter --demo: a simulated gateway on loopback,
// the exporter in front of it, and a load that shows every surface. It is
// linked into lanes-exporter unless it is built with the nodemo tag
// (production builds: see the README).
package demo

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/internal/gatewaysim"
)

// Demo is a running demo: a simulated gateway on loopback, the
// exporter in front of it, and a load of interactive chats, default turns
// and bulk review-panel bursts through the proxy. Its faults come and go in
// a cycle so that every state shows up within a minute:
//
//	0-20 s    normal gateway; panel bursts queue up in the busy lane
//	          (protolabs/smart): local_queue once its p90 wait passes 10 s
//	          (the demo's threshold); the other lane (protolabs/fast, a call a
//	          second, well under its limit) is healthy
//	20-45 s   429s and 5xx from the gateway: the fast lane, not queueing,
//	          turns gateway_degraded; the busy lane stays local_queue, with
//	          the gateway's reasons listed
//	45-60 s   stalls and resets
//	60-100 s  normal again; the errors leave the 5-minute window in time
type Demo struct {
	Listener *exporter.Listener
	Sim      *gatewaysim.Gateway
	simSrv   *http.Server
	stop     context.CancelFunc
	wg       sync.WaitGroup
	client   *http.Client
}

// config is the configuration the demo runs with, given the simulator's
// base URL: lanes of 4 slots, one reserved, in front of a gateway of
// capacity 8, and a low p90 threshold, so that the queue shows as
// local_queue early.
const config = `
listen: %q
limiter: {max_inflight: 4, queue_timeout: 40s, interactive_reserve: 1}
upstreams: [{name: sim, base_url: %q, capacity: 8%s}]
proxy: {response_header_timeout: 20s, stall_timeout: 5s}
classification: {wait_p90: 10s}
`

// Start starts the simulator, the exporter on listen, and the load.
func Start(listen string, log *slog.Logger) (*Demo, error) {
	return StartWith(listen, exporter.Options{Log: log})
}

// StartWith is Start with the exporter's options (its logger, its
// OpenTelemetry setup).
func StartWith(listen string, o exporter.Options) (*Demo, error) {
	return StartGateway(listen, o, "")
}

// Gateways are the simulated gateways the demo can run against.
const (
	// GatewaySimple is a gateway that stops a call's work when its
	// client goes.
	GatewaySimple = "simple"
	// GatewayLiteLLM is gatewaysim's LiteLLM profile: a LiteLLM-like proxy
	// whose max_parallel_requests (3) is below the lanes' limit (4), so
	// that its concurrency 429s show, and which does not stop its
	// backend's work when a client goes (the lanes hold those slots).
	GatewayLiteLLM = "litellm"
)

// StartGateway is StartWith against the simulated gateway named gateway
// (GatewaySimple, the default, or GatewayLiteLLM).
func StartGateway(listen string, o exporter.Options, gateway string) (*Demo, error) {
	sc := gatewaysim.Config{Capacity: 8, TokenTime: 50 * time.Millisecond, Tokens: 40,
		FirstTokenDelay: 200 * time.Millisecond, PropagateDisconnect: true}
	upstream := ", cancel_propagates: true"
	switch gateway {
	case "", GatewaySimple:
	case GatewayLiteLLM:
		sc.PropagateDisconnect, sc.LiteLLM, upstream = false, &gatewaysim.LiteLLM{MaxParallel: 3}, ""
	default:
		return nil, fmt.Errorf("demo gateway %q: want %s or %s", gateway, GatewaySimple, GatewayLiteLLM)
	}
	sim := gatewaysim.New(sc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &Demo{Sim: sim, simSrv: &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}}
	go d.simSrv.Serve(ln)
	cfg, err := exporter.ParseConfig("(demo)", []byte(fmt.Sprintf(config, listen, "http://"+ln.Addr().String()+"/v1", upstream)))
	if err != nil {
		d.simSrv.Close()
		return nil, err
	}
	srv, err := exporter.New(cfg, o)
	if err != nil {
		d.simSrv.Close()
		return nil, err
	}
	l, err := exporter.Start(srv, cfg.Listen)
	if err != nil {
		d.simSrv.Close()
		return nil, err
	}
	d.Listener = l
	ctx, cancel := context.WithCancel(context.Background())
	d.stop = cancel
	d.load(ctx, "http://"+l.Addr+"/proxy/sim/chat/completions")
	return d, nil
}

// Stop ends the load, the exporter and the simulator.
func (d *Demo) Stop(ctx context.Context) error {
	d.stop()
	d.Sim.Close()
	d.wg.Wait()
	d.client.CloseIdleConnections()
	err := d.Listener.Shutdown(ctx)
	d.simSrv.Close()
	return err
}

func (d *Demo) every(ctx context.Context, period time.Duration, f func(i int)) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			f(i)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// load drives the proxy the way the ADR's incident did, on a small scale.
func (d *Demo) load(ctx context.Context, url string) {
	d.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	client := d.client
	// call streams one chat completion; like the official SDKs it retries
	// once after a 429 or 5xx that does not say x-should-retry: false,
	// marking the retry with X-Stainless-Retry-Count. tenant, if not "",
	// is its X-LLM-Tenant: two boards share the lane.
	call := func(priority, model, tenant string) {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for attempt := 0; attempt < 2; attempt++ {
				body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"review this diff"}]}`, model)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer sk-demo")
				req.Header.Set(exporter.PriorityHeader, priority)
				if tenant != "" {
					req.Header.Set(exporter.TenantHeader, tenant)
				}
				req.Header.Set("X-Stainless-Retry-Count", fmt.Sprint(attempt))
				res, err := client.Do(req)
				if err != nil {
					return
				}
				sc := bufio.NewScanner(res.Body)
				for sc.Scan() {
				}
				res.Body.Close()
				if res.StatusCode != http.StatusTooManyRequests && res.StatusCode < 500 || res.Header.Get("X-Should-Retry") == "false" {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(300 * time.Millisecond):
				}
			}
		}()
	}
	start := time.Now()
	d.every(ctx, time.Second, func(int) { // the fault cycle
		base := d.Sim.Config()
		base.RateLimited, base.ServerError, base.Stall, base.Reset = 0, 0, 0, 0
		switch t := time.Since(start) % (100 * time.Second); {
		case t >= 20*time.Second && t < 45*time.Second:
			base.RateLimited, base.ServerError = 0.2, 0.15
		case t >= 45*time.Second && t < 60*time.Second:
			base.Stall, base.Reset = 0.1, 0.1
		}
		d.Sim.SetConfig(base)
	})
	d.every(ctx, 3*time.Second, func(int) { call("interactive", "protolabs/smart", "") })            // an operator's chat
	d.every(ctx, 1500*time.Millisecond, func(int) { call("default", "protolabs/smart", "board-b") }) // board B's coders
	d.every(ctx, 20*time.Second, func(i int) {                                                       // three review panels of five finders: board A's, and every third board B's
		board := "board-a"
		if i%3 == 2 {
			board = "board-b"
		}
		for range 15 {
			call("bulk", "protolabs/smart", board)
		}
	})
	d.every(ctx, time.Second, func(int) { call("default", "protolabs/fast", "") }) // a second model, under its limit
}
