package redact

import (
	"net/url"
	"strings"
	"testing"
)

// Every form a URL's secret comes in is hidden, what is not a secret is
// kept, and an unparsable URL is not shown.
func TestURL(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"https://gw.example/v1/chat/completions", "https://gw.example/v1/chat/completions"},
		{"https://gw.example/v1/chat?api-key=SECRET-1&api-version=2024", "https://gw.example/v1/chat?api-key=REDACTED&api-version=REDACTED"},
		{"redis://user:SECRET-2@127.0.0.1:6379/0", "redis://REDACTED:REDACTED@127.0.0.1:6379/0"},
		{"rediss://:SECRET-3@redis.internal:6380", "rediss://REDACTED:REDACTED@redis.internal:6380"},
		{"https://SECRET-4@gw.example/v1", "https://REDACTED@gw.example/v1"},
		{"redis://127.0.0.1:26379/0?master_name=lanes&sentinel_password=SECRET-5", "redis://127.0.0.1:26379/0?master_name=REDACTED&sentinel_password=REDACTED"},
		{"redis://h:6379/0#SECRET-6", "redis://h:6379/0"},
		{"https://gw/v1?%zzSECRET-7", "https://gw/v1?REDACTED"},
		{"redis://:Xy#SECRET-8@h:6379/0", "(a URL that does not parse, not shown: it may hold a secret)"},
	} {
		got := String(c.raw)
		if got != c.want || strings.Contains(got, "SECRET") {
			t.Errorf("String(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
	u, _ := url.Parse("https://u:p@gw/v1?k=v#f")
	before := *u
	URL(u)
	if *u != before {
		t.Error("URL changed its argument")
	}
}
