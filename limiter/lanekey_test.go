package limiter_test

import (
	"testing"

	"github.com/llmlanes/llmlanes/limiter"
)

// Every spelling of one endpoint gives one lane key; different endpoints
// give different keys.
func TestLaneKeySpellings(t *testing.T) {
	const want = "https://gw.example/v1|protolabs/smart"
	for _, base := range []string{
		"https://gw.example/v1",
		"https://gw.example/v1/",
		"HTTPS://GW.Example/v1",
		"https://gw.example:443/v1",
		"https://user:secret@gw.example/v1",
		"https://gw.example/v1?api-key=x",
		"https://gw.example/v1#frag",
	} {
		if got := limiter.LaneKey(base, "protolabs/smart"); got != want {
			t.Errorf("LaneKey(%q) = %q, want %q", base, got, want)
		}
	}
	for base, key := range map[string]string{
		"http://127.0.0.1:80/v1":    "http://127.0.0.1/v1|m",
		"http://127.0.0.1:8080/v1/": "http://127.0.0.1:8080/v1|m",
		"https://gw:8443/V1":        "https://gw:8443/V1|m", // paths are case-sensitive
		"http://gw:443/v1":          "http://gw:443/v1|m",   // 443 is not http's default
		"https://gw":                "https://gw|m",
		"https://gw/":               "https://gw|m",
		"https://gw/a%7Cb":          "https://gw/a%7Cb|m",
	} {
		if got := limiter.LaneKey(base, "m"); got != key {
			t.Errorf("LaneKey(%q) = %q, want %q", base, got, key)
		}
	}
	if got := limiter.BaseKey("HTTP", "GW:80", "/v1/"); got != "http://gw/v1" {
		t.Errorf("BaseKey = %q", got)
	}
}

func TestSplitLaneKey(t *testing.T) {
	for key, want := range map[string][2]string{
		"https://gw/v1|protolabs/smart": {"https://gw/v1", "protolabs/smart"},
		"https://gw/v1|a|b":             {"https://gw/v1", "a|b"}, // a model may hold "|"
		"https://gw/v1":                 {"https://gw/v1", ""},
	} {
		if b, m := limiter.SplitLaneKey(key); b != want[0] || m != want[1] {
			t.Errorf("SplitLaneKey(%q) = %q, %q", key, b, m)
		}
		if b, m := limiter.SplitLaneKey(key); m != "" && limiter.LaneKey(b, m) != key {
			t.Errorf("LaneKey(SplitLaneKey(%q)) does not round-trip", key)
		}
	}
}
