package exporter

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A protocol upgrade (101 Switching Protocols, as a WebSocket, e.g. a
// realtime model API, starts) passes through the proxy both ways, with
// tracing off and on: the gateway echoes what the client sends on the
// upgraded connection.
func TestUpgradePassesThrough(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the client closes
	}))
	defer gw.Close()
	yaml := fmt.Sprintf("upstreams: [{name: gw, base_url: %q}]\n", gw.URL+"/v1")
	for _, traced := range []bool{false, true} {
		t.Run(fmt.Sprintf("traced=%v", traced), func(t *testing.T) {
			front, _, spans := newFront(t, yaml, traced)

			c, err := net.Dial("tcp", front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "GET /proxy/gw/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusSwitchingProtocols {
				b, _ := io.ReadAll(res.Body)
				t.Fatalf("status %d: %s", res.StatusCode, b)
			}
			for _, msg := range []string{"ping\n", "pong\n"} {
				io.WriteString(c, msg)
				got, err := br.ReadString('\n')
				if err != nil || got != msg {
					t.Fatalf("echo of %q: %q, %v", msg, got, err)
				}
			}
			c.Close()
			if traced {
				// The call's span ends once the upgraded connection does.
				deadline := time.Now().Add(10 * time.Second)
				for len(spans.Ended()) == 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := len(spans.Ended()); n != 1 || !strings.HasPrefix(spans.Ended()[0].Name(), "GET") {
					t.Fatalf("%d spans ended, want the call's GET span", n)
				}
			}
		})
	}
}
