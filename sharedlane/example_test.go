package sharedlane_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/limiter/lanehttp"
	"github.com/llmlanes/llmlanes/sharedlane"
)

// Every process that runs this with the same Redis and key prefix shares
// one lane of 6 per (endpoint, model).
func ExampleNew() {
	b, err := sharedlane.New(sharedlane.Config{URL: "redis://127.0.0.1:6379/0", OnRedisDown: sharedlane.OnDownLocal, LocalMaxInflight: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	lim, err := limiter.New(limiter.Config{MaxInflight: 6, QueueTimeout: 5 * time.Minute, InteractiveReserve: 1}, limiter.WithBackend(b))
	if err != nil {
		log.Fatal(err)
	}
	// The transport stops a call whose shared slot is lost (lanehttp.ErrSlotLost).
	client := &http.Client{Transport: &lanehttp.Transport{Limiter: lim}}
	_ = client
	ctx := limiter.WithPriority(context.Background(), limiter.Interactive)
	_ = ctx
}
