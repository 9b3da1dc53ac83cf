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
// Transport.RetryWindow is 0: an SDK's backoff (the OpenAI and Anthropic
// SDKs wait at most 8 s between attempts, or a Retry-After they are given),
// not minutes, so that an old attempt is no ticket to a place in line.
const DefaultRetryWindow = 30 * time.Second

// maxCallAge bounds the logical arrival a retry may keep: a chain of
// attempts older than this starts over, so no entry keeps a place forever.
// The ADR's worst case for one call (3 SDK attempts of 120 s, each
// reconnected 3 times, plus queue waits) stays well inside it.
const maxCallAge = 30 * time.Minute

// maxRecalled bounds the calls remembered at once (about 100 bytes each),
// and maxPerCaller those of one caller (one set of credentials, on one
// lane), so that a caller's flood of failing calls cannot push another's
// retries out.
const (
	maxRecalled  = 10000
	maxPerCaller = maxRecalled / 10
)

// recall remembers the logical arrival of recent model calls, so that a
// retry queues with the arrival of its call's first attempt and ages from
// there (docs/DESIGN.md, "Semantics of a lane"), with no code in the caller.
//
// A call is recognised by a fingerprint of its lane, its credentials
// (Authorization, X-Api-Key and Api-Key headers), its Idempotency-Key if it
// has one, its query string (where some gateways take a key) and its body:
// an SDK's retry resends exactly these. Only an attempt that reached the
// gateway and did not succeed makes a later one a retry, and only within
// the retry window after it ended. An attempt whose caller gave up while
// it queued (its client's timeout counts the wait) leaves a place for a
// resend its SDK marks as a retry (X-Stainless-Retry-Count above 0): it
// keeps the time it waited, not the time away, and is not counted as a
// retry. An attempt that timed out in the queue or was refused leaves no
// place. An attempt whose fingerprint matches such a call, with no
// attempt of it in progress, is that call's retry. Everything else comes
// from this process's own memory: a retry header for a call never seen,
// or for one that gave up without waiting, gains nothing, and identical
// requests sent side by side are separate calls, each arriving when it
// arrives. A call that succeeds is forgotten. Fingerprints are
// hashed with a per-process random seed; credentials and bodies are never
// kept.
type recall struct {
	window time.Duration
	seed   maphash.Seed

	// mu guards calls, idle and callers. A call with an attempt in
	// progress is in calls only; one between attempts is also in idle,
	// most recently ended first, so that expiry and eviction take from the
	// back in O(1). callers counts the calls remembered of each caller.
	mu      sync.Mutex
	calls   map[uint64]*recalled
	idle    list.List // of *recalled
	callers map[uint64]int
}

type recalled struct {
	key     uint64
	caller  uint64
	arrival time.Time     // of the first attempt
	ended   time.Time     // when the last attempt ended
	active  int           // attempts in progress
	idle    *list.Element // in recall.idle while active is 0
	// gaveUp: its last attempt's caller gave up while it queued; only an
	// attempt its SDK marks as a retry continues it.
	gaveUp bool
}

// A Recall is a Transport's memory of recent calls (see the package
// documentation, "Retries keep their place"). Transports that share one
// (Transport.Recall) recognise each other's retries; a proxy that makes new
// Transports on a reload keeps its Recall, so that a reload forgets no
// call. It is safe for concurrent use.
type Recall struct{ r *recall }

// NewRecall returns a memory of recent calls in which an attempt that
// ended up to window ago makes an identical one its retry (0 means
// DefaultRetryWindow).
func NewRecall(window time.Duration) *Recall {
	if window <= 0 {
		window = DefaultRetryWindow
	}
	return &Recall{newRecall(window)}
}

func newRecall(window time.Duration) *recall {
	r := &recall{window: window, seed: maphash.MakeSeed(), calls: map[uint64]*recalled{}, callers: map[uint64]int{}}
	r.idle.Init()
	return r
}

// credentialHeaders are the request headers that identify a caller; an
// attempt of one caller never continues another's call.
var credentialHeaders = [...]string{"Authorization", "X-Api-Key", "Api-Key", "Idempotency-Key"}

// fingerprint identifies a model call for recall, and its caller (the
// same without the body).
func (r *recall) fingerprint(req *http.Request, lane string, body []byte) (call, caller uint64) {
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
	h.WriteString(req.URL.RawQuery)
	h.WriteByte(2)
	caller = h.Sum64()
	h.Write(body)
	return h.Sum64(), caller
}

// attempt is one attempt of a call; its end must be reported.
type attempt struct {
	r       *recall
	key     uint64
	arrival time.Time
	retry   bool // it continues a call seen before
	tracked bool // the call is remembered (false for a side-by-side duplicate)
}

// begin starts an attempt of the call with fingerprint key, of caller,
// at now; sdkRetry is whether its SDK marks it as a retry
// (X-Stainless-Retry-Count above 0).
func (r *recall) begin(key, caller uint64, now time.Time, sdkRetry bool) attempt {
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
		if now.Sub(c.arrival) <= maxCallAge && (!c.gaveUp || sdkRetry) {
			// A call whose caller gave up in the queue keeps the time it
			// waited there, not the time it spent away (its arrival moves
			// on by that), so a retry header gains nothing beyond the
			// wait; its retry says nothing of the gateway: not counted.
			retry := !c.gaveUp
			if c.gaveUp {
				c.arrival = c.arrival.Add(now.Sub(c.ended))
			}
			c.active, c.gaveUp = c.active+1, false
			return attempt{r: r, key: key, arrival: c.arrival, retry: retry, tracked: true}
		}
		r.forgetLocked(c)
	}
	if r.callers[caller] >= maxPerCaller {
		return attempt{r: r, key: key, arrival: now} // this caller's share is full: its own calls go unremembered
	}
	if len(r.calls) >= maxRecalled && !r.evictLocked() {
		return attempt{r: r, key: key, arrival: now} // all in progress: remember nothing more
	}
	r.calls[key] = &recalled{key: key, caller: caller, arrival: now, active: 1}
	r.callers[caller]++
	return attempt{r: r, key: key, arrival: now, tracked: true}
}

// forgetLocked forgets c, which is in no list.
func (r *recall) forgetLocked(c *recalled) {
	delete(r.calls, c.key)
	if r.callers[c.caller]--; r.callers[c.caller] <= 0 {
		delete(r.callers, c.caller)
	}
}

// How an attempt ended, for recall: whether it leaves a place for the
// call's next attempt.
type attemptEnd uint8

const (
	endForgotten attemptEnd = iota // succeeded, or never reached the gateway: nothing to keep
	endFailed                      // reached the gateway and did not succeed: its retry keeps the arrival
	endGaveUp                      // its caller gave up while it queued: a marked retry keeps the wait
)

// end reports that the attempt ended at now. Only an attempt that was sent
// to the gateway and did not succeed (sent, not done) leaves a place for a
// retry; a call that succeeded, or whose attempt never reached the gateway,
// is forgotten.
func (a attempt) end(now time.Time, sent, done bool) {
	how := endForgotten
	if sent && !done {
		how = endFailed
	}
	a.finish(now, how)
}

// gaveUp reports that the attempt ended at now because its caller gave up
// while it queued: a retry its SDK marks as one keeps the time the call
// waited, within the retry window (a client's timeout counts the wait, so
// its SDK's retry would otherwise start again at the back of the queue).
func (a attempt) gaveUp(now time.Time) { a.finish(now, endGaveUp) }

// finish ends the attempt at now as how says.
func (a attempt) finish(now time.Time, how attemptEnd) {
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
	if how == endForgotten {
		r.forgetLocked(c)
		return
	}
	c.gaveUp, c.ended = how == endGaveUp, now
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
		r.forgetLocked(c)
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
	r.forgetLocked(c)
	return true
}

// len returns how many calls are remembered.
func (r *recall) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}
