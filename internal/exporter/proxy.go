package exporter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/otelbridge"
)

// providerOpt names the upstream's GenAI provider in its spans, when the
// configuration says which it is.
func (s *Server) providerOpt(u Upstream) []otelbridge.TransportOption {
	if u.Provider == "" {
		return nil
	}
	return []otelbridge.TransportOption{otelbridge.WithProviderName(u.Provider)}
}

// PriorityHeader carries a proxied call's class; it is stripped before
// forwarding.
const PriorityHeader = "X-LLM-Priority"

type upstream struct {
	cfg   Upstream
	lanes *lanehttp.Transport
	proxy *httputil.ReverseProxy
}

// name is how clients see a lane of this upstream: the upstream's
// configured name and the model, never the gateway's internal address.
func (u *upstream) name(lane string) string {
	_, model := limiter.SplitLaneKey(lane)
	return u.cfg.Name + "|" + model
}

func (s *Server) newUpstream(u Upstream, cfg *Config) *upstream {
	target, _ := url.Parse(u.BaseURL) // checked
	up := &upstream{cfg: u}
	up.lanes = &lanehttp.Transport{
		Limiter:                s.lim,
		Base:                   s.base,
		Lane:                   func(_ *http.Request, model string) string { return u.BaseURL + "|" + model },
		MaxBodyBytes:           cfg.Proxy.MaxBodyBytes,
		ResponseHeaderTimeout:  time.Duration(cfg.Proxy.ResponseHeaderTimeout),
		StallTimeout:           time.Duration(cfg.Proxy.StallTimeout),
		Describe:               up.name,
		Recall:                 s.recall,
		DefaultMaxOutputTokens: cfg.Limiter.DefaultMaxOutputTokens,
		ServerTiming:           cfg.Proxy.ServerTiming == nil || *cfg.Proxy.ServerTiming,
		CancelPropagates:       u.CancelPropagates,
	}
	up.lanes.RateLimitHeaders, _ = lanehttp.ParseHeaderSource(u.Headers) // checked
	up.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out.URL
			out.Scheme, out.Host, out.User = target.Scheme, target.Host, nil
			out.Path = target.Path + "/" + pr.In.PathValue("rest")
			out.RawPath = ""
			out.RawQuery = pr.In.URL.RawQuery
			pr.Out.Host = target.Host
			pr.Out.Header.Del(PriorityHeader)
			pr.Out.Header.Del(TenantHeader)
			pr.Out.Header.Del(lanehttp.TimeoutHeader)
		},
		Transport:      s.tel.Bridge().Transport(up.lanes, s.providerOpt(u)...),
		FlushInterval:  -1, // streams pass through chunk by chunk
		ModifyResponse: func(res *http.Response) error { return up.checkPath(res, checkClientBody) },
		ErrorHandler:   s.proxyError(up),
		BufferPool:     &s.buffers,
		ErrorLog:       slogLogger(s.log),
	}
	return up
}

// bufferPool recycles 32 KiB buffers: the reverse proxy copies answers through
// them; each would otherwise allocate for every call.
type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, 32<<10)
}

func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }

// serveProxy forwards /proxy/{upstream}/<rest> to <base_url>/<rest>.
//
// A model call's body is read here first, as it arrives (never allocating a
// length the client merely declares), within proxy.body_read_timeout and
// proxy.max_body_bytes, counted against limits.max_queued_bytes for as long
// as the call lasts, and checked: JSON, a model, the model's length,
// characters and the upstream's allow-list. Only then does it queue for a
// slot. Anything wrong is a 4xx JSON error, and nothing reaches the gateway.
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) {
	if s.stopping.Load() {
		writeShuttingDown(w)
		return
	}
	name := r.PathValue("upstream")
	u := (*s.ups.Load())[name]
	if u == nil {
		writeError(w, unknownUpstreamCode, fmt.Sprintf("no upstream named %q is configured", name))
		return
	}
	if rest := r.PathValue("rest"); hasDotSegment(rest) {
		writeError(w, invalidPathCode, "the path may not contain . or .. segments")
		return
	}
	// The caller's trace (traceparent) becomes the parent of the call's
	// spans, which the bridge then hands on to the gateway.
	ctx := s.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	cfg := s.cfg.Load()
	ctx, ok := callContext(ctx, w, r, cfg, s.clock.Now())
	if !ok {
		return
	}
	rc := http.NewResponseController(w)
	if r.Method == http.MethodPost && lanehttp.IsModelCall(r) {
		body, release, ok := s.readModelCall(w, r, rc, u, cfg)
		if !ok {
			return
		}
		defer release()
		lanehttp.SetBody(r, body)
		var ka *keepAlive
		ka, ctx = queuedStream(ctx, w, r.Header, cfg, body, s.clock)
		// The call waits for its slot here, at the top of the handler, traced
		// or not: docs/DESIGN.md, "A queued call's stack", says why. Its call
		// span opens first, so that the queue wait is a child of it; the
		// tracing transport takes the span over for the round trip.
		r = s.tel.Bridge().StartCall(r.WithContext(ctx), s.providerOpt(u.cfg)...)
		defer otelbridge.EndCall(r)
		r = u.lanes.Admit(r)
		ctx = r.Context()
		defer lanehttp.Abandon(r)
		w = ka.end(w, u, r)
	} else {
		// The body streams through as it arrives. Without full duplex, the
		// HTTP/1 server closes the request body once the response starts
		// (golang/go#40747), which cuts a call whose body is still being
		// copied upstream when the upstream answers.
		_ = rc.EnableFullDuplex() // HTTP/2 is full duplex already
		wb := &watchedBody{ReadCloser: r.Body}
		r.Body, ctx = wb, context.WithValue(ctx, watchKey{}, wb)
	}
	sw := newStreamWriter(w, time.Duration(cfg.Proxy.WriteTimeout), s.shared == nil)
	w, ctx = sw, context.WithValue(ctx, streamKey{}, sw)
	// Each proxied request is one acquisition. A client's retry of a call
	// seen in the last few minutes queues with that call's first arrival
	// (lanehttp recognises it from its own memory, never from what the
	// client claims).
	u.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// callContext returns ctx with the call's class, tenant and deadline from
// r's headers (the deadline: arrival at now plus the client's stated
// timeout, lanehttp.StatedTimeout), or answers a 400 itself and returns ok
// false. It is out of
// line, so that its frame is not on the stack of every queued call
// (docs/DESIGN.md, "A queued call's stack").
//
//go:noinline
func callContext(ctx context.Context, w http.ResponseWriter, r *http.Request, cfg *Config, now time.Time) (_ context.Context, ok bool) {
	if d, ok := lanehttp.StatedTimeout(r.Header); ok {
		ctx = limiter.WithDeadline(ctx, now.Add(d))
	}
	if v := r.Header.Get(PriorityHeader); v != "" {
		p, err := limiter.ParsePriority(v)
		if err != nil {
			writeError(w, invalidPriorityCode, fmt.Sprintf("%s: %v", PriorityHeader, err))
			return ctx, false
		}
		ctx = limiter.WithPriority(ctx, p)
	}
	tenant, err := cfg.tenantSource.tenantOf(r)
	if err != nil {
		writeError(w, invalidTenantCode, err.Error())
		return ctx, false
	}
	if tenant != "" {
		ctx = limiter.WithTenant(ctx, tenant)
	}
	return ctx, true
}

// readModelCall reads and checks a model call's body. It answers the client
// itself and returns ok false when the call goes no further.
func (s *Server) readModelCall(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, u *upstream, cfg *Config) (body []byte, release func(), ok bool) {
	limit := cfg.Proxy.MaxBodyBytes
	if r.ContentLength > limit {
		writeError(w, lanehttp.RequestTooLargeCode, fmt.Sprintf("the body declares %d bytes; proxy.max_body_bytes is %d", r.ContentLength, limit))
		return nil, nil, false
	}
	hold := &bodyHold{all: s.queued, share: s.connShare}
	hold.conn, _ = r.Context().Value(connKey{}).(*connState)
	clock := &bodyClock{setDeadline: rc.SetReadDeadline, start: time.Now(), rate: cfg.Proxy.BodyMinRate,
		grace: time.Duration(cfg.Proxy.BodyMinRateGrace), most: time.Duration(cfg.Proxy.BodyReadTimeout)}
	b, err := s.readBody(r.Body, limit, hold, clock)
	_ = rc.SetReadDeadline(time.Time{})
	release = hold.release
	if err != nil {
		release()
	}
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeError(w, lanehttp.RequestTooLargeCode, fmt.Sprintf("the body is over proxy.max_body_bytes (%d)", limit))
		return nil, nil, false
	case errors.Is(err, errQueuedBytes):
		w.Header().Set("Retry-After", "1")
		writeError(w, queuedBytesLimitCode, fmt.Sprintf(
			"the bodies of the calls in progress take limits.max_queued_bytes (%d) already; send the call again shortly", s.queuedBytes))
		return nil, nil, false
	case errors.Is(err, errConnQueuedBytes):
		w.Header().Set("Retry-After", "1")
		writeError(w, queuedBytesLimitCode, fmt.Sprintf(
			"the bodies of this connection's calls in progress take limits.max_connection_queued_bytes (%d) already; send the call again shortly", s.connShare))
		return nil, nil, false
	case errors.Is(err, errBodyTooSlow):
		w.Header().Set("Connection", "close")
		writeError(w, bodyReadTimeoutCode, fmt.Sprintf(
			"the request body arrived slower than proxy.body_min_rate (%d bytes a second, after the first %s)",
			cfg.Proxy.BodyMinRate, time.Duration(cfg.Proxy.BodyMinRateGrace)))
		return nil, nil, false
	case errors.Is(err, errBodyReadDeadline):
		w.Header().Set("Connection", "close")
		writeError(w, bodyReadTimeoutCode, fmt.Sprintf(
			"the request body did not arrive within proxy.body_read_timeout (%s)", time.Duration(cfg.Proxy.BodyReadTimeout)))
		return nil, nil, false
	case err != nil:
		// Cut short or badly chunked. The answer may find no one (a client
		// that went away); one that half-closed its side reads it.
		writeError(w, invalidBodyCode, "the request body could not be read: "+withoutURL(err).Error())
		return nil, nil, false
	}
	model, err := lanehttp.ModelOf(b)
	if err == nil {
		err = checkModel(model, u.cfg.Models, cfg.Limits.MaxModelBytes)
	}
	if err != nil {
		release()
		code := lanehttp.InvalidJSONCode
		var me *modelError
		switch {
		case errors.As(err, &me):
			code = me.code
		case errors.Is(err, lanehttp.ErrNoModel):
			code = lanehttp.MissingModelCode
		}
		writeError(w, code, err.Error())
		return nil, nil, false
	}
	return b, release, true
}

// modelError is a model id the proxy refuses.
type modelError struct {
	code string
	msg  string
}

func (e *modelError) Error() string { return e.msg }

// checkModel refuses a model id that is too long, has characters no model
// id needs (they end up in lane keys and metric labels), or is not in the
// upstream's allow-list.
func checkModel(m string, allowed []string, maxBytes int) error {
	if len(m) > maxBytes {
		return &modelError{modelTooLongCode, fmt.Sprintf("the model id is %d bytes; limits.max_model_bytes is %d", len(m), maxBytes)}
	}
	for i := 0; i < len(m); i++ {
		if !modelByte(m[i]) {
			return &modelError{invalidModelCode,
				fmt.Sprintf("the model id has a character (byte %d) outside letters, digits and . _ - / : @ + = , ~", i)}
		}
	}
	if len(allowed) == 0 {
		return nil
	}
	for _, pat := range allowed {
		if ok, _ := path.Match(pat, m); ok {
			return nil
		}
	}
	return &modelError{modelNotAllowedCode, fmt.Sprintf("model %q is not in this upstream's models list", m)}
}

func modelByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("._-/:@+=,~", c) >= 0
}

// watchedBody notes whether reading the client's body failed, so that a
// malformed body (bad chunking, cut short) is answered 400, not 502. It
// rides in the request's context too, since the reverse proxy wraps the
// body it sends.
type watchedBody struct {
	io.ReadCloser
	failed atomic.Bool
}

type watchKey struct{}

// errClientBody replaces an upstream's answer to a body that the client
// broke off or malformed.
var errClientBody = errors.New("the request body could not be read")

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

func hasDotSegment(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// proxyError answers a request the upstream could not serve. It logs the
// cause without the URL (which may carry a key in its query) or headers,
// and names the upstream by its configured name.
func (s *Server) proxyError(u *upstream) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		var se *lanehttp.StallError
		switch {
		case bodyFailed(r): // before the context: a client that half-closes looks gone, and waits for this
			writeError(w, invalidBodyCode, "the request body could not be read: it was malformed or cut short")
		case r.Context().Err() != nil:
			return // the client is gone (its call, if sent, holds its slot until the upstream's answer ends)
		case errors.Is(err, lanehttp.ErrSlotLost):
			s.log.Warn("shared slot lost", "upstream", u.cfg.Name, "err", err.Error())
			writeError(w, lanehttp.SlotLostCode, fmt.Sprintf("upstream %q: %v; send the call again", u.cfg.Name, err))
		case errors.As(err, &se):
			named := *se
			named.Lane = u.name(se.Lane)
			s.log.Warn("upstream stalled", "upstream", u.cfg.Name, "lane", named.Lane, "phase", se.Phase, "after", se.After)
			writeError(w, lanehttp.UpstreamStallCode, named.Error())
		default:
			err = withoutURL(err)
			s.log.Warn("upstream unreachable", "upstream", u.cfg.Name, "err", err.Error())
			writeError(w, lanehttp.UpstreamUnreachableCode, fmt.Sprintf("upstream %q: %v", u.cfg.Name, err))
		}
	}
}

func bodyFailed(r *http.Request) bool {
	wb, ok := r.Context().Value(watchKey{}).(*watchedBody)
	return ok && wb.failed.Load()
}

// checkClientBody refuses an upstream's answer to a request whose body the
// client broke off: what the upstream saw was not what the client meant.
// Otherwise the answer's end is watched, to coalesce the last flush
// (streamWriter).
func checkClientBody(res *http.Response) error {
	if bodyFailed(res.Request) {
		res.Body.Close()
		return errClientBody
	}
	watchEnd(res)
	return nil
}

// checkPath answers for the upstream's 404 to a path that repeats the end
// of its base URL (the client's base URL was /proxy/<name>/v1/ in front
// of a base_url ending in /v1), saying what was forwarded where; any other
// answer goes to next.
func (u *upstream) checkPath(res *http.Response, next func(*http.Response) error) error {
	if res.StatusCode != http.StatusNotFound || res.Request == nil {
		return next(res)
	}
	base, _ := url.Parse(u.cfg.BaseURL)
	last := path.Base(base.Path)
	sent := res.Request.URL.Path
	if last == "/" || last == "." || !strings.HasPrefix(sent, base.Path+"/"+last+"/") {
		return next(res)
	}
	res.Body.Close()
	c := codeOf(upstreamPathCode)
	msg := fmt.Sprintf("upstream %q answered 404 for %s: the call went to its base_url (which ends in /%s) plus /%s, so /%s came twice; "+
		"set the client's base URL to /proxy/%s/ (without /%s)", u.cfg.Name, sent, last, strings.TrimPrefix(sent, base.Path+"/"), last, u.cfg.Name, last)
	body, _ := json.Marshal(c.Body(msg))
	res.Header = http.Header{"Content-Type": {"application/json"}, "X-Should-Retry": {"false"}}
	res.Body, res.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	res.Header.Set("Content-Length", fmt.Sprint(len(body)))
	return next(res)
}

// withoutURL drops the URL that net/http puts in front of a transport
// error: it may carry a key in its query, and must not reach a log.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// writeShuttingDown answers a call that arrives once shutdown has begun:
// retryable, elsewhere.
func writeShuttingDown(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	writeError(w, lanehttp.ShuttingDownCode,
		"lanes-exporter is shutting down and takes no more calls; send the call again (to another instance)")
}
