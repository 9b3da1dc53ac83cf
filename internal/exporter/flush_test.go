package exporter

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingListener keeps what the server writes on each connection.
type recordingListener struct {
	net.Listener
	mu     sync.Mutex
	writes [][]byte
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return &recordingConn{c, l}, err
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	c.l.writes = append(c.l.writes, append([]byte(nil), p...))
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

// A stream's events reach the client as they come (the first one while the
// gateway is still holding the rest), and its last events go out in the
// same write as the end of the response, not in a write of their own.
func TestStreamFlushes(t *testing.T) {
	hold := make(chan struct{})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		<-hold
		// The rest, and the end of the body, in one write.
		io.WriteString(w, "data: b\n\ndata: [DONE]\n\n")
	}))
	defer gw.Close()
	srv := newTestServer(t, fmt.Sprintf("upstreams: [{name: gw, base_url: %q}]\n", gw.URL+"/v1"))
	front := httptest.NewUnstartedServer(srv.Handler())
	rl := &recordingListener{Listener: front.Listener}
	front.Listener = rl
	front.Start()
	defer front.Close()
	client := &http.Transport{}
	defer client.CloseIdleConnections()
	res, err := (&http.Client{Transport: client}).Post(front.URL+"/proxy/gw/chat/completions", "application/json", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	first := make(chan string, 1)
	br := bufio.NewReader(res.Body)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: a\n" {
			t.Fatalf("first event: %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event was held back while the gateway held the rest")
	}
	close(hold)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: b\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest of the stream: %q %v", rest, err)
	}
	rl.mu.Lock()
	last := string(rl.writes[len(rl.writes)-1])
	rl.mu.Unlock()
	if !strings.Contains(last, "data: [DONE]\n\n") || !strings.HasSuffix(last, "0\r\n\r\n") {
		t.Fatalf("the last write is %q: want the last events with the end of the response", last)
	}
}
