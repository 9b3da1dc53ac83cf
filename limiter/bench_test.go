package limiter_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/llmlanes/llmlanes/limiter"
)

type chanSem chan struct{}

func (c chanSem) acquire(ctx context.Context) error {
	select {
	case c <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (c chanSem) release() { <-c }

func newLim(b *testing.B, n int) *limiter.Limiter {
	lim, err := limiter.New(limiter.Config{MaxInflight: n})
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

// BenchmarkAcquireRelease measures one acquire+release of llmlanes beside
// x/sync/semaphore and a channel semaphore: uncontended, in parallel on
// one lane with slots to spare, and with 1,000 and 100,000 goroutines
// contending for one slot (classes mixed for llmlanes).
func BenchmarkAcquireRelease(b *testing.B) {
	const lane = "https://gw/v1|protolabs/smart"
	ctx := context.Background()
	b.Run("uncontended/llmlanes-off", func(b *testing.B) {
		lim := newLim(b, 0)
		b.ReportAllocs()
		for b.Loop() {
			s, _ := lim.Acquire(ctx, lane)
			s.Release()
		}
	})
	b.Run("uncontended/llmlanes", func(b *testing.B) {
		lim := newLim(b, 6)
		b.ReportAllocs()
		for b.Loop() {
			s, _ := lim.Acquire(ctx, lane)
			s.Release()
		}
	})
	b.Run("uncontended/llmlanes-budget", func(b *testing.B) {
		// A tokens_per_minute budget that never runs out, and every call
		// estimated at 1,000 tokens and settled at 800: the budget's
		// decision, charge and settlement on every call.
		cfg := limiter.Config{MaxInflight: 6, TokensPerMinute: 1 << 62}
		lim, err := limiter.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx := limiter.WithTokens(ctx, 1000)
		b.ReportAllocs()
		for b.Loop() {
			s, _ := lim.Acquire(ctx, lane)
			s.Settle(limiter.Usage{Prompt: 700, Completion: 100})
			s.Release()
		}
	})
	b.Run("uncontended/semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(6)
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Acquire(ctx, 1)
			s.Release(1)
		}
	})
	b.Run("uncontended/channel", func(b *testing.B) {
		c := make(chanSem, 6)
		b.ReportAllocs()
		for b.Loop() {
			_ = c.acquire(ctx)
			c.release()
		}
	})

	// parallel runs body on goroutines goroutines at once, each with its
	// own class (interactive, default, bulk in turn).
	parallel := func(b *testing.B, goroutines int, body func(ctx context.Context, pb *testing.PB)) {
		var mu sync.Mutex
		class := 0
		b.ReportAllocs()
		b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			mu.Lock()
			p := limiter.Priority(class%3 - 1)
			class++
			mu.Unlock()
			body(limiter.WithPriority(context.Background(), p), pb)
		})
	}
	run := func(b *testing.B, goroutines, limit int, impl string) {
		switch impl {
		case "llmlanes":
			lim := newLim(b, limit)
			parallel(b, goroutines, func(ctx context.Context, pb *testing.PB) {
				for pb.Next() {
					s, err := lim.Acquire(ctx, lane)
					if err != nil {
						b.Error(err)
						return
					}
					s.Release()
				}
			})
		case "semaphore":
			s := semaphore.NewWeighted(int64(limit))
			parallel(b, goroutines, func(ctx context.Context, pb *testing.PB) {
				for pb.Next() {
					if err := s.Acquire(ctx, 1); err != nil {
						b.Error(err)
						return
					}
					s.Release(1)
				}
			})
		case "channel":
			c := make(chanSem, limit)
			parallel(b, goroutines, func(ctx context.Context, pb *testing.PB) {
				for pb.Next() {
					if err := c.acquire(ctx); err != nil {
						b.Error(err)
						return
					}
					c.release()
				}
			})
		}
	}
	for _, impl := range []string{"llmlanes", "semaphore", "channel"} {
		b.Run("parallel/"+impl, func(b *testing.B) { run(b, runtime.GOMAXPROCS(0), 1000, impl) })
	}
	for _, n := range []int{1000, 100000} {
		for _, impl := range []string{"llmlanes", "semaphore", "channel"} {
			b.Run(fmt.Sprintf("waiters-%d/%s", n, impl), func(b *testing.B) { run(b, n, 1, impl) })
		}
	}
}
