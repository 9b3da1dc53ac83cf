package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The example runs against a loopback gateway and sends one call through
// its lane.
func TestExampleAgainstLoopbackGateway(t *testing.T) {
	var got struct{ Model string }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &got)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello"}}]}`)
	}))
	defer srv.Close()
	t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
	t.Setenv("OPENAI_API_KEY", "sk-test")
	t.Setenv("MODEL", "protolabs/smart")
	main() // exits the test binary on error
	if got.Model != "protolabs/smart" {
		t.Fatalf("gateway saw model %q", got.Model)
	}
}
