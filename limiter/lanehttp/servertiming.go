package lanehttp

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serverTiming puts the lane's metrics first in h's Server-Timing (see
// Transport.ServerTiming): the wait for lane's slot and, unless upstream
// is negative (no request was sent), the time to the upstream's headers.
// The upstream's own metrics follow, as it sent them.
func (t *Transport) serverTiming(h http.Header, lane string, wait, upstream time.Duration) {
	name := lane
	if t.Describe != nil {
		name = t.Describe(lane)
	}
	var b strings.Builder
	b.WriteString("lane;dur=")
	b.WriteString(ms(wait))
	b.WriteString(`;desc="`)
	for _, c := range []byte(name) { // a quoted-string: \ and " escaped, no controls
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	if upstream >= 0 {
		b.WriteString(", upstream;dur=")
		b.WriteString(ms(upstream))
	}
	theirs := h.Values("Server-Timing")
	h["Server-Timing"] = append([]string{b.String()}, theirs...)
}

// ms writes d in milliseconds, to a tenth.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Round(100*time.Microsecond))/float64(time.Millisecond), 'f', -1, 64)
}
