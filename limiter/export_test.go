package limiter

import (
	"fmt"
	"reflect"
	"time"
)

// SameLaneState returns an error naming the first part of lane key that
// differs between limiters a and b: its holders, its queue (each waiter's
// class, arrivals and place), its timer, its saturation and busy clocks, its
// statistics, its adaptive controller. Two limiters driven alike are in the
// same state; one whose snapshot was taken at every step must be too.
func SameLaneState(a, b *Limiter, key string) error {
	la, lb := a.lockedLane(key), b.lockedLane(key)
	switch {
	case la == nil && lb == nil:
		return nil
	case la == nil || lb == nil:
		return fmt.Errorf("lane %q exists in one limiter only", key)
	}
	defer la.mu.Unlock()
	defer lb.mu.Unlock()
	type waiterState struct {
		prio                        Priority
		arrival, enqueued, deadline any
		at                          int64
		seq                         uint64
		place                       int
	}
	queue := func(l *lane) []waiterState {
		var out []waiterState
		for w := l.q.oldest; w != nil; w = w.next {
			out = append(out, waiterState{w.prio, w.arrival, w.enqueued, w.deadline, w.at, w.seq, w.place})
		}
		return out
	}
	for _, f := range []struct {
		name string
		x, y any
	}{
		{"holders", [2]int{la.slots.inflight, la.slots.others}, [2]int{lb.slots.inflight, lb.slots.others}},
		{"queue", queue(la), queue(lb)},
		{"waiting", la.slots.waiting, lb.slots.waiting},
		{"timer", [4]any{la.deadlines.timer.t != nil, la.deadlines.timer.at, la.deadlines.timeout, la.deadlines.mixed}, [4]any{lb.deadlines.timer.t != nil, lb.deadlines.timer.at, lb.deadlines.timeout, lb.deadlines.mixed}},
		{"clocks", [4]any{la.activity.since, la.activity.busyAt, la.activity.touched, la.activity.fresh}, [4]any{lb.activity.since, lb.activity.busyAt, lb.activity.touched, lb.activity.fresh}},
		{"statistics", la.stats, lb.stats},
		{"limit policy", policyState(la.limit), policyState(lb.limit)},
	} {
		if !reflect.DeepEqual(f.x, f.y) {
			return fmt.Errorf("lane %q: %s differ:\n%+v\n%+v", key, f.name, f.x, f.y)
		}
	}
	return nil
}

// policyState is what a lane's limit policy decides by: its kind, a cold
// start's end, an adaptive limit's controller and drain (not the copies
// of the settings it keeps to hand out).
func policyState(p limitPolicy) any {
	switch p := p.(type) {
	case *coldStart:
		return []any{"cold", p.until, policyState(p.inner)}
	case *adaptiveLimit:
		return []any{"adaptive", p.c, p.drainFrom}
	}
	return p
}

// QueuedCall is one waiter of a lane, for the scenario runner.
type QueuedCall struct {
	Class   Priority
	Tenant  string
	Arrival time.Time
	Seq     uint64
	Tokens  int64
}

// LaneQueue returns lane key's waiters in enqueue order and, once a call
// has named a tenant, every tenant's weighted service.
func LaneQueue(lim *Limiter, key string) ([]QueuedCall, map[string]float64) {
	l := lim.lockedLane(key)
	if l == nil {
		return nil, nil
	}
	defer l.mu.Unlock()
	var out []QueuedCall
	for w := l.q.oldest; w != nil; w = w.next {
		out = append(out, QueuedCall{w.prio, w.t.name, w.arrival, w.seq, w.cost})
	}
	var service map[string]float64
	if l.tenants.measured {
		service = map[string]float64{}
		l.eachTenantLocked(func(t *tenant) { service[t.name] = t.vs })
	}
	return out, service
}

// OneLane returns the key of the lane the limiter finds without its table
// (Limiter.one), "" when none.
func OneLane(l *Limiter) string {
	if ln := l.one.Load(); ln != nil {
		return ln.key
	}
	return ""
}

// LaneOf returns lane key, opaque, or nil; SlotLane returns the lane of s.
func LaneOf(l *Limiter, key string) any {
	if v, ok := l.lanes.Load(key); ok {
		return v
	}
	return nil
}

func SlotLane(s Slot) any { return s.h.lane }

// SetOne makes lane ln (from LaneOf) the one found without the table, as a
// lookup that found it just before its eviction may.
func SetOne(l *Limiter, ln any) { l.one.Store(ln.(*lane)) }
