package exporter

import (
	"regexp"
	"strings"
	"testing"
)

// The status page is self-contained: every URL it fetches or links is
// one of the exporter's own paths, and the only absolute URL in it is
// SVG's namespace (an identifier, never fetched). Its charts read the
// history route.
func TestStatusPageSelfContained(t *testing.T) {
	page := string(statusPage)
	for _, m := range regexp.MustCompile(`https?://[^\s"'<>)]+`).FindAllString(page, -1) {
		if m != "http://www.w3.org/2000/svg" {
			t.Errorf("the status page names %s", m)
		}
	}
	refs := regexp.MustCompile(`(?:href=|src=|fetch\()\s*["'(]?([^"'\s)]+)`).FindAllStringSubmatch(page, -1)
	if len(refs) < 4 {
		t.Fatalf("found %d references in the page", len(refs))
	}
	for _, r := range refs {
		if !strings.HasPrefix(r[1], "/") && r[1] != "HIST" {
			t.Errorf("the status page refers to %q, not one of the exporter's paths", r[1])
		}
	}
	if !strings.Contains(page, `"`+HistoryPath+`"`) {
		t.Errorf("the status page does not read %s", HistoryPath)
	}
	if strings.Contains(page, "<script src") || strings.Contains(page, "<link") || strings.Contains(page, "@import") {
		t.Error("the status page loads a script, stylesheet or font")
	}
}
