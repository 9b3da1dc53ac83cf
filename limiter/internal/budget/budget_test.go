package budget

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// genBudgets draws budgets in any state a lane can reach: a bucket on or
// off at any level, the provider's budgets said or not, a hold, calls in
// flight and grants remembered.
func genBudgets(t *rapid.T) *Budgets {
	b := &Budgets{Inflight: rapid.Int64Range(0, 500).Draw(t, "inflight")}
	if rapid.Bool().Draw(t, "bucket") {
		c := float64(rapid.Int64Range(1, 1000).Draw(t, "cap"))
		b.Bucket = Bucket{On: true, Cap: c, Level: float64(rapid.Int64Range(-int64(c), int64(c)).Draw(t, "level")), At: rapid.Int64Range(0, int64(time.Minute)).Draw(t, "bucketAt")}
	}
	for _, m := range []*Mirror{&b.Tokens, &b.Requests} {
		if rapid.Bool().Draw(t, "said") {
			limit := rapid.Int64Range(0, 1000).Draw(t, "limit")
			*m = Said(limit, rapid.Int64Range(0, 1000).Draw(t, "remaining"), time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "reset")),
				rapid.Int64Range(0, int64(time.Minute)).Draw(t, "saidAt"), float64(rapid.Int64Range(0, 200).Draw(t, "since")), time.Minute)
		}
	}
	if rapid.Bool().Draw(t, "hold") {
		b.Hold = rapid.Int64Range(1, int64(2*time.Minute)).Draw(t, "holdUntil")
	}
	for range rapid.IntRange(0, 5).Draw(t, "grants") {
		b.Advance(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "grantAt"))
		b.Take(rapid.Int64Range(0, 100).Draw(t, "grantCost"))
	}
	return b
}

// Fits is pure, and a grant's Advance to its time changes nothing of what
// Fits answers then: the snapshot may ask it, and a grant may look, then
// advance, then take, under one lock.
func TestFitsIsPure(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := genBudgets(t)
		now := rapid.Int64Range(0, int64(3*time.Minute)).Draw(t, "now")
		cost := rapid.Int64Range(0, 1200).Draw(t, "cost")
		maxIn := rapid.Int64Range(0, 600).Draw(t, "maxInflight")
		before := *b
		r, wake := b.Fits(now, cost, maxIn)
		if *b != before {
			t.Fatalf("Fits changed the budgets: %+v, was %+v", *b, before)
		}
		if r != Fit && wake != 0 && wake <= now {
			t.Fatalf("Fits: %v, to look again at %d, not after now %d", r, wake, now)
		}
		b.Advance(now)
		if r2, wake2 := b.Fits(now, cost, maxIn); r2 != r || wake2 != wake {
			t.Fatalf("at %d: %v %d before Advance, %v %d after", now, r, wake, r2, wake2)
		}
	})
}

// A call that fits, taken, leaves the bucket less its cost; one that does
// not fit at the wake-up time Fits gave for the bucket fits then.
func TestBucketWake(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := float64(rapid.Int64Range(1, 1000).Draw(t, "cap"))
		b := &Budgets{Bucket: Bucket{On: true, Cap: c, Level: float64(rapid.Int64Range(-int64(c), int64(c)).Draw(t, "level"))}}
		cost := rapid.Int64Range(1, int64(c)).Draw(t, "cost")
		now := rapid.Int64Range(0, int64(time.Minute)).Draw(t, "now")
		r, wake := b.Fits(now, cost, 0)
		switch r {
		case Fit:
			b.Advance(now)
			level := b.Bucket.Level
			b.Take(cost)
			if b.Bucket.Level != max(-c, level-float64(cost)) || b.Inflight != cost {
				t.Fatalf("took %d from %v: level %v, in flight %d", cost, level, b.Bucket.Level, b.Inflight)
			}
		case Tokens:
			if r2, _ := b.Fits(wake, cost, 0); r2 != Fit {
				t.Fatalf("the bucket said %d would fit at %d; it does not (%v)", cost, wake, r2)
			}
		default:
			t.Fatalf("a bucket alone: %v", r)
		}
	})
}

// The provider's word binds until its reset and past it until refilled,
// and once it stops binding it never binds again (Expire relies on it).
func TestMirrorStopsForGood(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(0, 1000).Draw(t, "limit")
		m := Said(limit, rapid.Int64Range(0, 1000).Draw(t, "remaining"), time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "reset")), 0, 0, time.Minute)
		stopped := int64(-1)
		for now := int64(0); now <= int64(3*time.Minute); now += int64(time.Second) {
			a := m.Active(now)
			if now < m.Until && !a {
				t.Fatalf("inactive at %d, before its reset %d", now, m.Until)
			}
			if stopped >= 0 && a {
				t.Fatalf("stopped at %d, active again at %d", stopped, now)
			}
			if !a && stopped < 0 {
				stopped = now
			}
		}
		if stopped < 0 || stopped > int64(2*time.Minute)+int64(time.Second) {
			t.Fatalf("still binding at %d: a word binds for at most two windows", stopped)
		}
	})
}
