package exporter

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Client speaks HTTP/2 frames itself (h2c, prior knowledge), so that a
// test can do what no well-behaved client does: keep its window at zero,
// or open streams whose bodies never end. It reads every frame the server
// sends and counts the answers' status codes.
type h2Client struct {
	c  net.Conn
	mu sync.Mutex // guards the writes: fr's, enc's and hb's
	fr *http2.Framer
	hb bytes.Buffer
	en *hpack.Encoder
	id uint32 // the last stream opened

	statusMu sync.Mutex
	statuses map[int]int // status → answers
}

// dialH2 connects, sends the preface and the settings given, and starts
// reading.
func dialH2(t *testing.T, addr string, settings ...http2.Setting) *h2Client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2Client{c: c, fr: http2.NewFramer(c, c), statuses: map[int]int{}}
	h.en = hpack.NewEncoder(&h.hb)
	io.WriteString(c, http2.ClientPreface)
	h.fr.WriteSettings(settings...)
	rd := http2.NewFramer(nil, c) // reads only; the writer's framer is h.fr
	rd.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	go func() {
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				return
			}
			if m, ok := f.(*http2.MetaHeadersFrame); ok {
				if code, err := strconv.Atoi(m.PseudoValue("status")); err == nil {
					h.statusMu.Lock()
					h.statuses[code]++
					h.statusMu.Unlock()
				}
			}
		}
	}()
	return h
}

// post opens a stream for a POST of path, with the extra headers given
// (name, value pairs), sends data, and ends the stream's body if end.
func (h *h2Client) post(path string, data []byte, end bool, headers ...string) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hb.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":authority", "x", ":path", path, "content-type", "application/json"}, headers...)
	for i := 0; i < len(fields); i += 2 {
		h.en.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	h.id += 2
	if h.id == 2 {
		h.id = 1
	}
	h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.id, BlockFragment: h.hb.Bytes(), EndHeaders: true})
	h.fr.WriteData(h.id, end, data)
	return h.id
}

// answers reports how many answers of each status have come.
func (h *h2Client) answers() map[int]int {
	h.statusMu.Lock()
	defer h.statusMu.Unlock()
	m := make(map[int]int, len(h.statuses))
	for k, v := range h.statuses {
		m[k] = v
	}
	return m
}

// contentLength is a header pair for h2Client.post.
func contentLength(n int) []string { return []string{"content-length", fmt.Sprint(n)} }
