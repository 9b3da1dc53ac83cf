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

// NewError returns the OpenAI-style error body of an answer with status
// and code (one of the codes of this package): type "invalid_request_error"
// below 500, "server_error" from 500 on.
func NewError(status int, code, msg string) ErrorBody {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	return ErrorBody{ErrorDetail{Message: msg, Type: typ, Code: code}}
}

// WriteError answers w with status and the error body b, as JSON. It is
// the one writer of the error bodies that lanes-exporter sends; a
// Transport's synthesized responses (NewErrorResponse) carry the same
// bytes.
func WriteError(w http.ResponseWriter, status int, b ErrorBody) {
	body := b.encode()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// encode is the body's JSON, with a final newline.
func (b ErrorBody) encode() []byte {
	j, _ := json.Marshal(b)
	return append(j, '\n')
}

// TimeoutCode returns the code of a queue timeout: QueueTimeoutCode, or
// DeadlineCode when the caller's deadline ended the wait.
func TimeoutCode(c limiter.TimeoutCause) string {
	if c == limiter.CauseQueueTimeout {
		return QueueTimeoutCode
	}
	return DeadlineCode
}

// QueueTimeoutBody returns the JSON error that answers a queue timeout.
func QueueTimeoutBody(e *limiter.QueueTimeoutError) ErrorBody {
	waited, timeout, after := round1(e.Waited.Seconds()), round1(e.QueueTimeout.Seconds()), round1(e.RetryAfter.Seconds())
	return ErrorBody{ErrorDetail{
		Message: e.Error(), Type: "queue_timeout", Code: TimeoutCode(e.Cause),
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
	res := mustCode(TimeoutCode(e.Cause)).Response(req, QueueTimeoutBody(e))
	res.Header.Set("Retry-After", strconv.FormatInt(int64(max(time.Second, e.RetryAfter)/time.Second), 10))
	return res
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// NewErrorResponse returns a synthesized response to req with the given
// status and JSON error, marked x-should-retry: false so that the official
// SDKs do not retry it.
func NewErrorResponse(req *http.Request, status int, body ErrorBody) *http.Response {
	b := body.encode()
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

// requestErrorCode returns the code of a refused request.
func requestErrorCode(e *RequestError) Code {
	switch {
	case errors.Is(e.Err, ErrBodyTooLarge):
		return mustCode(RequestTooLargeCode)
	case errors.Is(e.Err, ErrNoModel):
		return mustCode(MissingModelCode)
	}
	return mustCode(InvalidJSONCode)
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
