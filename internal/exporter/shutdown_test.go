package exporter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Graceful shutdown: new connections are refused at once, a stream in
// progress is let finish, then the server stops.
func TestGracefulShutdown(t *testing.T) {
	up := newUpstream(t)
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte("limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \""+up.srv.URL+"/v1\"}]\n"), 0o600)
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Options{File: file})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Start(srv, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+l.Addr+"/proxy/gw/chat/completions", strings.NewReader(chat))
	req.Header.Set("X-Test-Call", "long-stream")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Read(make([]byte, 64)) // the stream is under way
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- l.Shutdown(ctx)
	}()
	// New connections are refused once shutdown has begun. Each look is a
	// new connection, closed after it (an answer whose body is left unread
	// keeps its connection's goroutines waiting for ever).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		probe := &http.Transport{DisableKeepAlives: true}
		res, err := (&http.Client{Transport: probe}).Get("http://" + l.Addr + "/healthz")
		if err != nil {
			break
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		probe.CloseIdleConnections()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections during shutdown")
		}
	}
	select {
	case err := <-stopped:
		t.Fatalf("shutdown ended before the stream did: %v", err)
	default:
	}
	close(up.hold) // the gateway finishes the stream
	rest, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream was cut: %q %v", rest, err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
}

// SIGTERM with 200 streams in flight and 500 calls queued: every queued
// caller gets 503 lane_shutting_down at once, the gateway receives no new
// request after the signal, readiness turns false first, and the streams in
// flight complete before the exporter stops.
func TestShutdownAnswersQueuedAtOnce(t *testing.T) {
	up := newUpstream(t)
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte("limiter: {max_inflight: 200, interactive_reserve: 0}\nupstreams: [{name: gw, base_url: \""+up.srv.URL+"/v1\"}]\n"), 0o600)
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{MaxIdleConnsPerHost: 256}
	defer base.CloseIdleConnections()
	srv, err := New(cfg, Options{File: file, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Start(srv, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	defer client.CloseIdleConnections()
	post := func(id string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Addr+"/proxy/gw/chat/completions", strings.NewReader(chat))
		req.Header.Set("X-Test-Call", id)
		return client.Do(req)
	}
	streams := make([]*http.Response, 200)
	for i := range streams {
		res, err := post(fmt.Sprintf("long-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Read(make([]byte, 64)) // under way, holding its slot
		streams[i] = res
	}
	queued := make(chan *http.Response, 500)
	for i := range 500 {
		go func() {
			res, err := post(fmt.Sprintf("queued-%d", i))
			if err != nil {
				t.Error(err)
			}
			queued <- res
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); srv.Limiter().Snapshot().Lanes[0].Queued < 500; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the calls never all queued")
		}
	}
	atSignal := len(up.ids())
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		stopped <- l.Shutdown(ctx)
	}()
	// Every queued caller is answered, while the streams still hold.
	for range 500 {
		select {
		case res := <-queued:
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 503 || !strings.Contains(string(b), `"lane_shutting_down"`) || res.Header.Get("X-Should-Retry") == "false" {
				t.Fatalf("a queued call got %d %s (x-should-retry %q)", res.StatusCode, b, res.Header.Get("X-Should-Retry"))
			}
		case <-time.After(30 * time.Second):
			t.Fatal("queued callers were not answered at once")
		}
	}
	if !srv.stopping.Load() {
		t.Fatal("readiness is still true")
	}
	select {
	case err := <-stopped:
		t.Fatalf("shutdown ended before the streams did: %v", err)
	default:
	}
	close(up.hold) // the gateway finishes the streams
	for i, res := range streams {
		rest, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !strings.Contains(string(rest), "[DONE]") {
			t.Fatalf("stream %d was cut: %q %v", i, rest, err)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := len(up.ids()); n != atSignal || n != 200 {
		t.Fatalf("the gateway saw %d requests, %d at the signal: want 200 and none after", n, atSignal)
	}
}
