package stats

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func TestHistBuckets(t *testing.T) {
	prev := -1
	for ds := uint64(0); ds < 1<<21; ds += 1 + ds/1000 {
		i := histIndex(ds)
		if i < prev {
			t.Fatalf("index not monotonic at %d", ds)
		}
		prev = i
		lo, width := histLow(i)
		if ds < histExact && (lo != ds || width != 1) {
			t.Fatalf("ds %d: bucket from %d wide %d, want exact", ds, lo, width)
		}
		if ds < 1<<20 && (ds < lo || ds >= lo+width || float64(width) > 0.016*float64(lo)+1) {
			t.Fatalf("ds %d: bucket from %d wide %d: not in it, or wider than 1.6%%", ds, lo, width)
		}
		if off := histOffset(ds, i); ds < 1<<20 && lo+off != ds {
			t.Fatalf("ds %d: offset %d from %d", ds, off, lo)
		}
	}
	if histIndex(1<<40) != histBuckets-1 {
		t.Fatal("huge wait not in the last bucket")
	}
}

// reference computes a percentile the plain way: sort, then interpolate
// linearly between the closest ranks.
func reference(xs []float64, p float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	h := p * float64(len(s)-1)
	lo := int(h)
	if lo+1 >= len(s) {
		return s[lo]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

func TestPercentilesMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		w := New(time.Unix(0, 0))
		now := time.Unix(0, 0)
		var xs []float64
		for n := 1 + rng.IntN(50); n > 0; n-- {
			ds := rng.IntN(511) // the exact range: results must match to 0.1 s
			if rng.IntN(4) == 0 {
				ds = 0
			}
			w.Wait(now, time.Duration(ds)*100*time.Millisecond)
			xs = append(xs, float64(ds)/10)
		}
		v := w.At(now)
		p50, p90, ok := v.Percentiles()
		if !ok {
			t.Fatal("no percentiles")
		}
		if math.Abs(p50-reference(xs, 0.5)) > 1e-9 || math.Abs(p90-reference(xs, 0.9)) > 1e-9 {
			t.Fatalf("trial %d: got %v/%v, want %v/%v (%v)", trial, p50, p90, reference(xs, 0.5), reference(xs, 0.9), xs)
		}
	}
}

func TestPercentilesLongWaitsWithinBucketError(t *testing.T) {
	w := New(time.Unix(0, 0))
	var xs []float64
	for _, s := range []float64{38, 120, 171, 212.4, 290} {
		w.Wait(time.Unix(0, 0), time.Duration(s*float64(time.Second)))
		xs = append(xs, s)
	}
	v := w.At(time.Unix(0, 0))
	p50, p90, _ := v.Percentiles()
	for _, c := range [][2]float64{{p50, reference(xs, 0.5)}, {p90, reference(xs, 0.9)}} {
		if math.Abs(c[0]-c[1]) > 0.016*c[1] {
			t.Fatalf("got %v, want %v within 1.6%%", c[0], c[1])
		}
	}
}

// 10,000 grants a second for 6 minutes, with waits spread over the whole
// range: memory stays at the stated bound and recording stops allocating
// once every step has its histogram.
func TestWindowMemoryBounded(t *testing.T) {
	origin := time.Unix(0, 0)
	w := New(origin)
	rng := rand.New(rand.NewPCG(3, 4))
	now := origin
	for s := 0; s < 6*60; s++ {
		for i := 0; i < 10000; i++ {
			now = origin.Add(time.Duration(s)*time.Second + time.Duration(i)*100*time.Microsecond)
			w.Wait(now, time.Duration(rng.Int64N(int64(300*time.Second))))
		}
	}
	hists := 0
	for _, sl := range w.slots {
		if sl.waits != nil {
			hists++
		}
	}
	if hists > int(steps) {
		t.Fatalf("%d step histograms, bound is %d", hists, steps)
	}
	if w.nwaits+w.zeros > 310*10000 || w.nwaits+w.zeros < 300*10000 {
		t.Fatalf("window holds %d grants, want 300-310 s worth", w.nwaits+w.zeros)
	}
	allocs := testing.AllocsPerRun(10000, func() {
		now = now.Add(time.Millisecond)
		w.Wait(now, 42*time.Second)
	})
	if allocs != 0 {
		t.Fatalf("steady-state recording allocates %v", allocs)
	}
}

// A reading changes nothing, and agrees with the window moved to its time:
// a snapshot at any moment never changes what the lane reports later.
func TestReadingChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	origin := time.Unix(0, 0)
	for trial := 0; trial < 20; trial++ {
		w := New(origin)
		now := origin
		for n := 0; n < 100; n++ {
			now = now.Add(time.Duration(rng.IntN(20000)) * time.Millisecond)
			switch rng.IntN(5) {
			case 0:
				w.Wait(now, time.Duration(rng.IntN(400))*time.Second)
			case 1:
				w.Timeout(now, 300*time.Second)
			case 2:
				w.Exchange(now, rng.IntN(Outcomes), rng.IntN(3) == 0, time.Duration(rng.IntN(60))*time.Second, rng.IntN(2) == 0)
			case 3:
				w.Busy(now, time.Duration(rng.IntN(10))*time.Second)
			default:
				w.Advance(now)
				w.Zero()
			}
			later := now.Add(time.Duration(rng.IntN(400)) * time.Second)
			before := w.clone()
			v := w.At(later)
			got := summary(&v)
			if !equalWindows(before, &w) {
				t.Fatalf("trial %d: At changed the window", trial)
			}
			moved := w.clone()
			moved.Advance(later)
			mv := moved.At(later)
			if want := summary(&mv); got != want {
				t.Fatalf("trial %d: read at %s: %+v, moved there: %+v", trial, later.Sub(origin), got, want)
			}
		}
	}
}

type reading struct {
	p50, p90  float64
	ok        bool
	timeouts  int
	upstream  Upstream
	rate      float64
	rateOK    bool
	lastErr   time.Duration
	lastErrOK bool
}

func summary(v *View) reading {
	var r reading
	r.p50, r.p90, r.ok = v.Percentiles()
	r.timeouts, r.upstream = v.Timeouts(), v.Upstream()
	r.rate, r.rateOK = v.ServiceRate(4, 0)
	r.lastErr, r.lastErrOK = v.LastErrorAge()
	return r
}

// clone copies the window and its histograms.
func (w *Window) clone() *Window {
	c := *w
	if w.waits != nil {
		h := *w.waits
		c.waits = &h
	}
	for i := range c.slots {
		if h := c.slots[i].waits; h != nil {
			hc := *h
			c.slots[i].waits = &hc
		}
	}
	return &c
}

func equalWindows(a, b *Window) bool {
	x, y := a.clone(), b.clone()
	if (x.waits == nil) != (y.waits == nil) || (x.waits != nil && *x.waits != *y.waits) {
		return false
	}
	for i := range x.slots {
		hx, hy := x.slots[i].waits, y.slots[i].waits
		if (hx == nil) != (hy == nil) || (hx != nil && *hx != *hy) {
			return false
		}
		x.slots[i].waits, y.slots[i].waits = nil, nil
	}
	x.waits, y.waits = nil, nil
	return *x == *y
}

// Tokens are counted in the window's steps like its other figures: the
// last minute is the step of now and the 6 before it, the window its 31
// steps, and a step that falls out of the window takes its tokens with it,
// whether or not the window was advanced in between.
func TestWindowTokens(t *testing.T) {
	origin := time.Unix(1000, 0)
	w := New(origin)
	if got := w.TokensOf(origin, Steps-1); got != (Tokens{}) {
		t.Fatalf("no tokens yet: %+v", got)
	}
	at := func(d time.Duration) time.Time { return origin.Add(d) }
	w.Advance(at(0))
	w.Settled(Tokens{Prompt: 10, Completion: 5, Estimate: 20})
	w.Advance(at(65 * time.Second)) // step 6
	w.Settled(Tokens{Prompt: 1, Completion: 1, Estimate: 1})
	w.Settled(Tokens{Prompt: -3, Completion: 1}) // a negative use counts as none
	if got, want := w.TokensOf(at(65*time.Second), 6), (Tokens{11, 7, 21}); got != want {
		t.Fatalf("last minute at 65 s: %+v, want %+v", got, want)
	}
	if got, want := w.TokensOf(at(75*time.Second), 6), (Tokens{1, 2, 1}); got != want {
		t.Fatalf("last minute at 75 s (step 0 out of it): %+v, want %+v", got, want)
	}
	if got, want := w.TokensOf(at(5*time.Minute+5*time.Second), Steps-1), (Tokens{11, 7, 21}); got != want {
		t.Fatalf("window at 305 s: %+v, want %+v", got, want)
	}
	if got, want := w.TokensOf(at(5*time.Minute+15*time.Second), Steps-1), (Tokens{1, 2, 1}); got != want {
		t.Fatalf("window at 315 s, read without advancing: %+v, want %+v", got, want)
	}
	w.Advance(at(6*time.Minute + 15*time.Second))
	if got := w.TokensOf(at(6*time.Minute+15*time.Second), Steps-1); got != (Tokens{}) {
		t.Fatalf("advanced past both steps: %+v, want none", got)
	}
}
