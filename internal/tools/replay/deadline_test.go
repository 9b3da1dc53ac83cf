package replay

import (
	"bytes"
	"context"
	"testing"
)

// The deadline replay (real HTTP, at a tenth of real time): with the
// timeout stated, no SDK retry is caused by waiting, no attempt times out
// while queued, and every call is either served or answered with the
// typed 503; with it unstated, callers do time out in the queue. The
// scale keeps the deadline's margin (500 ms simulated, 50 ms here) above
// the scheduling lag of a loaded machine under the race detector: at a
// fiftieth (10 ms) the clients' timers fired first there.
func TestDeadlineReplay(t *testing.T) {
	runs, est, err := RunDeadlines(context.Background(), 0.1)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	deadlineTable(&b, runs, est)
	t.Log("\n" + b.String())
	unstated, stated := runs[1], runs[2]
	if unstated.TimeoutsQueued == 0 {
		t.Fatalf("%s: no attempt timed out while queued: the load is too light to show anything", unstated.Name)
	}
	if stated.RetriesAfterWait != 0 || stated.TimeoutsQueued != 0 {
		t.Fatalf("%s: %d retries caused by waiting, %d attempts timed out while queued; want 0 and 0", stated.Name, stated.RetriesAfterWait, stated.TimeoutsQueued)
	}
	if stated.LocalQueueAt < 0 {
		t.Fatalf("%s: the classification never said local_queue", stated.Name)
	}
	if est.Samples == 0 {
		t.Fatal("no estimate measured")
	}
}
