package main

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// streamBody is the short streamed answer every measured call gets: four
// server-sent events, as a gateway streams a few tokens.
var streamEvents = []string{
	"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
	"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
	"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
	"data: [DONE]\n\n",
}

// serveUpstream is the gateway: it answers every path with the four events,
// each flushed as a streaming gateway would. ?ms=N waits N milliseconds
// before the first event (a call that keeps its slot that long); ?hold=1
// waits until the client goes away (a call that keeps its slot for the
// whole measurement).
func serveUpstream(ln net.Listener) error {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		w.Header().Set("Content-Type", "text/event-stream")
		if q.Get("hold") != "" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		if ms, _ := strconv.Atoi(q.Get("ms")); ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		f := w.(http.Flusher)
		for _, e := range streamEvents {
			io.WriteString(w, e)
			f.Flush()
		}
	})
	return (&http.Server{Handler: h}).Serve(ln)
}
