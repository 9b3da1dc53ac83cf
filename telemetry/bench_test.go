package telemetry_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/telemetry"
)

// hundredLanes returns telemetry watching a limiter with 100 lanes, each
// with some history: grants with waits, a queued call, upstream outcomes.
func hundredLanes(b *testing.B) (*telemetry.Telemetry, func()) {
	tel, _ := telemetry.New(telemetry.Options{})
	lim, _ := limiter.New(limiter.Config{MaxInflight: 2, QueueTimeout: time.Hour, InteractiveReserve: 1}, limiter.WithObserver(tel.Observe))
	tel.Watch(lim)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	n := 0
	for i := range 100 {
		lane := fmt.Sprintf("https://gw%d/v1|model-%d", i%4, i)
		for range 20 {
			s, _ := lim.Acquire(ctx, lane)
			lim.RecordExchange(ctx, lane, limiter.Exchange{Outcome: limiter.Outcome(i % 4), Status: 200, FirstByte: time.Second})
			s.Release()
		}
		held, _ := lim.Acquire(ctx, lane)
		n++
		go func() { // one bulk call waits in every lane
			s, err := lim.Acquire(limiter.WithPriority(ctx, limiter.Bulk), lane)
			if err == nil {
				s.Release()
			}
			done <- struct{}{}
		}()
		defer held.Release()
	}
	return tel, func() {
		cancel()
		for range n {
			<-done
		}
		tel.Shutdown(context.Background())
	}
}

// BenchmarkRoutes measures serving the snapshot, the classification and a
// /metrics scrape with 100 lanes: what a poller every second costs.
func BenchmarkRoutes(b *testing.B) {
	tel, stop := hundredLanes(b)
	defer stop()
	h := tel.Handler()
	for _, path := range []string{telemetry.SnapshotPath, telemetry.ClassificationPath, telemetry.MetricsPath} {
		b.Run("lanes-100"+path, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != 200 {
					b.Fatal(rec.Code)
				}
			}
		})
	}
}
