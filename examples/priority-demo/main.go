// Command priority-demo shows one lane queueing by priority: a review panel
// fans out bulk calls, a coder sends default calls, an operator's chat turn
// arrives last and is served first, and the lane's snapshot is printed while
// the queue is full and once it has drained.
//
//	go run ./examples/priority-demo
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
)

const lane = "https://gw/v1|protolabs/smart"

func main() {
	cfg := limiter.DefaultConfig()
	cfg.MaxInflight = 2 // one slot for anyone, one kept for interactive work
	lim, err := limiter.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	start := time.Now()
	var mu sync.Mutex
	order := 0
	call := func(wg *sync.WaitGroup, name string, p limiter.Priority, work time.Duration) {
		defer wg.Done()
		slot, err := lim.Acquire(limiter.WithPriority(context.Background(), p), lane)
		if err != nil {
			fmt.Println(name, "gave up:", err)
			return
		}
		mu.Lock()
		order++
		fmt.Printf("%5.2fs  #%-2d %-12s (%s) got a slot\n", time.Since(start).Seconds(), order, name, p)
		mu.Unlock()
		time.Sleep(work) // the model call
		slot.Release()
	}

	var wg sync.WaitGroup
	for i := 1; i <= 5; i++ {
		wg.Add(1)
		go call(&wg, fmt.Sprintf("finder-%d", i), limiter.Bulk, 150*time.Millisecond)
		time.Sleep(2 * time.Millisecond) // so that arrival order is the loop's
	}
	time.Sleep(20 * time.Millisecond)
	for i := 1; i <= 2; i++ {
		wg.Add(1)
		go call(&wg, fmt.Sprintf("coder-%d", i), limiter.Default, 150*time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	wg.Add(1)
	go call(&wg, "operator-chat", limiter.Interactive, 100*time.Millisecond)
	time.Sleep(20 * time.Millisecond)

	fmt.Println("\nsnapshot while the panel is queued:")
	printJSON(lim.Snapshot())
	wg.Wait()
	fmt.Println("\nsnapshot after the queue drained:")
	printJSON(lim.Snapshot())
	fmt.Println("\nThe operator's chat arrived last and was served next; coders went before the")
	fmt.Println("remaining finders; one slot stayed reserved for interactive work throughout.")
}

func printJSON(v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Println(string(b))
}
