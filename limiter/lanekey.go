package limiter

import (
	"net/url"
	"strings"
)

// LaneKey returns the key of the lane of model calls to model at the
// endpoint baseURL: "<base>|<model>", with the base URL in the one spelling
// that every part of llmlanes uses (see BaseKey), so that the transport, the
// proxy, the configuration and other processes' snapshots name a lane
// alike. A baseURL that does not parse is used as it is, without a
// trailing slash.
func LaneKey(baseURL, model string) string {
	return CanonicalBase(baseURL) + "|" + model
}

// CanonicalBase returns baseURL as lane keys spell it (see BaseKey).
func CanonicalBase(baseURL string) string {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return strings.TrimRight(baseURL, "/")
	}
	return BaseKey(u.Scheme, u.Host, u.EscapedPath())
}

// BaseKey returns the canonical spelling of a base URL from its parts: the
// scheme and host in lower case, the port left out when it is the scheme's
// default (80 for http, 443 for https), and the path as given (paths are
// case-sensitive) without a trailing slash. User info, query and fragment
// are never part of a key. "HTTPS://GW.example:443/V1/" gives
// "https://gw.example/V1".
func BaseKey(scheme, host, path string) string {
	scheme, host = lower(scheme), lower(host)
	switch {
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = host[:len(host)-4]
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = host[:len(host)-3]
	}
	return scheme + "://" + host + strings.TrimRight(path, "/")
}

// lower is strings.ToLower without an allocation for a string that is
// already in lower case, as hosts nearly always are.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// SplitLaneKey returns the base URL and the model of a lane key. A base URL
// never holds a "|" (BaseKey's path is escaped), so the model is all that
// follows the first one, "|"s of its own included; a key without one is all
// base.
func SplitLaneKey(key string) (base, model string) {
	if i := strings.IndexByte(key, '|'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return key, ""
}
