package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestObservabilityDocCurrent fails when docs/OBSERVABILITY.md's generated
// tables differ from what their declarations generate: run
// go run ./internal/tools/obsdocs.
func TestObservabilityDocCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	sections, err := Sections(root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Splice(string(b), sections)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatalf("%s is stale: run go run ./internal/tools/obsdocs and commit it", file)
	}
}

// TestSplice checks the splicing: a table replaced between its markers, the
// prose kept, and a missing marker or table refused.
func TestSplice(t *testing.T) {
	doc := "a\n<!-- generated: x (go run) -->\nold\n<!-- end generated: x -->\nb\n"
	got, err := Splice(doc, map[string]string{"x": "new\n"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\n<!-- generated: x (go run) -->\nnew\n<!-- end generated: x -->\nb\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := Splice(doc, map[string]string{"x": "", "y": ""}); err == nil || !strings.Contains(err.Error(), `"y"`) {
		t.Fatalf("a table with no marker: err = %v", err)
	}
	if _, err := Splice(doc, map[string]string{}); err == nil {
		t.Fatal("a marker with no table: no error")
	}
	if _, err := Splice("<!-- generated: x -->\n", map[string]string{"x": ""}); err == nil {
		t.Fatal("a marker with no end: no error")
	}
}
