package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository's top, from this package's directory.
const root = "../../.."

// The README's Go quick start compiles as written, inside a function that
// has its ctx (and returns an error), against the packages of this
// checkout: a change to the library's API that breaks it fails here.
func TestReadmeGoCompiles(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(b), "```go\n")[1:] {
		blocks = append(blocks, part[:strings.Index(part, "```")])
	}
	if len(blocks) == 0 {
		t.Fatal("the README has no Go block")
	}
	dir := t.TempDir()
	src := `package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
)

var (
	_ = errors.Is
	_ = openai.NewClient
	_ = option.WithHTTPClient
	_ http.RoundTripper = (*lanehttp.Transport)(nil)
	_ = time.Second
)

func main() {}
`
	for i, blk := range blocks {
		src += "\nfunc quickStart" + string(rune('A'+i)) + "(ctx context.Context) error {\n" + blk + "\t_, _ = ctx, client\n\treturn nil\n}\n"
	}
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644)
	abs, _ := filepath.Abs(root)
	cmd := exec.Command("go", "build", "-o", os.DevNull, filepath.Join(dir, "main.go"))
	cmd.Dir = abs // the module of this checkout
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's Go does not compile: %v\n%s\n%s", err, out, src)
	}
}
