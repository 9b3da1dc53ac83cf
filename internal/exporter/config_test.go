package exporter

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llmlanes/llmlanes/internal/tools/redistest"
	"github.com/llmlanes/llmlanes/sharedlane"

	"github.com/llmlanes/llmlanes/limiter"
)

func TestConfigDefaultsAndDurations(t *testing.T) {
	c, err := ParseConfig("lanes.yaml", []byte(`
limiter: {max_inflight: 6, queue_timeout: 5m}
upstreams:
  - {name: gw, base_url: "https://GW.example/v1/", capacity: 8}
proxy: {stall_timeout: 90}
classification: {wait_p90: 45s, clear_after: 30s}
targets: [{name: vera, url: "http://127.0.0.1:8080/api/telemetry/llm-lanes"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	lc := c.limiterConfig()
	if lc.MaxInflight != 6 || lc.QueueTimeout != 5*time.Minute || lc.InteractiveReserve != 1 {
		t.Fatalf("limiter %+v", lc)
	}
	if c.Listen != DefaultListen || c.Metrics.Prefix != "llmlanes" || c.Upstreams[0].BaseURL != "https://gw.example/v1" {
		t.Fatalf("defaults %+v", c)
	}
	if time.Duration(c.Proxy.StallTimeout) != 90*time.Second || c.thresholds().WaitP90 != 45*time.Second || c.thresholds().Retries != 3 || c.thresholds().ClearAfter != 30*time.Second {
		t.Fatalf("durations %+v %+v", c.Proxy, c.thresholds())
	}
	// The bounds' defaults; a connection's share is an eighth of the
	// budget, but never less than what one body of the largest size
	// allowed holds while it is read (twice its size and 64 KiB).
	if time.Duration(c.Proxy.WriteTimeout) != DefaultWriteTimeout || c.Proxy.BodyMinRate != DefaultBodyMinRate ||
		time.Duration(c.Proxy.BodyMinRateGrace) != DefaultBodyMinRateGrace || c.Limits.MaxConnectionQueuedBytes != 2*DefaultMaxBodyBytes+64<<10 {
		t.Fatalf("bounds %+v %+v", c.Proxy, c.Limits)
	}
	for yaml, want := range map[string]int64{
		"limits: {max_queued_bytes: 1048576000}":                               1048576000 / 8,
		"limits: {max_queued_bytes: 134217728}":                                2*DefaultMaxBodyBytes + 64<<10,
		"limits: {max_queued_bytes: 1048576}\nproxy: {max_body_bytes: 262144}": 2*262144 + 64<<10,
		"limits: {max_queued_bytes: 8388608}\nproxy: {max_body_bytes: 1}":      1048576,
	} {
		c, err := ParseConfig("lanes.yaml", []byte(yaml+"\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n"))
		if err != nil || c.Limits.MaxConnectionQueuedBytes != want {
			t.Fatalf("%s: the connection's share is %d, want %d (%v)", yaml, c.Limits.MaxConnectionQueuedBytes, want, err)
		}
	}
	if time.Duration(c.Targets[0].Interval) != DefaultTargetInterval {
		t.Fatalf("target interval %v", c.Targets[0].Interval)
	}
}

// A config error names the file, the key and what is wrong.
func TestConfigErrors(t *testing.T) {
	up := "upstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n"
	for _, tc := range []struct{ yaml, key, what string }{
		{"limiter: {max_inflight: -1}\n" + up, "limiter.max_inflight", "want 0 (off) or more"},
		{"limiter: {queue_timeout: soon}\n" + up, "", `"soon" is not a duration`},
		{"limiter: {interactive_reserve: -1}\n" + up, "limiter.interactive_reserve", "want 0 or more"},
		{"limiter: {max_infligt: 3}\n" + up, "", `line 1: unknown key "max_infligt"`},
		{"limiter: {max_inflight: abc}\n" + up, "", "line 1: want a whole number, got text `abc`"},
		{"upstreams: {a: 1}\n", "", "line 1: want a list, got a mapping"},
		{"proxy: {stall_timeout: [1]}\n" + up, "", "line 1: want a duration"},
		{"proxy: {write_timeout: -1s}\n" + up, "proxy.write_timeout", "is -1s: want 0 (the default, 2m0s) or more"},
		{"proxy: {stream_keepalive_every: -1s}\n" + up, "proxy.stream_keepalive_every", "is -1s: want 0 (the default, 15s) or more"},
		{"limiter: {max_inflight: 2, deadline: soon}\n" + up, "limiter.deadline", `is "soon": want answer_early (the default) or wait`},
		{"limiter: {max_inflight: 2, deadline_margin: -1s}\n" + up, "limiter.deadline_margin", "is -1s: want 0 (the default, 500ms) to 1m0s"},
		{"proxy: {body_min_rate: -5}\n" + up, "proxy.body_min_rate", "is -5: want 0 (the default, 240) or more"},
		{"proxy: {body_min_rate_grace: -1s}\n" + up, "proxy.body_min_rate_grace", "is -1s: want 0 (the default, 5s) or more"},
		{"limits: {max_queued_bytes: 100000, max_connection_queued_bytes: 100001}\nproxy: {max_body_bytes: 1000}\n" + up, "limits.max_connection_queued_bytes", "is 100001: want 0 (the default) up to limits.max_queued_bytes (100000)"},
		{"limits: {max_connection_queued_bytes: -1}\n" + up, "limits.max_connection_queued_bytes", "is -1: want 0 (the default)"},
		// A body of max_body_bytes (32 MiB) holds 64 MiB and 64 KiB while it is
		// read: a budget or a share smaller would refuse it every time.
		{"limits: {max_queued_bytes: 33554432}\n" + up, "limits.max_queued_bytes", "is 33554432: want at least 67174400"},
		{"limits: {max_connection_queued_bytes: 33554432}\n" + up, "limits.max_connection_queued_bytes", "is 33554432: want at least 67174400"},
		{"", "upstreams", "none configured"},
		{"upstreams: [{name: gw, base_url: \"ftp://gw\"}]", "upstreams[0].base_url", "want an http or https URL"},
		{"upstreams: [{name: gw, base_url: \"https://user:pw@gw/v1\"}]", "upstreams[0].base_url", "carries credentials"},
		{"upstreams: [{name: gw, base_url: \"https://a\"}, {name: gw, base_url: \"https://b\"}]", "upstreams[1].name", "configured twice"},
		{"upstreams: [{name: \"a/b\", base_url: \"https://a\"}]", "upstreams[0].name", "want letters"},
		{"upstreams: [{name: gw, base_url: \"https://a\", capacity: -1}]", "upstreams[0].capacity", "want 0"},
		{"metrics: {prefix: 9x}\n" + up, "metrics.prefix", "not starting with a digit"},
		{"classification: {error_ratio: 2}\n" + up, "classification", "error_ratio is 2"},
		{"classification: {clear_after: -5s}\n" + up, "classification", "clear_after is -5s"},
		{"limiter: {max_inflight: 4, adaptive: {min_inflight: 0}}\n" + up, "limiter.adaptive.min_inflight", "is 0: want 1 to max_inflight (4)"},
		{"limiter: {max_inflight: 4, adaptive: {min_inflight: 2, initial: 9}}\n" + up, "limiter.adaptive.initial", "is 9"},
		{"targets: [{name: a, url: \"not a url\"}]\n" + up, "targets[0].url", "want the http URL"},
		{"limiter: [1, 2]\n" + up, "", "line 1: want a mapping of keys to values, got a list"},
	} {
		_, err := ParseConfig("conf/lanes.yaml", []byte(tc.yaml))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.File != "conf/lanes.yaml" || ce.Key != tc.key || !strings.Contains(err.Error(), tc.what) ||
			!strings.HasPrefix(err.Error(), "config conf/lanes.yaml: ") {
			t.Errorf("%q: err %v, want key %q and %q", tc.yaml, err, tc.key, tc.what)
		}
		// In words: never a Go type name.
		if err != nil && (strings.Contains(err.Error(), "exporter.") || strings.Contains(err.Error(), " int") || strings.Contains(err.Error(), "!!")) {
			t.Errorf("%q: %v names a Go type", tc.yaml, err)
		}
	}
}

// The example configuration in the repository is valid.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("../../lanes.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) == 0 || c.Limiter.MaxInflight == 0 {
		t.Fatalf("example: %+v", c)
	}
}

// Parsing never panics, and every refusal is a *ConfigError naming the file.
// configSeeds are FuzzParseConfig's seeds, which TestAcceptedConfigsStart
// starts too.
var configSeeds = []string{
	"limiter: {max_inflight: 6}\nupstreams: [{name: gw, base_url: \"https://gw/v1\", capacity: 8}]\n",
	"listen: 127.0.0.1:0\nupstreams:\n  - name: a\n    base_url: http://x\ntargets: [{name: t, url: http://y, interval: 5}]\n",
	"limiter: {max_inflight: 2, tokens_per_minute: 1000, max_inflight_tokens: 500, cold_start: true}\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n",
	"limiter: {max_inflight: 2, tokens_per_minute: 1000}\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\nshared: {redis_url: \"redis://127.0.0.1:1\"}\n",
	"limiter: {max_inflight: 2, cold_start: true}\nupstreams: [{name: gw, base_url: \"https://gw/v1\"}]\nshared: {redis_url: \"redis://127.0.0.1:1\"}\n",
	"limiter: {queue_timeout: 1.5}\n", "{", "- 1", "upstreams: [{name: [], base_url: {}}]", "classification: {wait_p90: -3s}",
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range configSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig("f.yaml", b)
		var ce *ConfigError
		if err != nil && (!errors.As(err, &ce) || ce.File != "f.yaml") {
			t.Fatalf("error %T %v is not a *ConfigError naming the file", err, err)
		}
		if err != nil {
			return
		}
		// What the file accepts, the library accepts: New with the
		// backend the file asks for (its kind: TestAcceptedConfigsStart
		// starts a real one), and a reload.
		lim, err := limiter.New(c.res.limiter, limiter.WithBackend(c.backendKind()))
		if err != nil || len(c.Upstreams) == 0 || c.res.thresholds.Validate() != nil {
			t.Fatalf("accepted an unusable config (limiter.New: %v): %+v", err, c)
		}
		if err := lim.SetConfig(c.res.limiter); err != nil {
			t.Fatalf("accepted a config SetConfig refuses: %v", err)
		}
	})
}

// A file the exporter accepts is one the library starts with: for the
// sample files (lanes.example.yaml, the Kubernetes ConfigMap's), the fuzz target's seeds and each of them with shared lanes
// added, every configuration ParseConfig accepts makes a limiter (New) and
// reloads (SetConfig) with the backend it asks for, a real
// sharedlane.Backend on a redis-server with shared:, none without; and a
// file refused for its limiter section is one the library refuses with
// that backend.
// configMapConfig returns the lanes.yaml of deploy/kubernetes's ConfigMap.
func configMapConfig(t *testing.T) string {
	f, err := os.Open(filepath.Join("..", "..", "deploy", "kubernetes", "lanes-exporter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for d := yaml.NewDecoder(f); ; {
		var doc struct {
			Kind string
			Data map[string]string
		}
		if err := d.Decode(&doc); err != nil {
			t.Fatalf("no ConfigMap with a lanes.yaml in deploy/kubernetes/lanes-exporter.yaml: %v", err)
		}
		if doc.Kind == "ConfigMap" && doc.Data["lanes.yaml"] != "" {
			return doc.Data["lanes.yaml"]
		}
	}
}

func TestAcceptedConfigsStart(t *testing.T) {
	r := redistest.Start(t)
	inputs := map[string]string{}
	for i, s := range configSeeds {
		inputs[fmt.Sprint("seed ", i)] = s
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "lanes.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	inputs["lanes.example.yaml"] = string(b)
	inputs["the Kubernetes ConfigMap"] = configMapConfig(t)
	for name, s := range maps.Clone(inputs) {
		if c, err := ParseConfig("f.yaml", []byte(s)); err == nil && c.Shared == nil {
			inputs[name+", shared"] = s + "\nshared: {redis_url: \"redis://127.0.0.1:1\"}\n"
		}
	}
	started := map[bool]int{}
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		c, err := ParseConfig("f.yaml", []byte(inputs[name]))
		var ce *ConfigError
		if err != nil {
			var raw Config
			if errors.As(err, &ce) && strings.HasPrefix(ce.Key, "limiter.") && yaml.Unmarshal([]byte(inputs[name]), &raw) == nil {
				if raw.limiterConfig().ValidateFor(raw.backendKind()) == nil {
					t.Errorf("%s: refused (%v), but the library accepts its limiter section", name, err)
				}
			}
			continue
		}
		var be limiter.Backend
		if c.res.shared != nil {
			sc := *c.res.shared
			sc.URL, sc.Log = r.URL(), slog.New(slog.DiscardHandler)
			sb, err := sharedlane.New(sc)
			if err != nil {
				t.Fatalf("%s: sharedlane.New: %v", name, err)
			}
			defer sb.Close()
			be = sb
		}
		lim, err := limiter.New(c.res.limiter, limiter.WithBackend(be))
		if err != nil {
			t.Errorf("%s: accepted, but limiter.New refuses it: %v", name, err)
			continue
		}
		if err := lim.SetConfig(c.res.limiter); err != nil {
			t.Errorf("%s: accepted, but SetConfig refuses it: %v", name, err)
		}
		lim.Shutdown()
		started[be != nil]++
	}
	if started[false] < 3 || started[true] < 3 {
		t.Fatalf("started %d configurations with no backend and %d shared: want several of each", started[false], started[true])
	}
}

// The limiter section has one rule, the library's: for every combination
// of its settings, the file is refused exactly when limiter.Config.Validate
// refuses the settings, with the same words, under the file's key.
func TestLimiterSectionIsTheLimitersRule(t *testing.T) {
	up := "upstreams: [{name: gw, base_url: \"https://gw/v1\"}]\n"
	timeouts := []struct {
		yaml string
		d    time.Duration
	}{{"-5s", -5 * time.Second}, {"0", 0}, {"30s", 30 * time.Second}}
	adaptives := []*limiter.Adaptive{nil, {MinInflight: 0}, {MinInflight: 2}, {MinInflight: 5}, {MinInflight: 2, Initial: 9}}
	for _, max := range []int{-1, 0, 4} {
		for _, timeout := range timeouts {
			for _, reserve := range []int{-1, 0, 2} {
				for _, a := range adaptives {
					yaml := fmt.Sprintf("limiter: {max_inflight: %d, queue_timeout: %s, interactive_reserve: %d", max, timeout.yaml, reserve)
					if a != nil {
						yaml += fmt.Sprintf(", adaptive: {min_inflight: %d, initial: %d}", a.MinInflight, a.Initial)
					}
					yaml += "}\n" + up
					lc := limiter.DefaultConfig()
					lc.MaxInflight, lc.QueueTimeout, lc.InteractiveReserve, lc.Adaptive = max, timeout.d, reserve, a
					if timeout.d == 0 {
						lc.QueueTimeout = limiter.DefaultQueueTimeout // the file's 0: the default
					}
					want := lc.Validate()
					_, got := ParseConfig("f.yaml", []byte(yaml))
					var se *limiter.SettingError
					var ce *ConfigError
					switch {
					case want == nil && got != nil:
						t.Errorf("%s: refused (%v), the limiter accepts it", yaml, got)
					case want != nil && got == nil:
						t.Errorf("%s: accepted, the limiter refuses it (%v)", yaml, want)
					case want != nil && (!errors.As(want, &se) || !errors.As(got, &ce) || ce.Key != "limiter."+se.Setting || ce.Err.Error() != se.Problem):
						t.Errorf("%s: %v, want the limiter's %v under limiter.%s", yaml, got, want, se.Setting)
					}
				}
			}
		}
	}
}
