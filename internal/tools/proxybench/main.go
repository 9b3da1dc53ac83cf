// Command proxybench measures lanes-exporter as its users see it, beside
// HAProxy configured as the same lane: a gateway, each proxy and the load
// generator each in a process of their own, on loopback, in interleaved
// rounds. It prints one JSON object, the goals checked and a Markdown
// section, which internal/tools/benchreport puts into docs/BENCHMARKS.md.
//
//	go run ./internal/tools/proxybench -lanes path/to/lanes-exporter
//
// It plays every part itself: -role upstream is the gateway (-role
// gateway the overloadable one of the overload measurement), -role floor
// the least a Go proxy on net/http does for the same lane (serveFloor),
// -role load the load generator; without -role it starts them, the
// proxies, and measures.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"time"
)

func main() {
	role := flag.String("role", "", "upstream | gateway | floor | load (internal: the parts it starts)")
	// The load generator's flags.
	mode := flag.String("mode", "latency", "load: latency | throughput | queue | priority | overload")
	url := flag.String("url", "", "load: where calls go; floor: the gateway")
	n := flag.Int("n", 1000, "load: calls (latency, queue) or the backlog (priority)")
	conc := flag.Int("c", 64, "load: concurrent callers (throughput) or the lane's limit (priority); floor: the lane's limit; gateway: its capacity")
	dur := flag.Duration("d", 3*time.Second, "load: how long (throughput)")
	ms := flag.Int("ms", 1000, "load: how long each bulk call holds its slot (priority); gateway: a call's work at full speed")
	h2 := flag.Bool("h2", false, "load: HTTP/2 cleartext (prior knowledge) instead of HTTP/1.1")
	stats := flag.String("stats", "", "load (overload): the gateway's /stats")
	rate := flag.Float64("rate", 0, "load (overload): calls a second; 0: interactive calls one at a time")
	warm := flag.Int("warm", 0, "load (overload): seconds before the measured window")
	timeout := flag.Int("timeout", 5, "load (overload): the SDK-like client's timeout per attempt, seconds")
	retries := flag.Int("retries", 2, "load (overload): the SDK-like client's retries")
	listen := flag.String("listen", "", "upstream, floor: listen here (by hand, to profile a proxy) instead of on the listener handed over")
	// The orchestrator's.
	var o options
	flag.StringVar(&o.lanes, "lanes", "", "the lanes-exporter binary (required)")
	flag.IntVar(&o.rounds, "rounds", 5, "interleaved rounds of every measurement")
	flag.IntVar(&o.calls, "calls", 3000, "sequential calls per latency measurement")
	flag.StringVar(&o.variant, "variant", "", "also measure latency and CPU of a lanes-exporter run with this environment, space-separated (GOMAXPROCS=1 ...)")
	flag.StringVar(&o.only, "only", "", "measure only these, comma-separated: latency,throughput,priority,memory,overload (default all)")
	render := flag.String("render", "", "render the figures of this saved run (its JSON output) again, without measuring")
	flag.BoolVar(&o.quick, "quick", false, "a short run (tests): fewer calls, rounds and queued calls")
	flag.Parse()
	log.SetFlags(log.Ltime)
	log.SetPrefix("proxybench: ")

	listener := func() net.Listener {
		var ln net.Listener
		var err error
		if *listen != "" {
			ln, err = net.Listen("tcp", *listen)
		} else {
			ln, err = net.FileListener(os.NewFile(3, "listener"))
		}
		if err != nil {
			log.Fatal(err)
		}
		return ln
	}
	switch *role {
	case "upstream":
		log.Fatal(serveUpstream(listener()))
	case "gateway":
		log.Fatal(serveGateway(listener(), *conc, time.Duration(*ms)*time.Millisecond))
	case "floor":
		log.Fatal(serveFloor(listener(), *url, *conc))
	case "load":
		if *mode == "overload" {
			r, err := runOverload(*url, *stats, *rate, time.Duration(*warm)*time.Second, *dur, time.Duration(*timeout)*time.Second, *retries)
			if err != nil {
				log.Fatal(err)
			}
			json.NewEncoder(os.Stdout).Encode(r)
			return
		}
		var r loadResult
		var err error
		switch *mode {
		case "latency":
			r, err = runLatency(*url, *n, *h2)
		case "throughput":
			r, err = runThroughput(*url, *conc, *dur, *h2)
		case "queue":
			err = runQueue(*url, *n, *h2)
		case "priority":
			r, err = runPriority(*url, *conc, *n, *ms)
		default:
			log.Fatalf("unknown -mode %q", *mode)
		}
		if err != nil {
			log.Fatal(err)
		}
		if *mode != "queue" {
			json.NewEncoder(os.Stdout).Encode(r)
		}
	case "":
		if *render != "" {
			rep, err := rerender(*render)
			if err != nil {
				log.Fatal(err)
			}
			json.NewEncoder(os.Stdout).Encode(rep)
			return
		}
		if o.lanes == "" {
			log.Fatal("-lanes is required")
		}
		rep, err := measure(o)
		if err != nil {
			log.Fatal(err)
		}
		json.NewEncoder(os.Stdout).Encode(rep)
	default:
		log.Fatalf("unknown -role %q", *role)
	}
}
