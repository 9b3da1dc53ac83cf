// Package redact hides the secrets a URL may carry, for logs, errors and
// telemetry. It is the one rule llmlanes has for it: lanehttp's errors,
// the spans' url.full, lanes-exporter's configuration errors and the
// Redis URL in sharedlane's logs all show a URL through it.
package redact

import "net/url"

// Marker is what a hidden secret is replaced by (OpenTelemetry's word for
// it in url.full).
const Marker = "REDACTED"

// URL returns u as text with what may be a secret hidden: its user
// information (user and password: either may be a key) and every query
// value replaced by Marker, since which of a query's values are harmless
// cannot be known (api-key, sig, code, password all carry keys), and its
// fragment dropped. The query's keys, the host and the path stay. u is not
// changed.
func URL(u *url.URL) string {
	r := *u
	if r.User != nil {
		if _, ok := r.User.Password(); ok {
			r.User = url.UserPassword(Marker, Marker)
		} else {
			r.User = url.User(Marker)
		}
	}
	r.Fragment, r.RawFragment = "", ""
	if r.RawQuery != "" {
		q, err := url.ParseQuery(r.RawQuery)
		if err != nil {
			r.RawQuery = Marker
		} else {
			for k := range q {
				q[k] = []string{Marker}
			}
			r.RawQuery = q.Encode()
		}
	}
	return r.String()
}

// String is URL for a URL as text. A URL that does not parse is not shown
// at all: what could not be parsed cannot be redacted.
func String(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse, not shown: it may hold a secret)"
	}
	return URL(u)
}
