package history

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/llmlanes/llmlanes/classify"
)

func at(ms int64, inflight int32) Sample {
	return Sample{At: ms, Inflight: inflight, WaitP90: float32(math.NaN())}
}

func times(s []Sample) []int64 {
	out := make([]int64, len(s))
	for i, x := range s {
		out[i] = x.At
	}
	return out
}

// A lane keeps window/interval samples, oldest first, the oldest
// overwritten once the ring is full.
func TestRingKeepsTheWindow(t *testing.T) {
	h := New(6*time.Second, 2*time.Second) // 3 samples
	for i := int64(1); i <= 5; i++ {
		h.Record(map[string]Sample{"a": at(i*1000, int32(i))})
		if got, want := len(h.Since(0)[0].Samples), int(min(i, 3)); got != want {
			t.Fatalf("after %d samples %d kept, want %d", i, got, want)
		}
	}
	s := h.Since(0)[0].Samples
	if fmt.Sprint(times(s)) != "[3000 4000 5000]" || s[0].Inflight != 3 || s[2].Inflight != 5 {
		t.Fatalf("kept %+v, want the last three, oldest first", s)
	}
	if got := times(h.Since(3000)[0].Samples); fmt.Sprint(got) != "[4000 5000]" {
		t.Fatalf("since 3000: %v", got)
	}
	if got := h.Since(5000); len(got) != 1 || got[0].Lane != "a" || len(got[0].Samples) != 0 {
		t.Fatalf("since the last sample: %+v, want lane a with no samples", got)
	}
}

// A lane a Record leaves out (the limiter forgot it) loses its history at
// once; lanes come back in order of name.
func TestForgottenLaneDropped(t *testing.T) {
	h := New(time.Minute, 2*time.Second)
	h.Record(map[string]Sample{"b": at(1, 1), "a": at(1, 2)})
	if got := h.Since(0); len(got) != 2 || got[0].Lane != "a" || got[1].Lane != "b" {
		t.Fatalf("lanes %+v", got)
	}
	h.Record(map[string]Sample{"a": at(2, 2)})
	if got := h.Since(0); h.Lanes() != 1 || len(got) != 1 || got[0].Lane != "a" || len(got[0].Samples) != 2 {
		t.Fatalf("after b was forgotten: %+v", got)
	}
	h.Record(map[string]Sample{"b": at(3, 1), "a": at(3, 2)})
	if got := h.Since(0); len(got[1].Samples) != 1 {
		t.Fatalf("b came back with its old history: %+v", got[1])
	}
}

// The memory is bounded by the lanes times the window: 1,000 lanes over
// 15 minutes at 2 s, written twice round, hold about 1,000 × 450 × 48
// bytes; a lane seen for a short while holds only its samples, rounded up
// to a power of two from 16.
func TestMemoryBound(t *testing.T) {
	if unsafe.Sizeof(Sample{}) != 48 {
		t.Fatalf("a Sample is %d bytes; the docs say 48", unsafe.Sizeof(Sample{}))
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	young := New(15*time.Minute, 2*time.Second)
	for tick := range 20 {
		young.Record(map[string]Sample{"a": at(int64(tick), 1)})
	}
	if c := cap(young.lanes["a"].buf); c != 32 {
		t.Fatalf("20 samples take room for %d", c)
	}
	h := New(15*time.Minute, 2*time.Second)
	samples := make(map[string]Sample, 1000)
	for i := range 1000 {
		samples[fmt.Sprintf("http://gw-%d/v1|model", i)] = Sample{}
	}
	for tick := range 900 {
		for k := range samples {
			samples[k] = at(int64(tick), 1)
		}
		h.Record(samples)
	}
	used := heap() - before
	want := uint64(1000 * 450 * 48)
	t.Logf("1,000 lanes × 450 samples: %.1f MiB held (the samples alone %.1f MiB)", float64(used)/(1<<20), float64(want)/(1<<20))
	if used > want*11/10 {
		t.Fatalf("history holds %d bytes, want at most %d (+10%%)", used, want)
	}
	if n, c := len(h.Since(0)[0].Samples), cap(h.lanes["http://gw-0/v1|model"].buf); n != 450 || c != 450 {
		t.Fatalf("a lane kept %d samples in room for %d, want 450 in 450", n, c)
	}
	runtime.KeepAlive(h)
}

// Columns carry every figure; a wait with no value is null, and states
// are indexes into classify.States().
func TestColumnsOf(t *testing.T) {
	w := float32(1.5)
	cols := ColumnsOf([]Series{{Lane: "a", Samples: []Sample{
		{At: 1, Inflight: 2, Limit: 4, Interactive: 1, Default: 2, Bulk: 3, WaitP90: float32(math.NaN()), QueueTimeouts: 5, UpstreamErrors: 6, State: StateOf(classify.GatewayDegraded)},
		{At: 2, WaitP90: w, State: StateOf(classify.Idle)},
	}}})
	c := cols[0]
	if c.Lane != "a" || fmt.Sprint(c.At, c.Inflight, c.Limit, c.Interactive, c.Default, c.Bulk, c.QueueTimeouts, c.Upstream) !=
		"[1 2] [2 0] [4 0] [1 0] [2 0] [3 0] [5 0] [6 0]" {
		t.Fatalf("columns %+v", c)
	}
	if c.WaitP90[0] != nil || c.WaitP90[1] == nil || *c.WaitP90[1] != w {
		t.Fatalf("waits %v", c.WaitP90)
	}
	if classify.States()[c.State[0]] != classify.GatewayDegraded || classify.States()[c.State[1]] != classify.Idle {
		t.Fatalf("states %v", c.State)
	}
}
