package lanehttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/llmlanes/llmlanes/limiter"
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
// the path before the API path, without user info or query, spelt as
// limiter.BaseKey spells it ("https://gw/v1" for
// "https://key@GW:443/v1/chat/completions?x=1").
func BaseURL(req *http.Request) string {
	base, _ := splitAPIPath(req.URL.EscapedPath())
	return limiter.BaseKey(req.URL.Scheme, req.URL.Host, base)
}

// DefaultLane names the lane of a model call: BaseURL(req) + "|" + model,
// as limiter.LaneKey does.
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

// readBody reads a model call's body (up to limit bytes). A declared
// length over the limit is refused without reading; otherwise memory
// grows with the bytes that actually arrive, never with what the request
// declares.
func readBody(body io.Reader, length, limit int64) ([]byte, error) {
	if body == nil || body == http.NoBody {
		return nil, ErrNotJSON
	}
	if length > limit {
		return nil, ErrBodyTooLarge
	}
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, ErrBodyTooLarge
	}
	return b, nil
}

// ModelOf returns the "model" of a JSON object, or an error wrapping
// ErrNotJSON or ErrNoModel. The whole body must be valid JSON. Like
// encoding/json (and the Python gateways), it takes the last "model" if
// the key repeats, so the lane is the model the gateway will serve.
//
// It validates with json.Valid and then walks only the object's top-level
// keys, so that finding the model costs no allocation beyond the string.
func ModelOf(body []byte) (string, error) {
	if err := validObject(body); err != nil {
		return "", err
	}
	var model []byte
	found := false
	var buf keyBuf
	for i := skipSpace(body, skipSpace(body, 0)+1); body[i] != '}'; {
		k := i
		i = skipString(body, i)
		key := keyName(body[k:i], &buf)
		i = skipSpace(body, i)
		i = skipSpace(body, i+1) // the colon
		v := i
		i = skipValue(body, i)
		if string(key) == "model" {
			model, found = body[v:i], true
		}
		i = skipSpace(body, i)
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return modelName(model, found)
}

// modelAndEstimate returns what ModelOf and EstimateTokens return for
// body, walking it once: the transport's way, so that a body is validated
// once and its keys read once, whatever it holds.
func modelAndEstimate(body []byte, defaultOutput int64) (string, Estimate, error) {
	if err := validObject(body); err != nil {
		return "", Estimate{}, err
	}
	e, model, found := estimate(body, defaultOutput)
	m, err := modelName(model, found)
	return m, e, err
}

// validObject checks that body is valid JSON and an object: the walks
// below read only that.
func validObject(body []byte) error {
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v) // only to say what is wrong
		return fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	if body[skipSpace(body, 0)] != '{' {
		return ErrNotJSON
	}
	return nil
}

// modelName returns the model named by the JSON value model (found: the
// key was there), or ErrNoModel.
func modelName(model []byte, found bool) (string, error) {
	if !found || len(model) < 3 || model[0] != '"' { // absent, null, not a string, or ""
		return "", ErrNoModel
	}
	if inner := model[1 : len(model)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var m string
	if json.Unmarshal(model, &m) != nil || m == "" {
		return "", ErrNoModel
	}
	return m, nil
}

// keyBuf holds a key that keyName decoded: the names the package looks
// for are all shorter.
type keyBuf [32]byte

// keyName returns the JSON string key (quotes included) as text, for
// comparing with the short ASCII names the package looks for: the key
// itself when it has no escape, else its escapes decoded into buf, once,
// with no allocation (a client that writes every key with escapes costs
// no more than one that does not). A key that decodes to anything longer
// than buf, or beyond ASCII, cannot be one of those names: it is nil.
func keyName(key []byte, buf *keyBuf) []byte {
	s := key[1 : len(key)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		return s
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			i++
			switch s[i] {
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				r := 0
				for _, h := range s[i+1 : i+5] { // valid JSON: four hex digits
					r <<= 4
					switch {
					case h >= '0' && h <= '9':
						r |= int(h - '0')
					case h >= 'a' && h <= 'f':
						r |= int(h-'a') + 10
					default:
						r |= int(h-'A') + 10
					}
				}
				if r >= utf8.RuneSelf {
					return nil
				}
				c, i = byte(r), i+4
			default: // " \ /
				c = s[i]
			}
		} else if c >= utf8.RuneSelf {
			return nil
		}
		if n == len(buf) {
			return nil
		}
		buf[n] = c
		n++
	}
	return buf[:n]
}

// The skip functions walk JSON already known to be valid.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// skipValue returns the index just past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}
