package limiter

import (
	"container/heap"
	"time"
)

type waiterState uint8

const (
	waiting waiterState = iota
	granted
	canceled
	timedOut
	refused // the limiter is shutting down
)

// waiter is one call waiting in a lane. Its fields other than ready are
// guarded by the lane's lock until ready is closed; after that the waiting
// goroutine owns them.
type waiter struct {
	prio     Priority  // own class
	arrival  time.Time // logical arrival: drives aging
	at       int64     // the same, in ns since the limiter's origin: orders the class
	enqueued time.Time // when this acquisition started waiting
	deadline time.Time // enqueued plus the queue timeout in force then
	seq      uint64    // breaks ties between equal arrivals, first come first
	place    int       // place in line when it queued, for events
	state    waiterState
	waited   time.Duration
	err      error
	hold     *hold         // the slot, once granted
	gen      uint64        // hold's generation at the grant
	ready    chan struct{} // closed when state leaves waiting

	index      int     // in its class heap
	prev, next *waiter // in the lane's enqueue-order list
}

// rank returns the waiter's effective class at now: its own class raised one
// step per agingStep waited since its logical arrival, capped at Interactive.
func (w *waiter) rank(now time.Time) Priority {
	steps := max(0, min(now.Sub(w.arrival)/agingStep, 2))
	return max(Interactive, w.prio-Priority(steps))
}

// before reports whether a is served before b at now: by effective class,
// then by logical arrival, then by enqueue order.
func before(a, b *waiter, now time.Time) bool {
	ra, rb := a.rank(now), b.rank(now)
	if ra != rb {
		return ra < rb
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// classQueue holds the waiters of one class, earliest arrival first. Within
// one class the earliest arrival has also aged the most, so the head of each
// class queue is the only candidate that class has for the next grant:
// choosing among three heads keeps a grant O(log n) despite aging.
//
// The ordering key is kept inline, beside the pointer, so that sifting
// through a deep heap compares contiguous memory instead of chasing a
// pointer per comparison; with 100,000 waiters that halves the cost.
type classQueue []qentry

type qentry struct {
	at  int64  // logical arrival, in ns since the limiter's origin
	seq uint64 // enqueue order, to break ties
	w   *waiter
}

func (q classQueue) Len() int { return len(q) }
func (q classQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q classQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].w.index, q[j].w.index = i, j
}

// Push and Pop take and return *waiter, not qentry, so that container/heap
// boxes a pointer and allocates nothing.
func (q *classQueue) Push(x any) {
	w := x.(*waiter)
	w.index = len(*q)
	*q = append(*q, qentry{at: w.at, seq: w.seq, w: w})
}
func (q *classQueue) Pop() any {
	old := *q
	w := old[len(old)-1].w
	old[len(old)-1] = qentry{}
	*q = old[:len(old)-1]
	return w
}

func (q classQueue) head() *waiter {
	if len(q) == 0 {
		return nil
	}
	return q[0].w
}

// queue is a lane's waiting calls: one heap per class for serving order and
// one list in enqueue order for the oldest wait.
type queue struct {
	classes     [3]classQueue
	oldest, new *waiter // enqueue-order list
	n           int
}

func (q *queue) push(w *waiter) {
	heap.Push(&q.classes[w.prio.Index()], w)
	w.prev = q.new
	if q.new != nil {
		q.new.next = w
	} else {
		q.oldest = w
	}
	q.new = w
	q.n++
}

func (q *queue) remove(w *waiter) {
	heap.Remove(&q.classes[w.prio.Index()], w.index)
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.oldest = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.new = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// best returns the waiter served first at now, or nil.
func (q *queue) best(now time.Time) *waiter {
	var b *waiter
	for i := range q.classes {
		if h := q.classes[i].head(); h != nil && (b == nil || before(h, b, now)) {
			b = h
		}
	}
	return b
}

// position returns w's 1-based place in the serving order at now. It scans
// every waiter, so it is used only when a wait ends in a timeout.
func (q *queue) position(w *waiter, now time.Time) int {
	p := 1
	for i := range q.classes {
		for _, e := range q.classes[i] {
			if o := e.w; o != w && before(o, w, now) {
				p++
			}
		}
	}
	return p
}

// aheadOf counts, for a newcomer of each class (by index) arriving at now,
// the waiters served before it: those whose effective class at now is the
// same or higher. It scans every waiter.
func (q *queue) aheadOf(now time.Time) [3]int {
	var by [3]int
	for i := range q.classes {
		for _, e := range q.classes[i] {
			by[e.w.rank(now).Index()]++
		}
	}
	return [3]int{by[0], by[0] + by[1], by[0] + by[1] + by[2]}
}

// placeOf returns the place in line of a waiter of class p that has just
// been pushed, aging not counted: the waiters of class p or a higher class.
func (q *queue) placeOf(p Priority) int {
	n := 0
	for i := 0; i <= p.Index(); i++ {
		n += len(q.classes[i])
	}
	return n
}
