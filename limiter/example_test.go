package limiter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/limitertest"
)

func ExampleLimiter_Acquire() {
	cfg := limiter.DefaultConfig()
	cfg.MaxInflight = 6 // per lane, in this process
	lim, err := limiter.New(cfg)
	if err != nil {
		panic(err)
	}
	ctx := limiter.WithPriority(context.Background(), limiter.Interactive)
	slot, err := lim.Acquire(ctx, "https://gw/v1|protolabs/smart")
	if errors.Is(err, limiter.ErrQueueTimeout) {
		fmt.Println("the lane is saturated:", err)
		return
	}
	if err != nil {
		return // the context ended
	}
	defer slot.Release() // when the call's response (or stream) is over
	fmt.Println("calling the model in lane", slot.Lane())
	// Output: calling the model in lane https://gw/v1|protolabs/smart
}

func ExampleParsePriority() {
	p, err := limiter.ParsePriority("bulk")
	fmt.Println(p, err)
	_, err = limiter.ParsePriority("urgent")
	fmt.Println(err, errors.Is(err, limiter.ErrUnknownPriority))
	// Output:
	// bulk <nil>
	// limiter: unknown priority "urgent": want one of interactive, default, bulk true
}

func ExampleWithArrival() {
	lim, _ := limiter.New(limiter.Config{MaxInflight: 2})
	// The logical call arrives once; each attempt (a reconnect after a
	// dropped stream, say) acquires again under the same arrival, so it
	// keeps its place in line and its age instead of starting over.
	ctx := limiter.WithArrival(context.Background(), time.Now())
	for attempt := 1; attempt <= 3; attempt++ {
		slot, err := lim.Acquire(ctx, "https://gw/v1|protolabs/smart")
		if err != nil {
			return
		}
		dropped := attempt < 3 // pretend the first two streams drop
		slot.Release()         // release before backing off, not after
		if !dropped {
			fmt.Println("done after", attempt, "attempts")
			break
		}
	}
	// Output: done after 3 attempts
}

// A lane with one slot on a fake clock: a bulk call queues behind the
// holder, and after 75 s the snapshot shows a saturated lane.
func ExampleLimiter_Snapshot() {
	clock := limitertest.NewClock(time.Date(2026, 9, 28, 9, 0, 0, 0, time.UTC))
	queued := make(chan struct{})
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1}, limiter.WithClock(clock),
		limiter.WithObserver(func(_ context.Context, e limiter.Event) {
			if e.Kind == limiter.Enqueued {
				close(queued)
			}
		}))
	const lane = "https://gw/v1|protolabs/smart"

	held, _ := lim.Acquire(context.Background(), lane)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := lim.Acquire(limiter.WithPriority(context.Background(), limiter.Bulk), lane)
		if err == nil {
			s.Release()
		}
	}()
	<-queued
	clock.Advance(75 * time.Second)
	b, _ := json.MarshalIndent(lim.Snapshot().Lanes[0], "", "  ")
	fmt.Println(string(b))
	held.Release()
	<-done
	// Output:
	// {
	//   "lane": "https://gw/v1|protolabs/smart",
	//   "limit": 1,
	//   "reserve": 0,
	//   "inflight": 1,
	//   "queued": 1,
	//   "queued_by_priority": {
	//     "interactive": 0,
	//     "default": 0,
	//     "bulk": 1
	//   },
	//   "oldest_wait_s": 75.0,
	//   "wait_p50_s_5m": 0.0,
	//   "wait_p90_s_5m": 0.0,
	//   "queue_timeouts_5m": 0,
	//   "saturated": true,
	//   "eta_s": {
	//     "interactive": null,
	//     "default": null,
	//     "bulk": null
	//   }
	// }
}

func ExampleWithTenant() {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	enqueued := make(chan struct{}, 8)
	lim, _ := limiter.New(limiter.Config{MaxInflight: 1}, limiter.WithClock(clock),
		limiter.WithObserver(func(_ context.Context, e limiter.Event) {
			if e.Kind == limiter.Enqueued {
				enqueued <- struct{}{}
			}
		}))
	lane := "https://gw/v1|protolabs/smart"
	boardA := limiter.WithTenant(context.Background(), "board-a")
	boardB := limiter.WithTenant(context.Background(), "board-b")
	held, _ := lim.Acquire(boardA, lane)
	type grant struct {
		call string
		slot limiter.Slot
	}
	granted := make(chan grant, 4)
	queue := func(ctx context.Context, call string) {
		go func() {
			if s, err := lim.Acquire(ctx, lane); err == nil {
				granted <- grant{call, s}
			}
		}()
		<-enqueued
	}
	// Board A has the slot and queues three more calls; then board B
	// queues one. B's goes first: A has had all the slot-time so far.
	queue(boardA, "a1")
	queue(boardA, "a2")
	queue(boardA, "a3")
	queue(boardB, "b1")
	clock.Advance(time.Second)
	held.Release()
	for range 4 {
		g := <-granted
		fmt.Print(g.call, " ")
		clock.Advance(time.Second) // each call holds its slot a second
		g.slot.Release()
	}
	fmt.Println()
	// Output: b1 a1 a2 a3
}

// A lane with a budget of 1,200 tokens a minute: a call estimated at 1,000
// takes most of it, and the next call of 500 waits; when the first ends
// having used 300, the 700 it did not use come back at once, and the
// waiting call is granted.
func ExampleWithTokens() {
	clock := limitertest.NewClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	lim, _ := limiter.New(limiter.Config{MaxInflight: 4, TokensPerMinute: 1200}, limiter.WithClock(clock))
	lane := "https://gw/v1|protolabs/smart"
	remaining := func() int64 { return *lim.Snapshot().Lanes[0].Tokens.Remaining }

	first, _ := lim.Acquire(limiter.WithTokens(context.Background(), 1000), lane)
	fmt.Println("remaining after the first grant:", remaining())

	granted := make(chan limiter.Slot)
	go func() {
		s, _ := lim.Acquire(limiter.WithTokens(context.Background(), 500), lane)
		granted <- s
	}()
	for lim.Snapshot().Lanes[0].Queued == 0 {
		time.Sleep(time.Millisecond) // until the second call waits
	}
	fmt.Println("the second call waits for:", lim.Snapshot().Lanes[0].Tokens.WaitingFor["default"])

	first.Settle(limiter.Usage{Prompt: 200, Completion: 100})
	second := <-granted
	fmt.Println("remaining once both are charged:", remaining())
	first.Release()
	second.Release()
	// Output:
	// remaining after the first grant: 200
	// the second call waits for: tokens
	// remaining once both are charged: 400
}
