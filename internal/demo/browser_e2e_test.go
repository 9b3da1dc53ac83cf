//go:build e2e

package demo

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/exporter"
)

// 8. The status page, rendered by headless Chromium (Debian's chromium)
// with the demo running, shows the lanes, and their last minutes as charts. Run with `make e2e`, which
// installs Chromium if it is missing.
func TestBrowserStatusPage(t *testing.T) {
	bin := os.Getenv("CHROMIUM")
	if bin == "" {
		bin = "chromium"
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("%s not found: `make e2e` installs Debian's chromium (%v)", bin, err)
	}
	d, err := Start("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d.Stop(ctx)
	}()
	for deadline := time.Now().Add(30 * time.Second); d.Sim.Stats().Completed < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no demo call completed")
		}
	}
	// A minute of history: the demo's lanes queue, then the gateway fails
	// (20-45 s), so the charts have lines and state changes.
	history := "http://" + d.Listener.Addr + exporter.HistoryPath
	for deadline := time.Now().Add(3 * time.Minute); samples(t, history) < 30; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the history has %d samples after 3 minutes", samples(t, history))
		}
	}
	dir := t.TempDir()
	shot := filepath.Join(dir, "status.png")
	if out := os.Getenv("STATUS_SCREENSHOT"); out != "" {
		shot = out
	}
	// Every request for another host goes to offHost, which records it
	// and refuses it: the page must make none. Chromium's own services
	// (its update, time and account checks at google.com and
	// googleapis.com, which its flags do not all turn off) are not the
	// page's and are left out.
	var offHostMu sync.Mutex
	var offHostAsked []string
	chromiums := regexp.MustCompile(`(^|\.)(google\.com|googleapis\.com)(:\d+)?$`)
	offHost := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offHostMu.Lock()
		if !chromiums.MatchString(r.Host) {
			offHostAsked = append(offHostAsked, r.Method+" "+r.Host+r.URL.Path)
		}
		offHostMu.Unlock()
		http.Error(w, "no request leaves the host", http.StatusForbidden)
	}))
	defer offHost.Close()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1400,1800",
		"--proxy-server=" + strings.TrimPrefix(offHost.URL, "http://"), "--proxy-bypass-list=127.0.0.1",
		"--virtual-time-budget=6000"}
	url := "http://" + d.Listener.Addr + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dom, err := exec.CommandContext(ctx, bin, append(args, "--dump-dom", url)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	page := string(dom)
	for _, want := range []string{
		`data-lane="http://127.0.0.1:`, // a lane row, rendered by the page's script
		`|protolabs/smart"`,
		`class="state `, // its state badge
		`updated `,      // the refresh ran
		`Budget across processes`,
		`data-tenant="board-a"`, // the tenants table: the demo's two boards
		`data-tenant="board-b"`,
		`data-tokens="http://127.0.0.1:`, // the tokens table: every call through the proxy is estimated
	} {
		if !strings.Contains(page, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	// The last 15 minutes: per lane, the state strip and four charts, each
	// drawn from every sample held, with at least one change of state.
	lanes := regexp.MustCompile(`data-history-lane="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(lanes) < 2 {
		t.Errorf("the history shows %d lanes, want the demo's two", len(lanes))
	}
	for _, chart := range []string{"inflight", "queued", "wait", "errors"} {
		m := regexp.MustCompile(`data-chart="`+chart+`" data-points="(\d+)"`).FindAllStringSubmatch(page, -1)
		if len(m) != len(lanes) {
			t.Errorf("chart %s drawn %d times for %d lanes", chart, len(m), len(lanes))
		}
		for _, x := range m {
			if n, _ := strconv.Atoi(x[1]); n < 30 {
				t.Errorf("chart %s drawn from %d samples, want 30 or more", chart, n)
			}
		}
	}
	if n := strings.Count(page, `<path d="M`); n < 4*len(lanes) {
		t.Errorf("%d lines drawn for %d lanes", n, len(lanes))
	}
	changes := regexp.MustCompile(`data-change="([a-z_]+)"`).FindAllStringSubmatch(page, -1)
	if len(changes) == 0 {
		t.Errorf("no change of state marked in %d lanes' history", len(lanes))
	}
	t.Logf("history: %d lanes, %d changes of state marked", len(lanes), len(changes))
	// The script filled the table and reported no error.
	if !strings.Contains(page, `<tbody id="lanes"><tr data-lane=`) || !strings.Contains(page, `<span id="err"></span>`) {
		t.Errorf("the page did not load its data:\n%s", page)
	}
	if err := exec.CommandContext(ctx, bin, append(args, "--screenshot="+shot, url)...).Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v", err)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Fatalf("screenshot %v %v", st, err)
	}
	t.Logf("screenshot: %s", shot)
	offHostMu.Lock()
	defer offHostMu.Unlock()
	if len(offHostAsked) > 0 {
		t.Errorf("the page asked for other hosts: %v", offHostAsked)
	}
}

// samples is how many samples the history route holds for its first lane.
func samples(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p struct {
		Lanes []struct {
			T []int64 `json:"t"`
		} `json:"lanes"`
	}
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if len(p.Lanes) == 0 {
		return 0
	}
	return len(p.Lanes[0].T)
}
