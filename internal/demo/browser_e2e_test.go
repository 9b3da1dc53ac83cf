//go:build e2e

package demo

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// 8. The status page, rendered by headless Chromium (Debian's chromium)
// with the demo running, shows the lanes. Run with `make e2e`, which
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
	dir := t.TempDir()
	shot := filepath.Join(dir, "status.png")
	if out := os.Getenv("STATUS_SCREENSHOT"); out != "" {
		shot = out
	}
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1400,900",
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
	} {
		if !strings.Contains(page, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
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
}
