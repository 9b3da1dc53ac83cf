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

// before reports whether a is served before b at now: by effective class,
// then by its tenant's service, then by logical arrival, then by enqueue
// order.
func before(a, b *waiter, now int64) bool {
	if ra, rb := a.rank(now), b.rank(now); ra != rb {
		return ra < rb
	}
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

// queue is a lane's waiting calls, in serving order: effective class, then
// the tenant that has received the least weighted service, then logical
// arrival (FIFO within a tenant), then enqueue order.
//
// Each tenant keeps one FIFO per own class (a heap by arrival, since a
// retry may carry an earlier arrival). Within one FIFO the earliest arrival
// has also aged the most, so its head is the FIFO's only candidate for the
// next grant. A head's effective class is its own class less the aging
// steps it has waited, its tier (0 up to the class's index: a Bulk head has
// three, an Interactive one a single tier), so the heads are kept in six
// heaps, one per (class, tier), each ordered by the tenant's service and
// then by arrival: the six tops are the only candidates, and a grant is
// O(log n) in the waiters and the tenants. A head moves up a tier once it
// has waited another agingStep; three more heaps, by arrival, of the heads
// that can still move up, find those at once.
//
// A tenant at its cap (Fairness.MaxInflightPerTenant) is parked: its heads
// leave the heaps until one of its slots is released, so the tops are
// always calls that may be granted.
type queue struct {
	fair    [slots]heads // by service, then arrival
	aging   [slots]heads // by arrival; only the tiers below the class's top
	byClass [3]int
	oldest  *waiter // enqueue-order list
	new     *waiter
	n       int
}

// slots is the number of (class, tier) pairs: 1 + 2 + 3.
const slots = 6

// slotOf returns the heap index of class index c at tier t.
func slotOf(c, t int) int { return c*(c+1)/2 + t }

// classOf and tierOf return a slot's class index and tier; effOf its
// effective class index, the class less the tier.
func classOf(s int) int {
	switch {
	case s == 0:
		return 0
	case s <= 2:
		return 1
	}
	return 2
}

func tierOf(s int) int { c := classOf(s); return s - slotOf(c, 0) }

func effOf(s int) int { return classOf(s) - tierOf(s) }

// fifo is one tenant's waiters of one own class.
type fifo struct {
	classQueue
	t      *tenant
	class  int8 // class index
	slot   int8 // in queue.fair (and aging), or -1 while not among the heads
	fi, ai int  // index in queue.fair[slot], queue.aging[slot]
}

func (f *fifo) at() int64 { return f.classQueue[0].at }

// heads is a heap of FIFOs, by their tenant's service and their head's
// arrival, or by their head's arrival alone (byArrival).
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

// place puts f's head among the heads, at its tier at now, unless f is
// empty or its tenant is parked.
func (q *queue) place(f *fifo, now int64) {
	if len(f.classQueue) == 0 || f.t.parked {
		f.slot = -1
		return
	}
	c := int(f.class)
	t := min(steps(f.at(), now), c)
	s := slotOf(c, t)
	f.slot = int8(s)
	q.fair[s].push(f)
	if t < c {
		q.aging[s].push(f)
	}
}

// unplace takes f's head out of the heads.
func (q *queue) unplace(f *fifo) {
	if f.slot < 0 {
		return
	}
	s := int(f.slot)
	q.fair[s].remove(f.fi)
	if tierOf(s) < classOf(s) {
		q.aging[s].remove(f.ai)
	}
	f.slot = -1
}

// serviceChanged restores the heaps after t's service changed.
func (q *queue) serviceChanged(t *tenant) {
	for i := range t.q {
		if f := &t.q[i]; f.slot >= 0 {
			q.fair[f.slot].fix(f.fi)
		}
	}
}

// park takes t's heads out of the heaps; unpark puts them back.
func (q *queue) park(t *tenant) {
	t.parked = true
	for i := range t.q {
		q.unplace(&t.q[i])
	}
}

func (q *queue) unpark(t *tenant, now int64) {
	t.parked = false
	for i := range t.q {
		q.place(&t.q[i], now)
	}
}

func newQueue() queue {
	var q queue
	for s := range q.aging {
		q.aging[s].byArrival = true
	}
	return q
}

func (q *queue) push(w *waiter, now int64) {
	f := &w.t.q[w.prio.Index()]
	old := f.head()
	f.classQueue.push(w)
	if f.head() != old {
		q.unplace(f)
		q.place(f, now)
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

func (q *queue) remove(w *waiter, now int64) {
	f := &w.t.q[w.prio.Index()]
	head := f.head() == w
	if head {
		q.unplace(f)
	}
	f.classQueue.remove(w.index)
	if head {
		q.place(f, now)
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

// promote moves up a tier every head that has waited another agingStep
// by now.
func (q *queue) promote(now int64) {
	for s := range q.aging {
		for f := q.aging[s].top(); f != nil && steps(f.at(), now) > tierOf(s); f = q.aging[s].top() {
			q.unplace(f)
			q.place(f, now)
		}
	}
}

// best returns the waiter served first at now, or nil.
func (q *queue) best(now int64) *waiter {
	q.promote(now)
	var b *fifo
	bs := 0
	for s := range q.fair {
		f := q.fair[s].top()
		if f == nil {
			continue
		}
		if b == nil || effOf(s) < effOf(bs) || (effOf(s) == effOf(bs) && headBefore(f, b)) {
			b, bs = f, s
		}
	}
	if b == nil {
		return nil
	}
	return b.head()
}

// peekBest returns the waiter served first at now, as best does, but
// changing nothing: it scans every waiter, for readings.
func (q *queue) peekBest(now int64) *waiter {
	var b *waiter
	for o := q.oldest; o != nil; o = o.next {
		if b == nil || before(o, b, now) {
			b = o
		}
	}
	return b
}

// headBefore orders two heads of one effective class.
func headBefore(a, b *fifo) bool {
	if a.t.vs != b.t.vs {
		return a.t.vs < b.t.vs
	}
	ea, eb := a.classQueue[0], b.classQueue[0]
	return ea.at < eb.at || (ea.at == eb.at && ea.seq < eb.seq)
}

// interactive returns the first interactive waiter in serving order: the
// only kind that may take a reserved slot.
func (q *queue) interactive() *waiter {
	if f := q.fair[0].top(); f != nil {
		return f.head()
	}
	return nil
}

// minSettled returns the least settled service (less what its calls in
// flight were charged ahead) of the tenants first in line in each of the
// six heaps, and whether there is one. Only the tops are read, so that it
// costs O(1): they are the tenants served next in each class and tier.
func (q *queue) minSettled() (float64, bool) {
	var m float64
	ok := false
	for s := range q.fair {
		if f := q.fair[s].top(); f != nil && (!ok || f.t.vs-f.t.pending < m) {
			m, ok = f.t.vs-f.t.pending, true
		}
	}
	return m, ok
}

// position returns w's 1-based place in the serving order at now. It scans
// every waiter, so it is used only when a wait ends in a timeout.
func (q *queue) position(w *waiter, now int64) int {
	p := 1
	for o := q.oldest; o != nil; o = o.next {
		if o != w && before(o, w, now) {
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
