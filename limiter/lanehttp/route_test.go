package lanehttp_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// reference is what encoding/json makes of the body: the last "model" key
// wins, and it must be a non-empty string.
func reference(body []byte) (string, error) {
	if !json.Valid(body) {
		return "", lanehttp.ErrNotJSON
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		return "", lanehttp.ErrNotJSON // valid JSON, not an object
	}
	var m string
	if raw, ok := obj["model"]; !ok || json.Unmarshal(raw, &m) != nil || m == "" {
		return "", lanehttp.ErrNoModel
	}
	return m, nil
}

var modelCases = []string{
	`{"model":"protolabs/smart","messages":[{"role":"user","content":"hi"}]}`,
	` { "messages" : [ {"model":"inner"} ] , "model" : "outer" } `,
	`{"model":"a","model":"b"}`,
	`{"mod\u0065l":"escaped-key"}`,
	`{"\u006d\u006F\u0064\u0065\u006c":"every-byte-escaped","model":"then-plain","m\u006fdel":"last-escaped"}`,
	`{"model\u0000":"nul-after","model":"x"}`,
	`{"m\u00f6del":"beyond-ascii","model":"x"}`,
	`{"\ud83d\ude00":"surrogates","model":"x"}`,
	`{"mod\"el":"quote","mod\/el":"slash","mo\\del":"backslash","model":"x"}`,
	`{"\u006d\u006f\u0064\u0065\u006c\u006d\u006f\u0064\u0065\u006c\u006d\u006f\u0064\u0065\u006c\u006d\u006f\u0064\u0065\u006c\u006d\u006f\u0064\u0065\u006c\u006d\u006f\u0064\u0065\u006c\u006d\u006f":"long","model":"x"}`,
	`{"model":"esc\"aped\u00e9"}`,
	`{"model":"\\"}`,
	`{"model":null}`, `{"model":7}`, `{"model":""}`, `{"model":{"x":"y"}}`, `{"model":["a"]}`,
	`{}`, `[]`, `"model"`, `7`, `null`, ``, `{`, `{"model":"m",}`, `{"model":"m"} x`,
	`{"a":{"b":[1,2,{"c":"}"}]},"model":"after-nesting"}`,
	`{"a":"]}","model":"after-bracket-string"}`,
	`{"a":true,"b":false,"c":null,"d":-1.5e3,"model":"after-literals"}`,
}

func TestModelOfMatchesEncodingJSON(t *testing.T) {
	for _, c := range modelCases {
		checkModel(t, []byte(c))
	}
}

func FuzzModelOf(f *testing.F) {
	for _, c := range modelCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkModel(t, body) })
}

func checkModel(t *testing.T, body []byte) {
	t.Helper()
	got, err := lanehttp.ModelOf(body)
	want, werr := reference(body)
	if got != want || !errors.Is(err, werr) || (err == nil) != (werr == nil) {
		t.Fatalf("ModelOf(%q) = %q, %v; encoding/json says %q, %v", body, got, err, want, werr)
	}
	// The transport's one walk finds the same model and the estimate the
	// estimate's own walk finds.
	m, e, err2 := lanehttp.ModelAndEstimate(body, 1024)
	if m != got || (err2 == nil) != (err == nil) || (err == nil && e != lanehttp.EstimateTokens(body, 1024)) {
		t.Fatalf("ModelAndEstimate(%q) = %q, %+v, %v; ModelOf and EstimateTokens say %q, %+v, %v",
			body, m, e, err2, got, lanehttp.EstimateTokens(body, 1024), err)
	}
}
