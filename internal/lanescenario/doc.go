// Package lanescenario runs the lane's scenario files (limiter/testdata/
// scenarios) against an engine: the in-process limiter, or a limiter on a
// sharedlane Backend in a real redis-server. Both engines print the same
// output for every file; a line only one of them prints is marked with
// its name (see Run).
//
// A file is a story in the style of github.com/cockroachdb/datadriven:
// commands, each followed by what it printed. The commands:
//
//	config limit=2 reserve=1 timeout=5m tpm=1000 max-inflight-tokens=0
//	       cap=1 max-tenants=100 weights=(a=2,b=1) cold-start
//	       deadline=wait|answer_early margin=500ms
//	reload <the same keys>     (Limiter.SetConfig)
//	acquire id=a1 class=bulk tenant=A tokens=300 [arrival=-30s|arrival=a1]
//	        [deadline=6s]      (its caller gives up 6 s from now: WithDeadline)
//	advance 61s                (the fake clock, from one due timer to the next)
//	release id=a1
//	cancel id=a1               (the caller gives up)
//	settle id=a1 used=200      (Slot.Settle: what the call used)
//	limits id=a1 tokens=limit/remaining/reset requests=... retry-after=5s
//	       [concurrency] [refuse]  (a concurrency 429; the provider's own headers)
//	snapshot
//	only local why="..."       (the rest of the file is this engine's alone)
//
// Every command but only prints what happened (granted, timed out with
// the place the engine reports, canceled, refused), then the lane: who holds its slots, who waits in what
// order (classes in the order of their oldest waiters, each class's
// waiters by their tenant's service, then arrival), what the first in line
// waits for, the tenants' weighted service, the token budget and the
// provider's word.
package lanescenario
