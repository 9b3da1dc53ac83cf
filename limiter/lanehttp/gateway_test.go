package lanehttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

const model = "protolabs/smart"

// seen is one request as the gateway received it.
type seen struct {
	ID    string // X-Test-Call
	Path  string
	Model string
	Retry string // X-Stainless-Retry-Count
}

// gateway is a real OpenAI-compatible server on loopback. By default it
// answers chat completions (streamed in three chunks when asked); a test can
// take over any request with handle.
type gateway struct {
	srv *httptest.Server
	// done closes when the test ends, before the server is closed, so that
	// a handler parked by a failed test gives way instead of hanging Close.
	done   chan struct{}
	mu     sync.Mutex
	log    []seen
	handle func(w http.ResponseWriter, r *http.Request, s seen) bool
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{done: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(func() {
		close(g.done)
		g.srv.Close()
	})
	return g
}

func (g *gateway) url() string { return g.srv.URL + "/v1" }

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	s := seen{ID: r.Header.Get("X-Test-Call"), Path: r.URL.Path, Model: req.Model, Retry: r.Header.Get("X-Stainless-Retry-Count")}
	g.mu.Lock()
	g.log = append(g.log, s)
	h := g.handle
	g.mu.Unlock()
	if h != nil && h(w, r, s) {
		return
	}
	if req.Stream {
		g.streamChunks(w, req.Model, []string{"Hello", " ", "world"}, nil, r.Context())
		return
	}
	writeCompletion(w, req.Model, "Hello world")
}

func (g *gateway) seen() []seen {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]seen(nil), g.log...)
}

func (g *gateway) ids() []string {
	var ids []string
	for _, s := range g.seen() {
		ids = append(ids, s.ID)
	}
	return ids
}

func writeCompletion(w http.ResponseWriter, model, text string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, model, text)
}

// streamChunks sends an SSE stream; after the first chunk it waits for hold
// to close (or the request or the test to end), if hold is not nil.
func (g *gateway) streamChunks(w http.ResponseWriter, model string, parts []string, hold <-chan struct{}, ctx context.Context) {
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	for i, p := range parts {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", model, p)
		f.Flush()
		if i == 0 && hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
				return
			case <-g.done:
				return
			}
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	f.Flush()
}

// rig is a limiter on a fake clock, a Transport over a fresh http.Transport,
// and an observer that reports queued calls by X-Test-Call id.
type rig struct {
	t        *testing.T
	clock    *limitertest.Clock
	lim      *limiter.Limiter
	tr       *lanehttp.Transport
	hc       *http.Client
	enqueued chan string
	acquired chan string
	gw       *gateway
}

type callKey struct{}

func newRig(t *testing.T, cfg limiter.Config) *rig {
	r := &rig{t: t, clock: limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC)),
		enqueued: make(chan string, 4096), acquired: make(chan string, 4096)}
	obs := func(ctx context.Context, e limiter.Event) {
		id, _ := ctx.Value(callKey{}).(string)
		switch e.Kind {
		case limiter.Enqueued:
			r.enqueued <- id
		case limiter.Acquired:
			r.acquired <- id
		}
	}
	lim, err := limiter.New(cfg, limiter.WithClock(r.clock), limiter.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	r.lim = lim
	// The test gateway stops a call's work when its client goes (its
	// handlers watch the request's context): the tests of the abandoned
	// call's hold (abandon_test.go) turn this off.
	r.tr = &lanehttp.Transport{Limiter: lim, Base: base, CancelPropagates: true}
	r.hc = &http.Client{Transport: r.tr}
	r.gw = newGateway(t)
	return r
}

func on(n int) limiter.Config {
	c := limiter.DefaultConfig()
	c.MaxInflight = n
	return c
}

// ctx returns a context that names the call (for the observer and, through
// the openai client's header, for the gateway) and carries its class.
func callCtx(id string, p limiter.Priority) context.Context {
	return context.WithValue(limiter.WithPriority(context.Background(), p), callKey{}, id)
}

func (r *rig) client(opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(r.gw.url() + "/"), option.WithAPIKey("sk-test"),
		option.WithHTTPClient(r.hc), option.WithMaxRetries(0),
	}, opts...)...)
	return &c
}

func params() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
}

func (r *rig) lane() string { return r.gw.url() + "|" + model }

func (r *rig) snapshot() limiter.LaneSnapshot {
	r.t.Helper()
	for _, l := range r.lim.Snapshot().Lanes {
		if l.Lane == r.lane() {
			return l
		}
	}
	return limiter.LaneSnapshot{Lane: r.lane()}
}

func (r *rig) expectCounts(inflight, queued int) {
	r.t.Helper()
	if l := r.snapshot(); l.Inflight != inflight || l.Queued != queued {
		r.t.Fatalf("lane: inflight %d queued %d, want %d and %d", l.Inflight, l.Queued, inflight, queued)
	}
}

// sendAsync sends req on the rig's client in the background; the error
// (nil once the answer's body was read whole) comes on the channel.
func (r *rig) sendAsync(req *http.Request) chan error {
	done := make(chan error, 1)
	go func() {
		res, err := r.hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		done <- err
	}()
	return done
}

func (r *rig) waitEnqueued(id string) {
	r.t.Helper()
	select {
	case got := <-r.enqueued:
		if got != id {
			r.t.Fatalf("enqueued %q, want %q", got, id)
		}
	case <-time.After(10 * time.Second):
		r.t.Fatalf("%s never queued", id)
	}
}

// hold takes the lane's only slot directly, as another call would.
func (r *rig) hold() limiter.Slot {
	r.t.Helper()
	s, err := r.lim.Acquire(context.Background(), r.lane())
	if err != nil {
		r.t.Fatal(err)
	}
	<-r.acquired
	return s
}

// streamText reads an openai-go stream to the end.
func streamText(s interface {
	Next() bool
	Current() openai.ChatCompletionChunk
	Err() error
}) (string, error) {
	var b strings.Builder
	for s.Next() {
		for _, c := range s.Current().Choices {
			b.WriteString(c.Delta.Content)
		}
	}
	return b.String(), s.Err()
}
