package hygiene

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v (these checks need the repository's git)", err)
	}
	return strings.TrimSpace(string(out))
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// isBinary reports whether b starts like an executable or a shared
// library: ELF, Mach-O (either byte order, or universal) or PE.
func isBinary(b []byte) bool {
	for _, magic := range [][]byte{{0x7f, 'E', 'L', 'F'}, {0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
		{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe}, {0xca, 0xfe, 0xba, 0xbe}} {
		if bytes.HasPrefix(b, magic) {
			return true
		}
	}
	if len(b) >= 0x40 && b[0] == 'M' && b[1] == 'Z' {
		off := int(b[0x3c]) | int(b[0x3d])<<8
		return off+4 <= len(b) && bytes.Equal(b[off:off+4], []byte("PE\x00\x00"))
	}
	return false
}

func TestIsBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil || !isBinary(b) {
		t.Fatalf("this test's own binary is not recognised (%v)", err)
	}
	if isBinary([]byte("package main\n")) || isBinary([]byte("MZ is a text")) {
		t.Fatal("text recognised as a binary")
	}
}

// No tracked file is a built executable.
func TestNoTrackedBinary(t *testing.T) {
	top := root(t)
	for _, f := range strings.Split(strings.TrimRight(git(t, top, "ls-files", "-z"), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(top, f))
		if err != nil {
			continue // deleted in the work tree, not yet committed
		}
		if isBinary(b[:min(len(b), 4096)]) {
			t.Errorf("%s is a built binary: git rm --cached it (and .gitignore it)", f)
		}
	}
}

// Every binary go build leaves (named after its package's directory, in
// that directory or at the root) is ignored.
func TestBuiltBinariesIgnored(t *testing.T) {
	top := root(t)
	cmd := exec.Command("go", "list", "-f", `{{if eq .Name "main"}}{{.Dir}}{{end}}`, "./...")
	cmd.Dir = top
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dirs := strings.Fields(string(out))
	if len(dirs) < 3 {
		t.Fatalf("go list found %d main packages", len(dirs))
	}
	for _, dir := range dirs {
		rel, _ := filepath.Rel(top, dir)
		name := filepath.Base(dir)
		for _, p := range []string{filepath.Join(rel, name), name} {
			if exec.Command("git", "-C", top, "check-ignore", "-q", "--no-index", p).Run() != nil {
				t.Errorf("%s (what go build leaves for %s) is not in .gitignore", p, rel)
			}
		}
	}
}

// No package's non-test code imports testing: test helpers take the
// small interfaces they need instead. The one exception is
// internal/lanescenario, whose whole job is to run datadriven files in
// the tests of two packages (limiter and sharedlane): datadriven's API is
// testing's, and the package is internal, never built into a binary.
func TestNoTestingOutsideTests(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		n++
		for _, imp := range f[1:] {
			if imp == "testing" && f[0] != "github.com/llmlanes/llmlanes/internal/lanescenario" {
				t.Errorf("%s imports testing outside its tests", f[0])
			}
		}
	}
	if n < 10 {
		t.Fatalf("go list listed %d packages", n)
	}
}
