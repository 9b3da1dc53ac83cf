package limiter

import "time"

type waiterState uint8

const (
	waiting waiterState = iota
	granted
	canceled
	timedOut
	refused // the limiter is shutting down
)

// waiter is one call waiting in a lane. Its fields other than ready are
// guarded by the lane's lock until its wait ends (end); after that the
// waiting goroutine owns them. Waiters are reused (Limiter.waiters): a
// contended hand-over then allocates nothing, which is most of what it
// costs beside the scheduler.
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
	hold     *hold  // the slot, once granted
	gen      uint64 // hold's generation at the grant
	// ready receives one value when state leaves waiting. It is buffered
	// rather than closed so that the waiter can be used again.
	ready chan struct{}

	index      int     // in its class heap
	prev, next *waiter // in the lane's enqueue-order list
}

func newWaiter() any { return &waiter{ready: make(chan struct{}, 1)} }

// putWaiter returns w, whose wait has ended and whose value has been taken
// from ready, for reuse.
func (l *Limiter) putWaiter(w *waiter) {
	if len(w.ready) != 0 {
		// A value left behind would wake the next call to wait on w at
		// once, without a slot.
		panic("limiter: a waiter reused with its wake-up not taken")
	}
	*w = waiter{ready: w.ready}
	l.waiters.Put(w)
}

// end marks the end of w's wait, in state s, and wakes its goroutine. The
// lane's lock is held.
func (w *waiter) end(s waiterState) {
	w.state = s
	w.ready <- struct{}{} // never blocks: one value per wait, buffer of one
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
// pointer per comparison, which with deep queues is most of a grant's cost
// (BenchmarkGrant).
type classQueue []qentry

type qentry struct {
	at  int64  // logical arrival, in ns since the limiter's origin
	seq uint64 // enqueue order, to break ties
	w   *waiter
}

// The heap is written out here rather than used through container/heap,
// whose calls through an interface for every comparison and swap showed
// in a contended hand-over's profile.

func (q classQueue) less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}

func (q classQueue) swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].w.index, q[j].w.index = i, j
}

func (q *classQueue) push(w *waiter) {
	w.index = len(*q)
	*q = append(*q, qentry{at: w.at, seq: w.seq, w: w})
	q.up(w.index)
}

// remove takes out the entry at i.
func (q *classQueue) remove(i int) {
	last := len(*q) - 1
	if i != last {
		q.swap(i, last)
	}
	(*q)[last] = qentry{}
	*q = (*q)[:last]
	if i != last && !q.down(i) {
		q.up(i)
	}
}

func (q classQueue) up(j int) {
	for j > 0 {
		i := (j - 1) / 2 // parent
		if !q.less(j, i) {
			return
		}
		q.swap(i, j)
		j = i
	}
}

// down moves the entry at i0 down to its place and reports whether it moved.
func (q classQueue) down(i0 int) bool {
	i, n := i0, len(q)
	for {
		j := 2*i + 1 // left child
		if j >= n {
			break
		}
		if r := j + 1; r < n && q.less(r, j) {
			j = r
		}
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		i = j
	}
	return i > i0
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
	q.classes[w.prio.Index()].push(w)
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
	q.classes[w.prio.Index()].remove(w.index)
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
