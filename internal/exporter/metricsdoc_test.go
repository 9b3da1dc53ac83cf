package exporter

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// Every metric family /metrics serves is in docs/OBSERVABILITY.md, read
// from what is served rather than from the declarations: lanes of every
// kind of series (a call of a named tenant, with tokens), the targets' and
// the budget's gauges, the GenAI metrics, and lanes-exporter's own
// (build_info, the reload gauges). The Go runtime's and the process's
// standard collectors (go_*, process_*) are named as such there.
func TestEveryServedFamilyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/OBSERVABILITY.md")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	close(release)
	up := holdingGateway(release)
	defer up.Close()
	front, _, _ := newFront(t, "limiter: {max_inflight: 2}\nupstreams: [{name: gw, base_url: \""+up.URL+"/v1\", capacity: 4}]\n", false)
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/proxy/gw/chat/completions", strings.NewReader(`{"model":"m","stream":true,"max_tokens":5}`))
	req.Header.Set(TenantHeader, "board-a")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	res, err = http.Get(front.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	families := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		name := f[2]
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		families++
		documented := "`" + name + "`"
		if rest, ok := strings.CutPrefix(name, "llmlanes_"); ok {
			documented = "`{p}_" + rest + "`"
		}
		if !strings.Contains(string(doc), documented) {
			t.Errorf("/metrics serves %s, which docs/OBSERVABILITY.md does not name (as %s)", name, documented)
		}
	}
	if families < 20 {
		t.Fatalf("read %d families from /metrics: too few to be the whole", families)
	}
}
