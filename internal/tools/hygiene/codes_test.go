package hygiene

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/llmlanes/llmlanes/internal/exporter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

// TestErrorCodes checks the two tables of error codes, package lanehttp's
// and lanes-exporter's: every code declared is in its table once, with an
// error status and a line saying when it is sent; no code is in both; and
// every code is sent from somewhere (its constant is used outside the
// table, in code that is not a test).
func TestErrorCodes(t *testing.T) {
	dir := root(t)
	seen := map[string]string{}
	for _, tc := range []struct {
		file  string
		table []lanehttp.Code
	}{
		{"limiter/lanehttp/codes.go", lanehttp.Codes()},
		{"internal/exporter/codes.go", exporter.Codes()},
	} {
		consts := stringConsts(t, filepath.Join(dir, tc.file))
		if len(consts) == 0 {
			t.Fatalf("%s declares no codes", tc.file)
		}
		inTable := map[string]bool{}
		for _, c := range tc.table {
			if other, ok := seen[c.Name]; ok {
				t.Errorf("%s: code %q is also in %s's table", tc.file, c.Name, other)
			}
			seen[c.Name] = tc.file
			if inTable[c.Name] {
				t.Errorf("%s: code %q twice in the table", tc.file, c.Name)
			}
			inTable[c.Name] = true
			if c.Status < 400 || c.Status > 599 || http.StatusText(c.Status) == "" {
				t.Errorf("%s: code %q has status %d, not an error status", tc.file, c.Name, c.Status)
			}
			if strings.TrimSpace(c.When) == "" {
				t.Errorf("%s: code %q does not say when it is sent", tc.file, c.Name)
			}
		}
		for name, value := range consts {
			if !inTable[value] {
				t.Errorf("%s: %s (%q) is not in the table", tc.file, name, value)
			}
			delete(inTable, value)
			if !usedOutside(t, dir, tc.file, name) {
				t.Errorf("%s: %s (%q) is sent from nowhere: no code but the table uses it", tc.file, name, value)
			}
		}
		for value := range inTable {
			t.Errorf("%s: the table's %q is no declared constant", tc.file, value)
		}
	}
}

// stringConsts returns the string constants a file declares, by name.
func stringConsts(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					out[n.Name] = v
				}
			}
		}
	}
	return out
}

// usedOutside reports whether identifier name appears in a Go file of the
// repository other than tests and the file that declares it.
func usedOutside(t *testing.T, dir, decl, name string) bool {
	t.Helper()
	re := regexp.MustCompile(`\b` + name + `\b`)
	found := false
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || found {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || p == filepath.Join(dir, decl) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		found = re.Match(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
