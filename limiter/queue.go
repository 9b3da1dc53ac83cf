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
	t        *tenant   // whose call it is
	cost     int64     // its estimate, in tokens (see WithTokens), as calibrateLocked raised it
	base     int64     // its estimate as its caller gave it
	open     bool      // its call names no output bound (WithOpenOutput)
	arrival  time.Time // logical arrival: drives aging
	at       int64     // the same, in ns since the limiter's origin: orders the class
	enqueued time.Time // when this acquisition started waiting
	deadline time.Time // when its wait ends: enqueued plus its maxWait
	cause    TimeoutCause
	seq      uint64 // breaks ties between equal arrivals, first come first
	place    int    // place in line when it queued, for events
	state    waiterState
	waited   time.Duration
	err      error
	hold     *hold  // the slot, once granted
	gen      uint64 // hold's generation at the grant
	// ready receives one value when state leaves waiting. It is buffered
	// rather than closed so that the waiter can be used again.
	ready chan struct{}

	index      int     // in its tenant's FIFO of its class
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

// steps returns how many aging steps a call that arrived at at (ns since
// the origin) has aged at now (the same), capped at 2.
func steps(at, now int64) int {
	return int(max(0, min((now-at)/int64(agingStep), 2)))
}

// rank returns the waiter's effective class at now: its own class raised one
// step per agingStep waited since its logical arrival, capped at Interactive.
func (w *waiter) rank(now int64) Priority {
	return max(Interactive, w.prio-Priority(steps(w.at, now)))
}

// classFirst reports whether the class of waiter a, its class's oldest
// (see queue), is served before that of b at now: by effective class, then
// by logical arrival, then by enqueue order (the ADR's rule).
func classFirst(a, b *waiter, now int64) bool {
	if ra, rb := a.rank(now), b.rank(now); ra != rb {
		return ra < rb
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// tenantFirst reports whether a, waiting in the same class as b, is served
// before it: by its tenant's service, then by logical arrival (FIFO within
// a tenant), then by enqueue order.
func tenantFirst(a, b *waiter) bool {
	if a.t.vs != b.t.vs {
		return a.t.vs < b.t.vs
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// classQueue holds waiters of one class, earliest arrival first.
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

// queue is a lane's waiting calls, served in three steps (docs/DESIGN.md,
// "Tenants and fair shares"):
//
//  1. Which class: each own class with waiters is represented by its oldest
//     waiter (logical arrival, then enqueue order); the class whose oldest
//     has the highest effective class (its own, raised a step per
//     agingStep waited) goes first, then the earlier arrival. This is the
//     ADR's rule between classes: aging lifts a class, never one tenant's
//     calls over another's.
//  2. Whose call within that class: the tenant with the least weighted
//     service, whatever its calls' ages.
//  3. Which call of that tenant: FIFO by logical arrival.
//
// Each tenant keeps one FIFO per own class (a heap by arrival, since a
// retry may carry an earlier arrival), and each class keeps two heaps of
// its tenants' FIFOs: by the tenant's service (step 2) and by the FIFO's
// head's arrival (the class's oldest waiter is the top's head: step 1). A
// grant reads three tops and the chosen class's fair top: O(log n) in the
// waiters and O(log t) in the class's tenants. Aging needs no bookkeeping:
// a class's effective class is read from its oldest waiter's arrival.
//
// A tenant at its cap (Fairness.MaxInflightPerTenant) is parked: its FIFOs
// leave the heaps until one of its slots is released, so the tops are
// always calls that may be granted, and a class whose waiters are all
// parked is not represented.
type queue struct {
	fair    [3]heads // per class: its tenants' FIFOs, by service, then head arrival
	old     [3]heads // per class: the same FIFOs, by head arrival
	byClass [3]int
	oldest  *waiter // enqueue-order list
	new     *waiter
	n       int
	seq     uint64 // the next waiter's place in enqueue order
}

// fifo is one tenant's waiters of one own class.
type fifo struct {
	classQueue
	t      *tenant
	class  int8 // class index
	placed bool // in its class's heaps
	fi, ai int  // index in queue.fair[class], queue.old[class]
}

// heads is a heap of FIFOs, by their tenant's service and their head's
// arrival (step 2), or by their head's arrival alone (byArrival: step 1).
type heads struct {
	s         []*fifo
	byArrival bool
}

func (h *heads) less(i, j int) bool {
	a, b := h.s[i], h.s[j]
	if !h.byArrival && a.t.vs != b.t.vs {
		return a.t.vs < b.t.vs
	}
	ea, eb := a.classQueue[0], b.classQueue[0]
	return ea.at < eb.at || (ea.at == eb.at && ea.seq < eb.seq)
}

func (h *heads) setIndex(i int) {
	if h.byArrival {
		h.s[i].ai = i
	} else {
		h.s[i].fi = i
	}
}

func (h *heads) swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	h.setIndex(i)
	h.setIndex(j)
}

func (h *heads) push(f *fifo) {
	h.s = append(h.s, f)
	h.setIndex(len(h.s) - 1)
	h.up(len(h.s) - 1)
}

func (h *heads) remove(i int) {
	last := len(h.s) - 1
	if i != last {
		h.swap(i, last)
	}
	h.s[last] = nil
	h.s = h.s[:last]
	if i != last {
		h.fix(i)
	}
}

// fix restores the heap after the key of the entry at i changed.
func (h *heads) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *heads) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		j = i
	}
}

func (h *heads) down(i0 int) bool {
	i, n := i0, len(h.s)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && h.less(r, j) {
			j = r
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

func (h *heads) top() *fifo {
	if len(h.s) == 0 {
		return nil
	}
	return h.s[0]
}

// place puts f among its class's heads, unless it is empty or its tenant
// is parked.
func (q *queue) place(f *fifo) {
	if len(f.classQueue) == 0 || f.t.parked {
		f.placed = false
		return
	}
	f.placed = true
	q.fair[f.class].push(f)
	q.old[f.class].push(f)
}

// unplace takes f out of its class's heads.
func (q *queue) unplace(f *fifo) {
	if !f.placed {
		return
	}
	q.fair[f.class].remove(f.fi)
	q.old[f.class].remove(f.ai)
	f.placed = false
}

// serviceChanged restores the heaps after t's service changed.
func (q *queue) serviceChanged(t *tenant) {
	for i := range t.q {
		if f := &t.q[i]; f.placed {
			q.fair[f.class].fix(f.fi)
		}
	}
}

// park takes t's FIFOs out of the heaps; unpark puts them back.
func (q *queue) park(t *tenant) {
	t.parked = true
	for i := range t.q {
		q.unplace(&t.q[i])
	}
}

func (q *queue) unpark(t *tenant) {
	t.parked = false
	for i := range t.q {
		q.place(&t.q[i])
	}
}

func newQueue() queue {
	var q queue
	for c := range q.old {
		q.old[c].byArrival = true
	}
	return q
}

func (q *queue) push(w *waiter) {
	f := &w.t.q[w.prio.Index()]
	old := f.head()
	f.classQueue.push(w)
	if f.head() != old {
		q.unplace(f)
		q.place(f)
	}
	w.t.queued++
	q.byClass[w.prio.Index()]++
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
	f := &w.t.q[w.prio.Index()]
	head := f.head() == w
	if head {
		q.unplace(f)
	}
	f.classQueue.remove(w.index)
	if head {
		q.place(f)
	}
	w.t.queued--
	q.byClass[w.prio.Index()]--
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

// best returns the waiter served first at now, or nil: the class whose
// oldest waiter comes first (step 1), then the first of that class's
// tenants by service (step 2), then that tenant's earliest (step 3).
func (q *queue) best(now int64) *waiter {
	c := -1
	var rep *waiter
	for i := range q.old {
		if f := q.old[i].top(); f != nil && (rep == nil || classFirst(f.head(), rep, now)) {
			c, rep = i, f.head()
		}
	}
	if rep == nil {
		return nil
	}
	return q.fair[c].top().head()
}

// interactive returns the first interactive waiter in serving order: the
// only kind that may take a reserved slot.
func (q *queue) interactive() *waiter {
	if f := q.fair[0].top(); f != nil {
		return f.head()
	}
	return nil
}

// settledIn returns the settled service (less what its calls in flight
// were charged ahead) of the tenant served next in class index c, and
// whether one waits there. Only the top is read, so that it costs O(1).
func (q *queue) settledIn(c int) (float64, bool) {
	if f := q.fair[c].top(); f != nil {
		return f.t.vs - f.t.pending, true
	}
	return 0, false
}

// repAll returns the oldest waiter of class index c, parked or not. It
// scans the class's tenants' FIFOs through the enqueue-order list, so it
// is for readings only.
func (q *queue) repAll(c int) *waiter {
	var r *waiter
	for o := q.oldest; o != nil; o = o.next {
		if o.prio.Index() == c && (r == nil || o.at < r.at || (o.at == r.at && o.seq < r.seq)) {
			r = o
		}
	}
	return r
}

// position returns w's 1-based place in the serving order at now (see
// before). It scans every waiter, so it is used only when a wait ends in a
// timeout.
func (q *queue) position(w *waiter, now int64) int {
	var reps [3]*waiter
	for c := range reps {
		reps[c] = q.repAll(c)
	}
	p := 1
	for o := q.oldest; o != nil; o = o.next {
		if o == w {
			continue
		}
		co, cw := o.prio.Index(), w.prio.Index()
		if co == cw && tenantFirst(o, w) || co != cw && classFirst(reps[co], reps[cw], now) {
			p++
		}
	}
	return p
}

// aheadOf counts, for a newcomer of each class (by index) arriving at now,
// the waiters served before it: those whose effective class at now is the
// same or higher. It scans every waiter.
func (q *queue) aheadOf(now int64) [3]int {
	var by [3]int
	for o := q.oldest; o != nil; o = o.next {
		by[o.rank(now).Index()]++
	}
	return [3]int{by[0], by[0] + by[1], by[0] + by[1] + by[2]}
}

// placeOf returns the place in line of a waiter of class p that has just
// been pushed, aging not counted: the waiters of class p or a higher class.
func (q *queue) placeOf(p Priority) int {
	n := 0
	for i := 0; i <= p.Index(); i++ {
		n += q.byClass[i]
	}
	return n
}
