package hygiene

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	codeFence = regexp.MustCompile("(?s)```.*?```")
)

// slug is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces as hyphens.
func slug(h string) string {
	return strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// The repository stands alone: the README and the docs link only to files
// inside it, every one of which exists, and every #anchor names a heading
// of the file it points into.
func TestDocLinksStayInside(t *testing.T) {
	top := root(t)
	files, _ := filepath.Glob(filepath.Join(top, "docs", "*.md"))
	notes, _ := filepath.Glob(filepath.Join(top, "docs", "notes", "*.md"))
	files = append(append(files, notes...), filepath.Join(top, "README.md"), filepath.Join(top, "CONTRIBUTING.md"))
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		a := map[string]bool{}
		if b, err := os.ReadFile(file); err == nil {
			for _, m := range mdHeading.FindAllStringSubmatch(codeFence.ReplaceAllString(string(b), ""), -1) {
				a[slug(m[1])] = true
			}
		}
		anchors[file] = a
		return a
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(top, f)
		for _, m := range mdLink.FindAllStringSubmatch(codeFence.ReplaceAllString(string(b), ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				t.Errorf("%s links outside the repository: %s", rel, target)
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", rel, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
				t.Errorf("%s links to %s: no heading has the anchor #%s", rel, target, anchor)
			}
		}
	}
}
