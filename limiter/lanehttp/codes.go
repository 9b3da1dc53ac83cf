package lanehttp

import (
	"net/http"
	"slices"
	"strconv"
)

// The error codes: every answer that a Transport gives in place of the
// gateway's carries one of these as the "code" of its OpenAI-style body
// ({"error": {"message", "type", "code", ...}}), so that a client can
// branch on it. The table (Codes) gives each its status and what its
// x-should-retry header says; lanes-exporter sends the same codes, and
// has a table of its own for those only its proxy and routes send.
const (
	// QueueTimeoutCode: the call waited the whole queue timeout;
	// Retry-After is the estimated wait.
	QueueTimeoutCode = "lane_queue_timeout"
	// DeadlineCode: the call could not get a slot before its caller's
	// deadline (the client's timeout), so it was answered before the
	// client gave up: at the deadline less a margin, or at once when the
	// lane's estimate of the wait was longer; Retry-After is the estimated
	// wait.
	DeadlineCode = "lane_deadline"
	// LaneLimitCode: the call's lane does not exist and max_lanes lanes do.
	LaneLimitCode = "lane_limit_reached"
	// ShuttingDownCode: the process is shutting down; retryable, to
	// another instance.
	ShuttingDownCode = "lane_shutting_down"
	// LaneUnavailableCode: the lane is shared and its store is
	// unreachable, with the backend set to refuse calls then; retryable.
	LaneUnavailableCode = "lane_unavailable"
	// TokenBudgetCode: the call's token estimate is larger than a whole
	// token budget of its lane (it could never be granted); the message
	// names the budget.
	TokenBudgetCode = "token_budget_exceeded"
	// RequestTooLargeCode: the body is over the limit.
	RequestTooLargeCode = "request_too_large"
	// InvalidJSONCode: the body is not a JSON object.
	InvalidJSONCode = "invalid_json"
	// MissingModelCode: the body names no model.
	MissingModelCode = "missing_model"
	// UpstreamStallCode: the gateway sent no headers or no body within the
	// timeouts (a Transport's stall error; lanes-exporter's 504).
	UpstreamStallCode = "upstream_stall"
	// UpstreamUnreachableCode: the gateway could not be reached (a
	// Transport's transport error; lanes-exporter's 502).
	UpstreamUnreachableCode = "upstream_unreachable"
	// SlotLostCode: the call's shared slot was lost (its lease could not
	// be renewed in time: the lane's store, Redis, was unreachable), so
	// the call was stopped for the lane's limit to hold; retryable.
	SlotLostCode = "lane_slot_lost"
)

// A Code is one error code of a table: its name (the body's "code"), the
// status it is sent with, and whether it is marked x-should-retry: false
// so that the official SDKs do not retry it (else they follow their own
// rule, retrying 408, 409, 429 and 5xx).
type Code struct {
	Name    string
	Status  int
	NoRetry bool
	When    string // when it is sent, in a line (docs/OBSERVABILITY.md)
}

// codeTable is this package's table; read only.
var codeTable = []Code{
	{QueueTimeoutCode, http.StatusServiceUnavailable, true, "the call waited the whole queue timeout; Retry-After is the estimated wait"},
	{DeadlineCode, http.StatusServiceUnavailable, true, "no slot before the client's deadline (its timeout less `deadline_margin`), or a wait estimated past it (`deadline: answer_early`); answered before the client gives up; Retry-After is the estimated wait"},
	{LaneLimitCode, http.StatusServiceUnavailable, true, "the call's lane does not exist and `max_lanes` lanes do"},
	{ShuttingDownCode, http.StatusServiceUnavailable, false, "the process is shutting down: send the call again, to another instance"},
	{LaneUnavailableCode, http.StatusServiceUnavailable, false, "the lane is shared, its store (Redis) is unreachable and the backend refuses calls then; Retry-After 5"},
	{TokenBudgetCode, http.StatusRequestEntityTooLarge, true, "the call's token estimate is larger than a whole token budget of its lane"},
	{RequestTooLargeCode, http.StatusRequestEntityTooLarge, true, "the body is over the limit"},
	{InvalidJSONCode, http.StatusBadRequest, true, "the body is not a JSON object"},
	{MissingModelCode, http.StatusBadRequest, true, "the body names no model"},
	{UpstreamStallCode, http.StatusGatewayTimeout, false, "the gateway sent no headers, or no body, within the timeouts (lanes-exporter's answer; a Transport returns its error, which spans and the GenAI metrics name so)"},
	{UpstreamUnreachableCode, http.StatusBadGateway, false, "the gateway could not be reached (lanes-exporter's answer; a Transport returns its error, which spans and the GenAI metrics name so)"},
	{SlotLostCode, http.StatusServiceUnavailable, false, "the call's shared slot was lost (its lease could not be renewed: Redis unreachable), so the call was stopped before the gateway answered; send it again (lanes-exporter's answer; a Transport returns ErrSlotLost)"},
}

// Codes returns this package's table of error codes (a copy).
func Codes() []Code { return slices.Clone(codeTable) }

// CodeOf returns the code named name in this package's table.
func CodeOf(name string) (Code, bool) {
	i := slices.IndexFunc(codeTable, func(c Code) bool { return c.Name == name })
	if i < 0 {
		return Code{}, false
	}
	return codeTable[i], true
}

// mustCode returns the code named name in this package's table; a name
// not in it is a mistake of this package's.
func mustCode(name string) Code {
	c, ok := CodeOf(name)
	if !ok {
		panic("lanehttp: no error code " + strconv.Quote(name))
	}
	return c
}

// Body returns the OpenAI-style error body of an answer with this code.
func (c Code) Body(msg string) ErrorBody { return NewError(c.Status, c.Name, msg) }

// Header sets on h what this code's answers carry besides the body: its
// x-should-retry header.
func (c Code) Header(h http.Header) {
	if c.NoRetry {
		h.Set("X-Should-Retry", "false")
	} else {
		h.Del("X-Should-Retry")
	}
}

// Write answers w with this code and the body b (see WriteError).
func (c Code) Write(w http.ResponseWriter, b ErrorBody) {
	c.Header(w.Header())
	WriteError(w, c.Status, b)
}

// Response returns the synthesized response to req with this code and the
// body b.
func (c Code) Response(req *http.Request, b ErrorBody) *http.Response {
	res := NewErrorResponse(req, c.Status, b)
	c.Header(res.Header)
	return res
}
