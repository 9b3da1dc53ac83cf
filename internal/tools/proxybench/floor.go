package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// serveFloor is the least a Go proxy built on net/http does for the same
// lane: a bare httputil.ReverseProxy to upstream (its Transport set as
// lanes-exporter's, responses flushed as they come) behind a channel
// semaphore of limit, first come first served, serving HTTP/1.1 and
// HTTP/2 cleartext. No priorities, no body checks, no statistics, no
// telemetry: what it costs beside HAProxy is the cost of net/http, and
// what lanes-exporter costs beside it is llmlanes'. GET /queued reports
// how many calls wait.
func serveFloor(ln net.Listener, upstream string, limit int) error {
	target, err := url.Parse(upstream)
	if err != nil {
		return err
	}
	var bufs sync.Pool
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = target.Scheme, target.Host, ""
		},
		Transport:     &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true},
		FlushInterval: -1,
		BufferPool:    pool{&bufs},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // not a caller that went away, as queued calls do when a measurement ends
				log.Printf("floor: %v", err)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	slots := make(chan struct{}, limit)
	var waiting atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /queued", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strconv.FormatInt(waiting.Load(), 10))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		default:
			waiting.Add(1)
			select {
			case slots <- struct{}{}:
				waiting.Add(-1)
			case <-r.Context().Done():
				waiting.Add(-1)
				return
			}
		}
		defer func() { <-slots }()
		// As lanes-exporter does: without it, net/http's HTTP/1 server
		// closes the request body when the response begins, and a Transport
		// still reading it cuts the answer off (golang/go#40747).
		_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv.Serve(ln)
}

// pool is an httputil.BufferPool of 32 KiB buffers.
type pool struct{ p *sync.Pool }

func (p pool) Get() []byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, 32<<10)
}

func (p pool) Put(b []byte) { p.p.Put(&b) }
