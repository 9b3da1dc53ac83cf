package lanehttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// DefaultMaxBodyBytes is the largest model-call body a Transport reads when
// MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 32 << 20

// apiPaths are the endpoints of model calls; the rest of the URL path before
// them is the base URL of the lane.
var apiPaths = [...]string{"/chat/completions", "/completions", "/responses", "/messages"}

// IsModelCall reports whether req is a model call: a POST whose path ends in
// /chat/completions, /completions, /responses or /messages.
func IsModelCall(req *http.Request) bool {
	_, ok := splitAPIPath(req.URL.Path)
	return ok && req.Method == http.MethodPost
}

func splitAPIPath(path string) (base string, ok bool) {
	path = strings.TrimSuffix(path, "/")
	for _, p := range apiPaths {
		if strings.HasSuffix(path, p) {
			return strings.TrimSuffix(path, p), true
		}
	}
	return "", false
}

// BaseURL returns the resolved base URL of a model call: scheme, host and
// the path before the API path, without user info or query
// ("https://gw/v1" for "https://key@gw/v1/chat/completions?x=1").
func BaseURL(req *http.Request) string {
	base, _ := splitAPIPath(req.URL.Path)
	return req.URL.Scheme + "://" + strings.ToLower(req.URL.Host) + base
}

// DefaultLane names the lane of a model call: BaseURL(req) + "|" + model.
func DefaultLane(req *http.Request, model string) string {
	return BaseURL(req) + "|" + model
}

// Errors of a model call's body, wrapped in a *RequestError.
var (
	ErrBodyTooLarge = errors.New("request body too large")
	ErrNotJSON      = errors.New("request body is not a JSON object")
	ErrNoModel      = errors.New(`request body has no "model" string`)
)

// RequestError is a model call refused before it was sent.
type RequestError struct {
	URL   string // without user info or query
	Limit int64  // MaxBodyBytes, for ErrBodyTooLarge
	Err   error  // ErrBodyTooLarge, ErrNotJSON or ErrNoModel, possibly wrapping the JSON error
}

func (e *RequestError) Error() string {
	if errors.Is(e.Err, ErrBodyTooLarge) {
		return fmt.Sprintf("lanehttp: %s: %v: over %d bytes", e.URL, e.Err, e.Limit)
	}
	return fmt.Sprintf("lanehttp: %s: %v", e.URL, e.Err)
}

func (e *RequestError) Unwrap() error { return e.Err }

// readModel reads a model call's body (up to limit bytes) and returns it
// with the model it names.
func readModel(body io.Reader, limit int64) ([]byte, string, error) {
	if body == nil {
		return nil, "", ErrNotJSON
	}
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, "", err
	}
	if int64(len(b)) > limit {
		return nil, "", ErrBodyTooLarge
	}
	model, err := ModelOf(b)
	return b, model, err
}

// ModelOf returns the "model" of a JSON object, or an error wrapping
// ErrNotJSON or ErrNoModel. The whole body must be valid JSON; only the
// model is kept.
func ModelOf(body []byte) (string, error) {
	var v struct {
		Model json.RawMessage `json:"model"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	var m string
	if len(v.Model) == 0 || bytes.Equal(v.Model, []byte("null")) || json.Unmarshal(v.Model, &m) != nil || m == "" {
		return "", ErrNoModel
	}
	return m, nil
}
