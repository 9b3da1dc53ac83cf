// Package replay replays the #209 incident of ADR-0115 and the risks the
// ADR names, in virtual time: three review panels of five bulk finders, a
// stream of coder calls and an operator's chat on one gateway that slows
// past its capacity, through several set-ups side by side:
//
//   - "no-limiter": clients as the SDKs behave (a request timeout, retries
//     with backoff), nothing bounding what is in flight;
//   - "lanes": the same clients through a lane below the gateway's
//     capacity with one slot reserved for interactive calls;
//   - "gateway-429": the gateway answers 429 at once above a limit
//     (LiteLLM-style), and the clients retry as the SDKs do;
//   - "shared-exporter": several agents through one shared lane, against
//     "lanes" with one lane per agent (TwoProcesses).
//
// Run is a discrete-event simulation: the real limiter and the
// classification route run on one fake clock with a model of the gateway
// (gatewaysim's, in virtual time) and of the SDKs, so a run is exact and
// repeatable whatever the machine's load. RunHTTP replays the same load
// over loopback through the real transport against gatewaysim, on a scaled
// clock, and measures how far the machine's scheduling lag bent it.
package replay
