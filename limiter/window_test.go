package limiter

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
		w := window{origin: time.Unix(0, 0)}
		now := time.Unix(0, 0)
		var xs []float64
		for n := 1 + rng.IntN(50); n > 0; n-- {
			ds := rng.IntN(511) // the exact range: results must match to 0.1 s
			if rng.IntN(4) == 0 {
				ds = 0
			}
			w.recordWait(now, time.Duration(ds)*100*time.Millisecond)
			xs = append(xs, float64(ds)/10)
		}
		p50, p90, ok := w.percentiles()
		if !ok {
			t.Fatal("no percentiles")
		}
		if math.Abs(p50-reference(xs, 0.5)) > 1e-9 || math.Abs(p90-reference(xs, 0.9)) > 1e-9 {
			t.Fatalf("trial %d: got %v/%v, want %v/%v (%v)", trial, p50, p90, reference(xs, 0.5), reference(xs, 0.9), xs)
		}
	}
}

func TestPercentilesLongWaitsWithinBucketError(t *testing.T) {
	w := window{origin: time.Unix(0, 0)}
	var xs []float64
	for _, s := range []float64{38, 120, 171, 212.4, 290} {
		w.recordWait(time.Unix(0, 0), time.Duration(s*float64(time.Second)))
		xs = append(xs, s)
	}
	p50, p90, _ := w.percentiles()
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
	w := window{origin: origin}
	rng := rand.New(rand.NewPCG(3, 4))
	now := origin
	for s := 0; s < 6*60; s++ {
		for i := 0; i < 10000; i++ {
			now = origin.Add(time.Duration(s)*time.Second + time.Duration(i)*100*time.Microsecond)
			w.recordWait(now, time.Duration(rng.Int64N(int64(300*time.Second))))
		}
	}
	hists := 0
	for _, sl := range w.slots {
		if sl.waits != nil {
			hists++
		}
	}
	if hists > int(windowSteps) {
		t.Fatalf("%d step histograms, bound is %d", hists, windowSteps)
	}
	if w.nwaits+w.zeros > 310*10000 || w.nwaits+w.zeros < 300*10000 {
		t.Fatalf("window holds %d grants, want 300-310 s worth", w.nwaits+w.zeros)
	}
	allocs := testing.AllocsPerRun(10000, func() {
		now = now.Add(time.Millisecond)
		w.recordWait(now, 42*time.Second)
	})
	if allocs != 0 {
		t.Fatalf("steady-state recording allocates %v", allocs)
	}
}
