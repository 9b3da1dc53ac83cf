package exporter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

// Every proxied answer says where its time went (Server-Timing: the lane's
// wait and the upstream's time to its headers, before the upstream's own);
// proxy.server_timing: false turns it off.
func TestProxyServerTiming(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Server-Timing", "gpu;dur=12")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[]}`)
	}))
	t.Cleanup(gw.Close)
	for _, c := range []struct {
		setting string
		want    string
	}{
		{"", `lane;dur=0;desc="gw|m", upstream;dur=`},
		{"\n  server_timing: false", ""},
	} {
		srv := newTestServerWith(t, fmt.Sprintf("limiter: {max_inflight: 2}\nproxy:\n  max_body_bytes: 1048576%s\nupstreams:\n  - {name: gw, base_url: %s/v1}\n", c.setting, gw.URL),
			Options{Clock: limitertest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))})
		front := httptest.NewServer(srv.Handler())
		_, h := postChat(context.Background(), http.DefaultClient, front.URL, "m", "", "hi")
		got := h.Values("Server-Timing")
		front.Close()
		srv.Shutdown(context.Background())
		if c.want == "" {
			if !slices.Equal(got, []string{"gpu;dur=12"}) {
				t.Fatalf("server_timing off: Server-Timing %q, want the upstream's alone", got)
			}
			continue
		}
		if len(got) != 2 || !strings.HasPrefix(got[0], c.want) || got[1] != "gpu;dur=12" {
			t.Fatalf("Server-Timing %q, want %q... then the upstream's", got, c.want)
		}
	}
}
