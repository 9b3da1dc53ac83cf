// Package otelbridge makes the lanes of a limiter.Limiter visible through
// OpenTelemetry: metrics fed by the limiter's events and
// snapshot, and spans that show a model call's time queued beside its time
// at the gateway.
//
// # Wiring
//
//	b, err := otelbridge.New(otelbridge.Options{})   // spans to the global tracer provider
//	lim, err := limiter.New(cfg, limiter.WithObserver(b.Observe))
//	b.Watch(lim)                                     // the gauges read lim's snapshot
//	reader := sdkmetric.NewPeriodicReader(exporter, sdkmetric.WithProducer(b))
//	client := &http.Client{Transport: b.Transport(&lanehttp.Transport{Limiter: lim})}
//
// # Metrics
//
// The bridge keeps each lane's counters and histograms itself and hands
// them, with gauges read from the limiter's snapshot, to any reader it is
// given to as a metric Producer (sdkmetric.WithProducer). It does not use
// the SDK's synchronous instruments because they cannot forget a series,
// and lanes come and go: a client picks the model, and the limiter evicts
// idle lanes. So when the limiter evicts a lane (an Evicted event), every
// series of that lane ends, and no lane can fall into the SDK's cardinality
// overflow: the number of series follows the limiter's MaxLanes. Through
// the OpenTelemetry Prometheus exporter with namespace p, they come out as
// the series of DESIGN.md:
//
//	p_llm_inflight{lane}                       gauge
//	p_llm_queue_depth{lane,priority}           gauge, all three priorities from lane creation
//	p_llm_queue_wait_seconds{lane,priority}    histogram, buckets 0.1 0.5 1 5 15 30 60 120 300:
//	                                           every grant's wait (0 if immediate) and every
//	                                           queue timeout's whole wait
//	p_llm_queue_timeouts_total{lane}           counter
//	p_llm_queue_cancellations_total{lane}      counter: waits ended by the caller (not in the histogram)
//	p_llm_queue_gave_up_total{lane,priority,cause} counter: waits whose callers gave up, cause
//	                                           caller_gone or deadline; from a lane's first one
//	p_llm_limit{lane}, p_llm_reserve{lane}     gauges: the configured limit and reserve in force
//	p_llm_saturated{lane}                      gauge, 1 when queued > 0 has held for 60 s
//	p_llm_oldest_wait_seconds{lane}            gauge
//	p_llm_abandoned_inflight{lane}             gauge: slots held for calls whose callers left,
//	                                           until the upstream's answer ends
//	p_llm_upstream_requests_total{lane,outcome} counter: ok, client_error, rate_limited,
//	                                           server_error, transport_error, stall, canceled,
//	                                           client_stall
//	p_llm_upstream_retries_total{lane}         counter: retries seen
//	p_llm_upstream_first_byte_seconds{lane}    histogram
//
// The OpenTelemetry GenAI conventions' client metrics
// (gen_ai.client.operation.duration, gen_ai.client.token.usage and the two
// chunk timings of streamed calls) are kept the same way and produced
// apart, by GenAIProducer, so that an exporter may give them their
// conventional names (genai.go says what each spans).
//
// A lane's counters exist, at 0, from its first event, so rate() works
// before the first failure. A queue-wait sample taken inside a sampled
// trace becomes its bucket's exemplar, pointing at the call's queue-wait
// span (the latest such sample per bucket is kept).
//
// # Spans
//
// Transport opens one span per model call (kind client, named
// "chat <model>" once the model is known). The bridge adds two children
// with the limiter's clock: "llm.queue_wait", from the start of the
// acquisition to the grant (or the timeout or cancellation), and
// "llm.upstream", from sending the request to the end of the response. The
// two never overlap. Attributes follow the OpenTelemetry GenAI and HTTP
// client conventions (gen_ai.operation.name, gen_ai.request.model,
// server.address, server.port, http.request.method,
// http.response.status_code, error.type) plus llmlanes.lane,
// llmlanes.priority, llmlanes.queue.position and llmlanes.outcome. A queue
// timeout sets error.type "lane_queue_timeout", a stall "upstream_stall" and
// a gateway out of reach "upstream_unreachable": the codes of package
// lanehttp's table, which the proxy's answers carry too.
//
// # Cost
//
// An event costs a map lookup under a read lock and an atomic add or a
// short locked histogram update, and allocates nothing; spans cost what the
// tracer provider makes them cost, and nothing when they are not recording.
// docs/BENCHMARKS.md has the figures.
package otelbridge
