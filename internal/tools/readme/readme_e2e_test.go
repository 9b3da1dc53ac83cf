//go:build e2e

package readme

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/internal/gatewaysim"
	"github.com/llmlanes/llmlanes/internal/tools/logbuf"
)

// commands returns the README's commands: every line of its ```sh blocks
// (without the trailing comment), and every inline `make ...` and
// `go run ./...`.
func commands(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]bool{}
	add := func(c string) {
		if c = strings.TrimSpace(c); c != "" && !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	inSh := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
		case strings.HasPrefix(line, "```"):
			inSh = false
		case inSh:
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			add(line)
		default:
			for _, m := range regexp.MustCompile("`((?:make [a-z0-9-]+)|(?:go run \\./[^`]+))`").FindAllStringSubmatch(line, -1) {
				add(m[1])
			}
		}
	}
	return out
}

// copyTree copies the working tree's files (tracked, and new ones not
// ignored) into a temporary directory: a fresh clone with this checkout's
// changes.
func copyTree(t *testing.T) string {
	dst := t.TempDir()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(root, f))
		os.MkdirAll(filepath.Join(dst, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dst, f), b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func shell(dir, cmd string, env ...string) *exec.Cmd {
	c := exec.Command("sh", "-c", cmd)
	c.Dir = dir
	c.Env = append(os.Environ(), env...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

// run runs cmd in dir and fails unless it exits 0 within limit.
func run(t *testing.T, dir, cmd string, limit time.Duration, env ...string) string {
	t.Helper()
	c := shell(dir, cmd, env...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out.String())
		}
	case <-time.After(limit):
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("%s: still running after %s\n%s", cmd, limit, out.String())
	}
	return out.String()
}

// background starts cmd in dir and stops it (its whole process group) when
// the test ends.
func background(t *testing.T, dir, cmd string, env ...string) *logbuf.Buffer {
	t.Helper()
	c := shell(dir, cmd, env...)
	out := &logbuf.Buffer{}
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return out
}

// waitFor polls url until it answers 200 with want in its body.
func waitFor(t *testing.T, url, want string, limit time.Duration, log fmt.Stringer) string {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(250 * time.Millisecond) {
		if res, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK && strings.Contains(string(b), want) {
				return string(b)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 with %q within %s; output:\n%s", url, want, limit, log.String())
		}
	}
}

// Every command of the README runs as written. A command without a check
// fails the test: add one here when the README gains a command.
func TestReadmeCommands(t *testing.T) {
	work := copyTree(t)
	ran := map[string]bool{}
	checks := map[string]func(t *testing.T){
		"make demo": func(t *testing.T) {
			out := background(t, work, "make demo")
			waitFor(t, "http://127.0.0.1:4470/", "llmlanes", 3*time.Minute, out)
			waitFor(t, "http://127.0.0.1:4470/api/telemetry/llm-lanes/classification", `"hold_text"`, time.Minute, out)
		},
		// make test and make e2e run in CI exactly as written (this test is
		// part of make e2e): check that .ci/run says so.
		"make test": func(t *testing.T) { ciRuns(t, "make test") },
		"make e2e":  func(t *testing.T) { ciRuns(t, "make e2e") },
		"make fuzz": func(t *testing.T) { ciRuns(t, "make fuzz FUZZTIME=10s") }, // CI fuzzes 10 s per target
		// make stress takes half an hour: check that it is the race-enabled
		// suite, two copies, as the README says, and that make can run it.
		"make stress": func(t *testing.T) {
			out := run(t, work, "make -n stress", time.Minute)
			if !strings.Contains(out, "go test -race -count=3") || !strings.Contains(out, "for i in 1 2") {
				t.Fatalf("make stress does not run two copies of the race-enabled suite three times:\n%s", out)
			}
		},
		// make chaos takes minutes at its 100 restarts of each kind: one of
		// each, through the same target, shows it runs what it says.
		"make chaos": func(t *testing.T) {
			out := run(t, work, "make chaos", 5*time.Minute, "CHAOSRESTARTS=1")
			if !strings.Contains(out, "1 restarts of each kind") || !strings.Contains(out, "--- PASS: TestRestartChaos") {
				t.Fatalf("make chaos did not run TestRestartChaos with one restart of each kind:\n%s", out)
			}
		},
		"make replay": func(t *testing.T) {
			run(t, work, "make replay", 5*time.Minute)
			// The simulated part is exact: the committed report must be
			// what the code produces today.
			cut := func(b []byte) string {
				s := string(b)
				if i := strings.Index(s, "## The same incident over real HTTP"); i >= 0 {
					s = s[:i]
				}
				return s
			}
			got, _ := os.ReadFile(filepath.Join(work, "docs/INCIDENT-REPLAY.md"))
			want, _ := os.ReadFile(filepath.Join(root, "docs/INCIDENT-REPLAY.md"))
			if cut(got) != cut(want) {
				t.Error("docs/INCIDENT-REPLAY.md is stale: run make replay and commit it")
			}
			got, _ = os.ReadFile(filepath.Join(work, "docs/ADAPTIVE.md"))
			want, _ = os.ReadFile(filepath.Join(root, "docs/ADAPTIVE.md"))
			if len(want) == 0 || string(got) != string(want) {
				t.Error("docs/ADAPTIVE.md is stale: run make replay and commit it")
			}
		},
		// The full run takes minutes; BENCHFLAGS (as the README says) keeps
		// this one short. The command is the README's.
		"make bench": func(t *testing.T) {
			run(t, work, "make bench", 10*time.Minute, "BENCHFLAGS=-count 1 -benchtime 50ms -proxy-quick")
			b, _ := os.ReadFile(filepath.Join(work, "docs/BENCHMARKS.md"))
			for _, want := range []string{"| limiter off", "## lanes-exporter beside HAProxy", "| added latency p50, µs |"} {
				if !bytes.Contains(b, []byte(want)) {
					t.Errorf("make bench wrote no %q", want)
				}
			}
		},
		"go run ./examples/priority-demo": func(t *testing.T) {
			run(t, work, "go run ./examples/priority-demo", 3*time.Minute)
		},
		// The exporter's three lines run in order: the copy, the edit the
		// comment asks for (the simulator is "your gateway"), the exporter,
		// and an agent (the README's example one) through the proxy.
		"cp lanes.example.yaml lanes.yaml": func(t *testing.T) {
			sim := httptest.NewServer(gatewaysim.New(gatewaysim.Config{Capacity: 4, TokenTime: time.Millisecond, Tokens: 3}))
			defer sim.Close()
			run(t, work, "cp lanes.example.yaml lanes.yaml", time.Minute)
			cfg, _ := os.ReadFile(filepath.Join(work, "lanes.yaml"))
			edited := strings.Replace(string(cfg), "base_url: https://gateway.example/v1", "base_url: "+sim.URL+"/v1", 1)
			if edited == string(cfg) {
				t.Fatal("lanes.example.yaml has no base_url: https://gateway.example/v1 to set")
			}
			os.WriteFile(filepath.Join(work, "lanes.yaml"), []byte(edited), 0o644)
			out := background(t, work, "go run ./cmd/lanes-exporter --config lanes.yaml")
			waitFor(t, "http://127.0.0.1:4470/-/ready", "", 3*time.Minute, out)
			agent := strings.Replace("OPENAI_BASE_URL=http://127.0.0.1:4470/proxy/gw/ your-agent", "your-agent", "go run ./examples/openai-go", 1)
			reply := run(t, work, agent, 3*time.Minute, "MODEL=protolabs/smart", "OPENAI_API_KEY=sk-readme-test")
			if !strings.Contains(reply, "tok0") {
				t.Fatalf("the agent's reply: %s", reply)
			}
			waitFor(t, "http://127.0.0.1:4470/metrics", fmt.Sprintf(`lane="%s/v1|protolabs/smart"`, sim.URL), 10*time.Second, out)
		},
		"go run ./cmd/lanes-exporter --config lanes.yaml":            covered("cp lanes.example.yaml lanes.yaml"),
		"OPENAI_BASE_URL=http://127.0.0.1:4470/proxy/gw/ your-agent": covered("cp lanes.example.yaml lanes.yaml"),
	}
	for _, c := range commands(t) {
		check, ok := checks[c]
		if !ok {
			t.Errorf("README command %q has no check in internal/tools/readme: add one", c)
			continue
		}
		ran[c] = true
		t.Run(c, check)
	}
	for c := range checks {
		if !ran[c] {
			t.Errorf("the check of %q has no command in the README any more: remove it", c)
		}
	}
}

func covered(by string) func(*testing.T) {
	return func(t *testing.T) { t.Logf("run as part of %q", by) }
}

func ciRuns(t *testing.T, cmd string) {
	b, err := os.ReadFile(filepath.Join(root, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == cmd {
			return
		}
	}
	t.Fatalf(".ci/run does not run %q", cmd)
}

// sameTree fails if a generator changed any file under dir in the copy.
func sameTree(t *testing.T, work, dir string) {
	t.Helper()
	filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join(work, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs after the generator ran: regenerate and commit it", rel)
		}
		return nil
	})
}
