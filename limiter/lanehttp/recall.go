package lanehttp

import (
	"container/list"
	"hash/maphash"
	"net/http"
	"sync"
	"time"
)

// DefaultRetryWindow is how long after an attempt of a model call ended a
// new attempt of the same call is taken for its retry, when
// Transport.RetryWindow is 0.
const DefaultRetryWindow = 2 * time.Minute

// maxCallAge bounds the logical arrival a retry may keep: a chain of
// attempts older than this starts over, so no entry keeps a place forever.
// The ADR's worst case for one call (3 SDK attempts of 120 s, each
// reconnected 3 times, plus queue waits) stays well inside it.
const maxCallAge = 30 * time.Minute

// maxRecalled bounds the calls remembered at once (about 100 bytes each).
const maxRecalled = 10000

// recall remembers the logical arrival of recent model calls, so that a
// retry queues with the arrival of its call's first attempt and ages from
// there (ADR-0115 D5), with no code in the caller.
//
// A call is recognised by a fingerprint of its lane, its credentials
// (Authorization, X-Api-Key and Api-Key headers), its Idempotency-Key if it
// has one, and its body: an SDK's retry resends exactly these. An attempt
// whose fingerprint matches a call whose last attempt ended within the
// retry window, and which has no attempt in progress, is that call's retry.
// Everything comes from this process's own memory: a header such as
// X-Stainless-Retry-Count never moves a call up (a forged one for a call
// never seen gains nothing), and identical requests sent side by side are
// separate calls, each arriving when it arrives. A call that succeeds is
// forgotten. Fingerprints are hashed with a per-process random seed;
// credentials and bodies are never kept.
type recall struct {
	window time.Duration
	seed   maphash.Seed

	// mu guards calls and idle. A call with an attempt in progress is in
	// calls only; one between attempts is also in idle, most recently ended
	// first, so that expiry and eviction take from the back in O(1).
	mu    sync.Mutex
	calls map[uint64]*recalled
	idle  list.List // of *recalled
}

type recalled struct {
	key     uint64
	arrival time.Time     // of the first attempt
	ended   time.Time     // when the last attempt ended
	active  int           // attempts in progress
	idle    *list.Element // in recall.idle while active is 0
}

func newRecall(window time.Duration) *recall {
	r := &recall{window: window, seed: maphash.MakeSeed(), calls: map[uint64]*recalled{}}
	r.idle.Init()
	return r
}

// credentialHeaders are the request headers that identify a caller; an
// attempt of one caller never continues another's call.
var credentialHeaders = [...]string{"Authorization", "X-Api-Key", "Api-Key", "Idempotency-Key"}

// fingerprint identifies a model call for recall.
func (r *recall) fingerprint(req *http.Request, lane string, body []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(r.seed)
	h.WriteString(lane)
	for _, name := range credentialHeaders {
		for _, v := range req.Header.Values(name) {
			h.WriteByte(0)
			h.WriteString(v)
		}
		h.WriteByte(1)
	}
	h.Write(body)
	return h.Sum64()
}

// attempt is one attempt of a call; its end must be reported.
type attempt struct {
	r       *recall
	key     uint64
	arrival time.Time
	retry   bool // it continues a call seen before
	tracked bool // the call is remembered (false for a side-by-side duplicate)
}

// begin starts an attempt of the call with fingerprint key at now.
func (r *recall) begin(key uint64, now time.Time) attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked(now)
	if c, ok := r.calls[key]; ok {
		if c.active > 0 {
			// The same request in progress: a duplicate sent side by side,
			// not a retry. It is a call of its own, not remembered.
			return attempt{r: r, key: key, arrival: now}
		}
		r.idle.Remove(c.idle)
		c.idle = nil
		if now.Sub(c.arrival) <= maxCallAge {
			c.active++
			return attempt{r: r, key: key, arrival: c.arrival, retry: true, tracked: true}
		}
		delete(r.calls, key)
	}
	if len(r.calls) >= maxRecalled && !r.evictLocked() {
		return attempt{r: r, key: key, arrival: now} // all in progress: remember nothing more
	}
	r.calls[key] = &recalled{key: key, arrival: now, active: 1}
	return attempt{r: r, key: key, arrival: now, tracked: true}
}

// end reports that the attempt ended at now; done means the call is over
// (it succeeded), so no retry can follow.
func (a attempt) end(now time.Time, done bool) {
	if !a.tracked {
		return
	}
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.calls[a.key]
	if !ok || c.active == 0 {
		return
	}
	if c.active--; c.active > 0 {
		return
	}
	if done {
		delete(r.calls, a.key)
		return
	}
	c.ended = now
	c.idle = r.idle.PushFront(c)
}

// expireLocked forgets the calls whose last attempt ended longer than the
// window ago; they sit at the back of idle.
func (r *recall) expireLocked(now time.Time) {
	for e := r.idle.Back(); e != nil; e = r.idle.Back() {
		c := e.Value.(*recalled)
		if now.Sub(c.ended) <= r.window {
			return
		}
		r.idle.Remove(e)
		delete(r.calls, c.key)
	}
}

// evictLocked forgets the call that has been idle longest, to make room;
// false if every call has an attempt in progress.
func (r *recall) evictLocked() bool {
	e := r.idle.Back()
	if e == nil {
		return false
	}
	c := e.Value.(*recalled)
	r.idle.Remove(e)
	delete(r.calls, c.key)
	return true
}

// len returns how many calls are remembered.
func (r *recall) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}
