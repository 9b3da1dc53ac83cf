package lanehttp_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// BenchmarkRoundTrip measures one non-streaming chat completion on loopback
// through a bare http.Transport, and through a lanehttp.Transport with the
// limiter off and on (uncontended): the difference is what the lane adds
// per call (reading and checking the body, the slot, the guards, the
// exchange report).
func BenchmarkRoundTrip(b *testing.B) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}]}`)
	}))
	defer gw.Close()
	body := `{"model":"protolabs/smart","messages":[{"role":"user","content":"` + strings.Repeat("hi ", 100) + `"}],"stream":false}`
	url := gw.URL + "/v1/chat/completions"

	run := func(b *testing.B, rt http.RoundTripper) {
		client := &http.Client{Transport: rt}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			res, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	lanes := func(limit int, timeouts bool) http.RoundTripper {
		lim, _ := limiter.New(limiter.Config{MaxInflight: limit})
		t := &lanehttp.Transport{Limiter: lim, Base: &http.Transport{}}
		if timeouts {
			t.ResponseHeaderTimeout, t.StallTimeout = 60e9, 60e9
		}
		return t
	}
	b.Run("chat/bare", func(b *testing.B) { run(b, &http.Transport{}) })
	b.Run("chat/lanes-off", func(b *testing.B) { run(b, lanes(0, false)) })
	b.Run("chat/lanes", func(b *testing.B) { run(b, lanes(64, false)) })
	b.Run("chat/lanes-timeouts", func(b *testing.B) { run(b, lanes(64, true)) })
}

// canned answers every request at once from memory, so that the benchmark
// below measures the transport itself, without the network's noise.
type canned struct{}

func (canned) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{"ok":true}`)), Request: r}, nil
}

// BenchmarkOverhead measures what the lane adds to one call, against the
// bare base transport, with no network in between.
func BenchmarkOverhead(b *testing.B) {
	body := `{"model":"protolabs/smart","messages":[{"role":"user","content":"` + strings.Repeat("hi ", 100) + `"}],"stream":false}`
	run := func(b *testing.B, rt http.RoundTripper) {
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw/v1/chat/completions", strings.NewReader(body))
			res, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	lanes := func(limit int, timeouts bool) http.RoundTripper {
		lim, _ := limiter.New(limiter.Config{MaxInflight: limit})
		t := &lanehttp.Transport{Limiter: lim, Base: canned{}}
		if timeouts {
			t.ResponseHeaderTimeout, t.StallTimeout = 60e9, 60e9
		}
		return t
	}
	b.Run("call/bare", func(b *testing.B) { run(b, canned{}) })
	b.Run("call/lanes-off", func(b *testing.B) { run(b, lanes(0, true)) })
	b.Run("call/lanes-no-timeouts", func(b *testing.B) { run(b, lanes(64, false)) })
	b.Run("call/lanes", func(b *testing.B) { run(b, lanes(64, true)) })
}

// BenchmarkEstimate measures the token estimate of a chat completion whose
// one user message is 1, 4 and 16 KiB of English text: what admitting a
// call by its cost adds, per KiB of prompt.
func BenchmarkEstimate(b *testing.B) {
	for _, kib := range []int{1, 4, 16} {
		text := strings.Repeat("The gateway slows down and every caller retries at once. ", kib*1024/57+1)[:kib*1024]
		body := []byte(fmt.Sprintf(`{"model":"protolabs/smart","messages":[{"role":"system","content":"You review diffs."},{"role":"user","content":%q}],"max_tokens":512,"stream":true}`, text))
		b.Run(fmt.Sprintf("prompt-%dKiB", kib), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				_ = lanehttp.EstimateTokens(body, 1024)
			}
		})
	}
}

// BenchmarkRoute measures what admission reads of a body, finding its
// model (ModelOf) and estimating its tokens (EstimateTokens), for a 1 MiB
// body whose top-level keys are plain and for one of the same size whose
// keys are written with escapes ("\u0061"): a client chooses its body, and
// the escapes must not cost it more than about twice the plain one.
func BenchmarkRoute(b *testing.B) {
	const size = 1 << 20
	for _, kind := range []string{"plain-keys", "escaped-keys"} {
		var body bytes.Buffer
		body.WriteString(`{"model":"protolabs/smart"`)
		for i := 0; body.Len() < size; i++ {
			if kind == "plain-keys" {
				fmt.Fprintf(&body, `,"key%06d":1`, i)
			} else {
				fmt.Fprintf(&body, `,"\u006b%06d":1`, i)
			}
		}
		body.WriteString(`}`)
		b.Run(kind, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(body.Len()))
			for b.Loop() {
				if _, _, err := lanehttp.ModelAndEstimate(body.Bytes(), 1024); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
