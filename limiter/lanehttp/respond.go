package lanehttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

// Codes of the JSON errors of synthesized responses to calls that got no
// slot.
const (
	// QueueTimeoutCode: the call waited the whole queue timeout (503,
	// x-should-retry: false, Retry-After).
	QueueTimeoutCode = "lane_queue_timeout"
	// LaneLimitCode: the call's lane does not exist and max_lanes lanes do
	// (503, x-should-retry: false).
	LaneLimitCode = "lane_limit_reached"
	// ShuttingDownCode: the process is shutting down (503, retryable, to
	// another instance).
	ShuttingDownCode = "lane_shutting_down"
	// LaneUnavailableCode: the lane is shared and its store is unreachable,
	// with the backend set to refuse calls then (503, retryable).
	LaneUnavailableCode = "lane_unavailable"
)

// ErrorBody is the OpenAI-style JSON error of a synthesized response:
// {"error": {"message", "type", "code", "param", ...}}. The lane fields are
// set for a queue timeout only.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the "error" object of an ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Param   *string `json:"param"`

	Lane          string   `json:"lane,omitempty"`
	Priority      string   `json:"priority,omitempty"`
	WaitedS       *float64 `json:"waited_s,omitempty"`
	Position      int      `json:"position,omitempty"`
	Queued        int      `json:"queued,omitempty"`
	MaxInflight   int      `json:"max_inflight,omitempty"`
	QueueTimeoutS *float64 `json:"queue_timeout_s,omitempty"`
	RetryAfterS   *float64 `json:"retry_after_s,omitempty"`
}

// QueueTimeoutBody returns the JSON error that answers a queue timeout.
func QueueTimeoutBody(e *limiter.QueueTimeoutError) ErrorBody {
	waited, timeout, after := round1(e.Waited.Seconds()), round1(e.QueueTimeout.Seconds()), round1(e.RetryAfter.Seconds())
	return ErrorBody{ErrorDetail{
		Message: e.Error(), Type: "queue_timeout", Code: QueueTimeoutCode,
		Lane: e.Lane, Priority: e.Priority.String(), WaitedS: &waited, Position: e.Position,
		Queued: e.Queued, MaxInflight: e.Limit, QueueTimeoutS: &timeout, RetryAfterS: &after,
	}}
}

// QueueTimeoutResponse returns the synthesized answer to a queue timeout:
// 503 with x-should-retry: false (the official SDKs do not retry it),
// Retry-After in whole seconds (the estimate of e.RetryAfter, for a person
// or a scheduler deciding when to send the work again), and the JSON error
// of QueueTimeoutBody.
func QueueTimeoutResponse(req *http.Request, e *limiter.QueueTimeoutError) *http.Response {
	res := NewErrorResponse(req, http.StatusServiceUnavailable, QueueTimeoutBody(e))
	res.Header.Set("Retry-After", strconv.FormatInt(int64(max(time.Second, e.RetryAfter)/time.Second), 10))
	return res
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// NewErrorResponse returns a synthesized response to req with the given
// status and JSON error, marked x-should-retry: false so that the official
// SDKs do not retry it.
func NewErrorResponse(req *http.Request, status int, body ErrorBody) *http.Response {
	b, _ := json.Marshal(body)
	h := make(http.Header, 4)
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	return &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)),
		Request:       req,
	}
}

// requestErrorBody returns the status and JSON error for a refused request.
func requestErrorBody(e *RequestError) (int, ErrorBody) {
	status, code := http.StatusBadRequest, "invalid_json"
	switch {
	case errors.Is(e.Err, ErrBodyTooLarge):
		status, code = http.StatusRequestEntityTooLarge, "request_too_large"
	case errors.Is(e.Err, ErrNoModel):
		code = "missing_model"
	}
	return status, ErrorBody{ErrorDetail{Message: e.Error(), Type: "invalid_request_error", Code: code}}
}

// QueueTimeoutFrom returns the queue timeout that a response synthesized by
// a Transport (or by lanes-exporter) reports, reading its body and putting
// it back. For openai-go, pass (*openai.Error).Response.
func QueueTimeoutFrom(res *http.Response) (*limiter.QueueTimeoutError, bool) {
	if res == nil || res.StatusCode != http.StatusServiceUnavailable || res.Body == nil {
		return nil, false
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return nil, false
	}
	var eb ErrorBody
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code != QueueTimeoutCode {
		return nil, false
	}
	d := eb.Error
	p, _ := limiter.ParsePriority(d.Priority)
	e := &limiter.QueueTimeoutError{Lane: d.Lane, Priority: p, Position: d.Position, Queued: d.Queued, Limit: d.MaxInflight}
	if d.WaitedS != nil {
		e.Waited = time.Duration(*d.WaitedS * float64(time.Second))
	}
	if d.QueueTimeoutS != nil {
		e.QueueTimeout = time.Duration(*d.QueueTimeoutS * float64(time.Second))
	}
	if d.RetryAfterS != nil {
		e.RetryAfter = time.Duration(*d.RetryAfterS * float64(time.Second))
	}
	return e, true
}
