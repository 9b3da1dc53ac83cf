package sharedlane

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// The URL forms a Redis URL comes in, each with a secret in it: Redact,
// the errors about them and the text of go-redis's own log lines never
// show the secret, and an unparsable URL is not shown at all.
func TestRedact(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, keep string }{
		{"redis://user:SECRET-1@127.0.0.1:6379/0", "redis://REDACTED:REDACTED@127.0.0.1:6379/0"},
		{"rediss://:SECRET-2@redis.internal:6380", "rediss://REDACTED:REDACTED@redis.internal:6380"},
		{"redis://127.0.0.1:26379/0?master_name=lanes&password=SECRET-3", "master_name=REDACTED"},
		{"redis://u:SECRET-4@127.0.0.1:26379/0?master_name=lanes&sentinel_password=SECRET-5&addr=127.0.0.1:26380", "addr=REDACTED"},
		{"redis://:Xy#SECRET-6@h:6379/0", "does not parse"},
		{"redis://h:6379/0#SECRET-7", "redis://h:6379/0"},
	} {
		got := Redact(c.raw)
		if strings.Contains(got, "SECRET") || !strings.Contains(got, c.keep) {
			t.Errorf("Redact(%q) = %q, want no secret and %q", c.raw, got, c.keep)
		}
		if err := (Config{URL: c.raw}).Validate(); err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Validate(%q): %v", c.raw, err)
		}
		u, _ := url.Parse(c.raw)
		if s := redactErr(errors.New("dial "+c.raw+": refused"), u); strings.Contains(s, "SECRET") {
			t.Errorf("redactErr: %s", s)
		}
		if s := redactSecrets("redis: connecting to " + c.raw); strings.Contains(s, "SECRET") && !strings.Contains(c.raw, "#") {
			t.Errorf("redactSecrets: %s", s)
		}
	}
}
