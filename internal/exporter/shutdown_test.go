package exporter

import (
	"context"
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
	// New connections are refused once shutdown has begun.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := (&http.Client{Transport: &http.Transport{}}).Get("http://" + l.Addr + "/healthz"); err != nil {
			break
		}
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
