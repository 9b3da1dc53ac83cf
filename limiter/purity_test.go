package limiter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// Reading a lane changes nothing: two limiters driven by the same random
// sequence of calls, releases, queue timeouts, first bytes, losses and
// reloads, one of which takes a snapshot and is scraped (/metrics, with
// every lane series) after every step (after an advance,
// that reads the statistics past their last step, as a scrape after an idle
// spell does), stay in the same state: holders, queue, timers, statistics
// and adaptive controller alike.
//
// It takes 30 sequences rather than the package's 1,000: a scrape at every
// step is the test's cost.
func TestSnapshotChangesNothing(t *testing.T) {
	checks := 0
	rapid.Check(t, func(rt *rapid.T) {
		if checks++; checks > 30 {
			return
		}
		cfg := limiter.Config{MaxInflight: 3, InteractiveReserve: 1, QueueTimeout: 90 * time.Second,
			Adaptive: &limiter.Adaptive{MinInflight: 1, Initial: 2}}
		tel, err := telemetry.New(telemetry.Options{})
		if err != nil {
			rt.Fatal(err)
		}
		defer tel.Shutdown(context.Background())
		read, twin := newHarness(rt, cfg, limiter.WithObserver(tel.Observe)), newHarness(rt, cfg)
		tel.Watch(read.lim)
		both := []*harness{read, twin}
		// The slots held, by call, in each limiter; ids in the order they
		// were granted in the limiter that reads (calls woken together end
		// in no fixed order, so the two are matched by id).
		held := [2]map[string]*limiter.Slot{{}, {}}
		var ids []string
		queued := 0 // calls waiting, the same in both
		ended := func() {
			// Calls the last step ended: as many as left the queue.
			n := queued
			for _, l := range read.lim.Snapshot().Lanes {
				n -= l.Queued
			}
			for i, h := range both {
				var got []string
				for range n {
					if r := h.next(); r.err == nil {
						held[i][r.id] = &r.slot
						got = append(got, r.id)
					}
				}
				if i == 0 {
					slices.Sort(got)
					ids = append(ids, got...)
				}
			}
			queued -= n
		}
		step := 0
		rt.Repeat(map[string]func(*rapid.T){
			"acquire": func(rt *rapid.T) {
				p := rapid.SampledFrom([]limiter.Priority{limiter.Interactive, limiter.Default, limiter.Bulk}).Draw(rt, "priority")
				id := fmt.Sprint("c", step)
				var granted [2]bool
				for i, h := range both {
					g, r := h.call(context.Background(), gw, id, p)
					granted[i] = g
					if g && r.err == nil {
						held[i][id] = &r.slot
						if i == 0 {
							ids = append(ids, id)
						}
					}
				}
				if granted[0] != granted[1] {
					rt.Fatalf("call %s granted at once in one limiter only", id)
				}
				if !granted[0] {
					queued++
				}
			},
			"release": func(rt *rapid.T) {
				if len(ids) == 0 {
					rt.Skip("nothing held")
				}
				i := rapid.IntRange(0, len(ids)-1).Draw(rt, "held")
				for k := range both {
					s, ok := held[k][ids[i]]
					if !ok {
						rt.Fatalf("call %s holds a slot in one limiter only", ids[i])
					}
					s.Release()
					delete(held[k], ids[i])
				}
				ids = slices.Delete(ids, i, i+1)
				ended()
			},
			"advance": func(rt *rapid.T) {
				d := rapid.SampledFrom([]time.Duration{time.Second, 9 * time.Second, 40 * time.Second, 95 * time.Second, 6 * time.Minute}).Draw(rt, "advance")
				for _, h := range both {
					h.clock.Advance(d)
				}
				ended()
			},
			"first byte": func(rt *rapid.T) {
				ms := rapid.SampledFrom([]int{900, 1000, 1000, 1100, 1300, 2500}).Draw(rt, "ms")
				kib := rapid.SampledFrom([]int{1, 1, 8}).Draw(rt, "kib")
				for _, h := range both {
					fb := limiter.FirstByte{Sent: h.clock.Now().Add(-time.Duration(ms) * time.Millisecond), After: time.Duration(ms) * time.Millisecond, RequestBytes: kib << 10}
					h.lim.RecordFirstByte(context.Background(), gw, fb)
				}
				ended()
			},
			"exchange": func(rt *rapid.T) {
				o := rapid.SampledFrom([]limiter.Outcome{limiter.OutcomeOK, limiter.OutcomeOK, limiter.OutcomeRateLimited, limiter.OutcomeServerError}).Draw(rt, "outcome")
				for _, h := range both {
					h.lim.RecordExchange(context.Background(), gw, limiter.Exchange{Outcome: o, Sent: h.clock.Now().Add(-time.Second), Duration: time.Second})
				}
			},
			"reload": func(rt *rapid.T) {
				c := cfg
				c.MaxInflight = rapid.IntRange(2, 4).Draw(rt, "max")
				if rapid.Bool().Draw(rt, "fixed") {
					c.Adaptive = nil
				}
				for _, h := range both {
					if err := h.lim.SetConfig(c); err != nil {
						rt.Fatal(err)
					}
				}
				ended()
			},
			"": func(rt *rapid.T) {
				step++
				lanes := len(read.lim.Snapshot().Lanes)
				rec := httptest.NewRecorder()
				tel.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
				if rec.Code != http.StatusOK || (lanes > 0) != strings.Contains(rec.Body.String(), "llmlanes_llm_inflight{") {
					rt.Fatalf("scrape: %d %.200s", rec.Code, rec.Body)
				}
				if err := limiter.SameLaneState(read.lim, twin.lim, gw); err != nil {
					rt.Fatalf("after step %d, the snapshot changed the lane: %v", step, err)
				}
			},
		})
		for i := range both {
			for _, s := range held[i] {
				s.Release()
			}
		}
		for _, h := range both {
			h.lim.SetConfig(limiter.Config{}) // admits every waiter
		}
	})
}
