package exporter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// A queued stream: a streamed model call ("stream": true) that waits for
// its slot longer than proxy.stream_keepalive_every has its answer
// committed (200 text/event-stream) and an SSE comment sent every period
// while it waits, e.g. ": lane queued position=4 waited=30s", so that a
// client's read timeout (openai-python's) or an intermediary's idle
// timeout (nginx's and load balancers' 60 s) does not cut it. Whatever
// the call's answer is after that commit (a queue timeout, a deadline,
// the gateway's error status) goes to the client as the provider's own
// in-stream error event, which each official SDK raises as an error it
// does not retry: OpenAI's `data: {"error": {...}}`, Anthropic's
// `event: error`. A call granted within the period is untouched.

// keepAlive sends a queued stream's comments until stop.
type keepAlive struct {
	w        http.ResponseWriter
	rc       *http.ResponseController
	clock    limiter.Clock
	every    time.Duration
	since    time.Time
	position atomic.Int64 // the call's place in line as it queued (an observer sets it)

	mu        sync.Mutex // guards the rest, and every write to w until stop
	timer     limiter.Timer
	committed bool
	stopped   bool
}

type keepAliveKey struct{}

// keepAliveEvery returns the period of a queued stream's comments for a
// call with body and headers h, or 0 when it gets none: not a stream, or
// keepalives off. A client that states a read timeout gets its first
// comment within half of it.
func keepAliveEvery(cfg *Config, body []byte, h http.Header) time.Duration {
	// A body that does not name "stream" is not walked again (the
	// transport walks it once for its estimate).
	if cfg.Proxy.StreamKeepalive != nil && !*cfg.Proxy.StreamKeepalive || !bytes.Contains(body, []byte(`"stream"`)) ||
		!lanehttp.EstimateTokens(body, 0).Stream {
		return 0
	}
	every := time.Duration(cfg.Proxy.StreamKeepaliveEvery)
	if d, ok := lanehttp.StatedReadTimeout(h); ok {
		every = min(every, max(d/2, time.Second))
	}
	return every
}

// queuedStream starts the keepalive of a streamed call answered on w,
// with headers h and body, if it gets one (keepAliveEvery); a read timeout
// is then no deadline for it, its comments keep the timeout from firing.
// Out of line, as everything the handler does before its call waits
// (docs/DESIGN.md, "A queued call's stack").
//
//go:noinline
func queuedStream(ctx context.Context, w http.ResponseWriter, h http.Header, cfg *Config, body []byte, clock limiter.Clock) (*keepAlive, context.Context) {
	every := keepAliveEvery(cfg, body, h)
	if every == 0 {
		return nil, ctx
	}
	if _, ok := lanehttp.StatedAttemptTimeout(h); !ok {
		ctx = limiter.WithDeadline(ctx, time.Time{})
	}
	return startKeepAlive(ctx, w, clock, every)
}

// end stops k's comments once the call's wait is over, and returns the
// writer of the rest of its answer: w, or, if k committed it, a
// committedStream on w, which sends an error answer as an in-stream event
// when the reverse proxy is done with it (the event is written from
// there: the handler's frame, live while the call waits, stays as small
// as it was). A nil k returns w. Out of line, as queuedStream is.
//
//go:noinline
func (k *keepAlive) end(w http.ResponseWriter, u *upstream, r *http.Request) http.ResponseWriter {
	if k == nil || !k.stop() {
		return w
	}
	return newCommittedStream(w, u.cfg.Provider == "anthropic" || strings.HasSuffix(r.PathValue("rest"), "messages"))
}

// startKeepAlive arms the first comment of a queued stream answered on w,
// and returns ctx carrying it (for the observer that sets its position).
func startKeepAlive(ctx context.Context, w http.ResponseWriter, clock limiter.Clock, every time.Duration) (*keepAlive, context.Context) {
	k := &keepAlive{w: w, rc: http.NewResponseController(w), clock: clock, every: every, since: clock.Now()}
	k.mu.Lock()
	k.timer = clock.AfterFunc(every, k.tick)
	k.mu.Unlock()
	return k, context.WithValue(ctx, keepAliveKey{}, k)
}

// noteQueued is an observer: it gives a queued stream its place in line.
func noteQueued(ctx context.Context, e limiter.Event) {
	if e.Kind != limiter.Enqueued {
		return
	}
	if k, ok := ctx.Value(keepAliveKey{}).(*keepAlive); ok {
		k.position.Store(int64(e.Position))
	}
}

// tick commits the answer if need be and sends one comment.
func (k *keepAlive) tick() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	if !k.committed {
		h := k.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // nginx: pass the comments on as they come
		k.w.WriteHeader(http.StatusOK)
		k.committed = true
	}
	waited := k.clock.Now().Sub(k.since).Round(time.Second)
	_ = k.rc.SetWriteDeadline(time.Now().Add(k.every))
	if _, err := fmt.Fprintf(k.w, ": lane queued position=%d waited=%s\n\n", k.position.Load(), waited); err == nil {
		_ = k.rc.Flush()
	}
	_ = k.rc.SetWriteDeadline(time.Time{})
	k.timer = k.clock.AfterFunc(k.every, k.tick)
}

// stop ends the comments (a comment being sent is finished first) and
// reports whether the answer was committed.
func (k *keepAlive) stop() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	k.timer.Stop()
	return k.committed
}

// maxErrorBody bounds the error answer kept to turn into an event.
const maxErrorBody = 64 << 10

// committedStream is the ResponseWriter of a call whose answer a
// keepAlive committed: a 200 passes through (its headers were sent
// already); any other status is kept (up to maxErrorBody) and sent as the
// provider's in-stream error event as soon as it is whole: a JSON error
// once it parses, any other body at the first flush (the reverse proxy
// flushes after every write of a stream).
type committedStream struct {
	http.ResponseWriter
	anthropic bool
	header    http.Header // where the reverse proxy puts headers that can no longer be sent
	status    int
	kept      bytes.Buffer
	sent      bool // the event is out
}

func newCommittedStream(w http.ResponseWriter, anthropic bool) *committedStream {
	return &committedStream{ResponseWriter: w, anthropic: anthropic, header: http.Header{}}
}

func (c *committedStream) Header() http.Header { return c.header }

func (c *committedStream) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status = code
	}
}

func (c *committedStream) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.status == http.StatusOK {
		return c.ResponseWriter.Write(p)
	}
	if room := maxErrorBody - c.kept.Len(); room > 0 && !c.sent {
		c.kept.Write(p[:min(len(p), room)])
		if json.Valid(c.kept.Bytes()) || c.kept.Len() >= maxErrorBody {
			c.event()
		}
	}
	return len(p), nil
}

// FlushError flushes a 200's data, and sends a kept error that is not
// JSON.
func (c *committedStream) FlushError() error {
	if c.status != 0 && c.status != http.StatusOK {
		if !c.sent && c.kept.Len() > 0 && c.kept.Bytes()[0] != '{' {
			c.event()
		}
		return nil
	}
	return http.NewResponseController(c.ResponseWriter).Flush()
}

func (c *committedStream) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// event sends the kept error answer as an in-stream error event, once.
func (c *committedStream) event() {
	c.sent = true
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(c.kept.Bytes(), &body) != nil || body.Error.Message == "" {
		body.Error.Message = strings.TrimSpace(c.kept.String())
		if body.Error.Message == "" {
			body.Error.Message = http.StatusText(c.status)
		}
	}
	code, _ := body.Error.Code.(string)
	msg := fmt.Sprintf("%d %s", c.status, body.Error.Message)
	if code != "" {
		msg = fmt.Sprintf("%d %s: %s", c.status, code, body.Error.Message) // every SDK shows the message
	}
	var event []byte
	if c.anthropic {
		typ := code
		if typ == "" {
			typ = body.Error.Type
		}
		j, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
		event = append(append([]byte("event: error\ndata: "), j...), "\n\n"...)
	} else {
		j, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": body.Error.Type, "code": body.Error.Code}})
		event = append(append([]byte("data: "), j...), "\n\n"...)
	}
	c.ResponseWriter.Write(event)
	_ = http.NewResponseController(c.ResponseWriter).Flush()
}
