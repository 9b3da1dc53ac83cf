package exporter

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// streamWriter is the ResponseWriter the reverse proxy writes an answer
// to. It does two things.
//
// It bounds every write: a write (or flush) that cannot complete within
// proxy.write_timeout fails, so that a client that stops reading (an
// HTTP/2 client that keeps its window at zero, an HTTP/1.1 client that
// reads nothing more) releases its handler, its goroutines and the
// buffers behind them within write_timeout of its last read, rather than
// when it closes the connection. The deadline is moved before a write
// when it would move by an eighth of write_timeout or more (moving it is a
// message to an HTTP/2 connection's goroutine, and a stream writes often):
// so every write has at least seven eighths of write_timeout to complete,
// and a client that reads, however slowly, is never cut.
//
// And, when releasing the call's slot cannot block (coalesce), it skips
// the flush after the last write: the reverse proxy flushes a stream after
// every write, so that no event waits, and once the gateway's body has
// ended (the read that returned the last data also returned io.EOF) the
// handler returns right after, and net/http then writes the last data and
// the end of the response together, one write where there were two. An
// event is never held back: while the body goes on, every write is
// flushed as before. With lanes shared in Redis the release is a round
// trip to Redis, made before the handler returns, and the last data must
// not wait for it.
type streamWriter struct {
	http.ResponseWriter
	rc           *http.ResponseController
	writeTimeout time.Duration
	due          time.Time // the write deadline set; only the handler's goroutine writes
	coalesce     bool
	ended        atomic.Bool // the gateway's body has ended
}

type streamKey struct{}

func newStreamWriter(w http.ResponseWriter, writeTimeout time.Duration, coalesce bool) *streamWriter {
	return &streamWriter{ResponseWriter: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, coalesce: coalesce}
}

// deadline gives the next write between seven eighths of writeTimeout
// and writeTimeout to complete.
func (w *streamWriter) deadline() {
	if due := time.Now().Add(w.writeTimeout); due.Sub(w.due) >= w.writeTimeout/8 {
		w.due = due
		_ = w.rc.SetWriteDeadline(due)
	}
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.deadline()
	return w.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController, and so the reverse proxy,
// calls to flush.
func (w *streamWriter) FlushError() error {
	if w.coalesce && w.ended.Load() {
		return nil
	}
	w.deadline()
	return w.rc.Flush()
}

// Unwrap gives http.ResponseController the writer underneath (for
// Hijack, deadlines and full duplex).
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// endWatch is the gateway's response body, seen by the reverse proxy: it
// tells the streamWriter when the body has ended.
type endWatch struct {
	io.ReadCloser
	w *streamWriter
}

func (b *endWatch) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.w.ended.Store(true)
	}
	return n, err
}

// watchEnd puts an endWatch on res's body when the call came through a
// streamWriter. A protocol switch (101) keeps its body, which the reverse
// proxy uses as the connection.
func watchEnd(res *http.Response) {
	w, ok := res.Request.Context().Value(streamKey{}).(*streamWriter)
	if ok && res.StatusCode != http.StatusSwitchingProtocols && res.Body != nil {
		res.Body = &endWatch{res.Body, w}
	}
}
