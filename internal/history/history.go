package history

import (
	"sort"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/classify"
)

// Sample is one lane's figures at one instant: 48 bytes, so that 1,000
// lanes over 15 minutes at 2 s (450 samples each) take 21.6 MB.
type Sample struct {
	At       int64 // Unix milliseconds
	Inflight int32
	Limit    int32
	// Queued by class.
	Interactive, Default, Bulk int32
	// WaitP90 is the 5-minute p90 wait in seconds; NaN when no wait ended
	// in those 5 minutes.
	WaitP90 float32
	// QueueTimeouts and UpstreamErrors are the counts of the last 5
	// minutes, as the classification has them.
	QueueTimeouts, UpstreamErrors int32
	State                         State
}

// State is a classification state, as an index into classify.States().
type State uint8

// StateOf is s's State.
func StateOf(s classify.State) State {
	for i, st := range classify.States() {
		if st == s {
			return State(i)
		}
	}
	return 0
}

// History is the samples of every lane.
type History struct {
	size int // samples kept per lane

	mu    sync.Mutex // guards lanes
	lanes map[string]*ring
}

// New keeps window / interval samples a lane (at least one).
func New(window, interval time.Duration) *History {
	return &History{size: max(1, int(window/interval)), lanes: map[string]*ring{}}
}

// ring is one lane's samples, oldest first from next once full.
type ring struct {
	buf  []Sample // grows to size, then wraps
	next int      // where the next sample goes once buf is full
}

func (r *ring) add(s Sample, size int) {
	if len(r.buf) < size {
		if len(r.buf) == cap(r.buf) {
			// Grown by doubling up to exactly size (append could leave up
			// to twice the window allocated): a lane seen for a minute costs
			// a minute's samples, one there the whole window its window.
			grown := make([]Sample, len(r.buf), min(size, max(16, 2*cap(r.buf))))
			copy(grown, r.buf)
			r.buf = grown
		}
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % size
}

// after returns the samples later than t, oldest first.
func (r *ring) after(t int64) []Sample {
	out := make([]Sample, 0, len(r.buf))
	for i := range r.buf {
		if s := r.buf[(r.next+i)%len(r.buf)]; s.At > t {
			out = append(out, s)
		}
	}
	return out
}

// Record adds one sample for each lane of samples and forgets every lane
// it does not name.
func (h *History) Record(samples map[string]Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for lane := range h.lanes {
		if _, ok := samples[lane]; !ok {
			delete(h.lanes, lane)
		}
	}
	for lane, s := range samples {
		r := h.lanes[lane]
		if r == nil {
			r = &ring{}
			h.lanes[lane] = r
		}
		r.add(s, h.size)
	}
}

// Series is one lane's samples.
type Series struct {
	Lane    string
	Samples []Sample
}

// Since returns every lane's samples later than t (Unix milliseconds; 0
// for all), the lanes in order of name.
func (h *History) Since(t int64) []Series {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Series, 0, len(h.lanes))
	for lane, r := range h.lanes {
		out = append(out, Series{Lane: lane, Samples: r.after(t)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lane < out[j].Lane })
	return out
}

// Lanes is the number of lanes with a history.
func (h *History) Lanes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lanes)
}
