package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/internal/latency"
)

// A LocalGroup is the goroutine lanes of a stealing pool (LocalLanes): each keeps its own
// queue, which the pool's balancer chooses, and a lane that has run dry, before it parks,
// takes the whole waiting stack of a peer that is stuck — the calls queued behind the one
// that peer runs — and runs them. Stuck means that the peer has finished no call for
// stallAfter, as the thief's looks at it see: a peer that is busy but moving takes its stack
// itself a moment later, and a steal then only moves calls (and their cache lines) between
// lanes for nothing. (Stealing from any peer with calls waiting took a fifth of uniform
// calls and cost 20 % of the throughput; so did waking parked lanes for every call pushed
// onto a busy one: docs/benchmarks.md.) A lane that has parked has nothing to steal for:
// holding no call, it is the first the balancer gives the next one to.
//
// A call in a lane's stack has not started, so moving it is always safe: the thief moves
// each call to its own key with a CAS on the record's Lane field, and from then on it is the
// thief's, settled with the thief's calls if the thief dies. Nothing of a steal is left to
// recover after a death: the CAS that takes a stack and the CASes that move its calls run
// no task code in between, and a victim's end waits for a thief that took its stack before
// that end to finish moving it (LocalLane.thieves).
//
// A lane that has parked has nothing to steal for as long as the pool's balancer gives the
// next call to an idle lane first: holding no call, the parked lane gets it. With a
// balancer that does not (RoundRobin, Random), the group is eager: a push onto a busy lane
// wakes a parked one, which hunts. Lanes parking in an eager group count themselves idle
// first and look at their peers once more, and a pusher looks at that count after its
// push: either the lane sees the call or the pusher sees the lane.
type LocalGroup struct {
	mu    sync.Mutex
	lanes atomic.Pointer[[]*LocalLane] // the members, copied on change under mu
	eager bool
	_     [64]byte
	// idlers counts the members of an eager group parked, or about to park, to steal.
	idlers atomic.Int32
}

// NewLocalGroup returns an empty group; eager, for a pool whose balancer may give a call to
// a busy lane while another is idle.
func NewLocalGroup(eager bool) *LocalGroup {
	g := &LocalGroup{eager: eager}
	g.lanes.Store(new([]*LocalLane))
	return g
}

// pushed follows a push onto a busy lane of an eager group: a parked lane, if any, is
// woken to hunt.
func (g *LocalGroup) pushed() {
	if g.idlers.Load() == 0 {
		return
	}
	for _, m := range *g.lanes.Load() {
		if m.stealing() && m.Nudge() {
			return
		}
	}
}

// idle counts x as idle, about to park in an eager group, and reports whether a peer has
// calls waiting that x's hunt has not seen move (then x is not idle after all: it hunts).
func (g *LocalGroup) idle(x *LocalLane) bool {
	g.idlers.Add(1) // a full barrier before looking at the peers: see pushed
	for _, v := range *g.lanes.Load() {
		if v != x && waiting(v.head.Load()) {
			if s, ok := x.seen[v]; !ok || s.hunt != x.hunts || !s.moving {
				g.idlers.Add(-1)
				return true
			}
		}
	}
	return false
}

// awake undoes idle for a lane that parked.
func (g *LocalGroup) awake() { g.idlers.Add(-1) }

func (g *LocalGroup) join(x *LocalLane) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lanes := append(append([]*LocalLane(nil), *g.lanes.Load()...), x)
	g.lanes.Store(&lanes)
}

func (g *LocalGroup) leave(x *LocalLane) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var lanes []*LocalLane
	for _, m := range *g.lanes.Load() {
		if m != x {
			lanes = append(lanes, m)
		}
	}
	g.lanes.Store(&lanes)
}

// waiting reports whether a lane's head holds calls.
func waiting(n *localNode) bool { return n != nil && !isMark(n) }

// stallAfter is how long a peer with calls waiting must finish none before a lane takes
// them: long next to a call that returns at once, short next to one that blocks.
const stallAfter = 20 * time.Microsecond

// A lane that has run dry hunts before it parks: it looks at each peer with calls waiting,
// and watches it — yielding, and looking again — until the peer finishes a call (then it
// is moving, and the lane leaves it alone for this hunt) or has finished none for
// stallAfter (then the lane steals its calls). The hunt ends when no peer is watched; the
// lane parks, and its next hunt starts afresh.
type sighting struct {
	done   uint64        // the calls the peer had finished at the first look of the hunt
	since  time.Duration // when
	hunt   uint64        // which hunt of the lane's it belongs to
	moving bool          // the peer finished calls during this hunt
}

// Results of a look at the peers.
const (
	huntNone   = iota // nothing to steal: park
	huntWatch         // a peer with calls waiting is watched: yield and look again
	huntStolen        // calls were stolen into batch
)

// look looks at every peer with calls waiting, once, and steals from the first that is
// stuck.
func (x *LocalLane) look() int {
	g := x.group
	if g == nil || !x.stealing() {
		return huntNone
	}
	result := huntNone
	now := latency.Now()
	for _, v := range *g.lanes.Load() {
		if v == x || !waiting(v.head.Load()) {
			continue
		}
		done := v.stats.Completed.Load() + v.stats.Failed.Load()
		s, ok := x.seen[v]
		switch {
		case !ok || s.hunt != x.hunts:
			if x.seen == nil {
				x.seen = make(map[*LocalLane]sighting)
			}
			x.seen[v] = sighting{done: done, since: now, hunt: x.hunts}
			result = huntWatch
		case s.moving:
		case s.done != done:
			s.moving = true
			x.seen[v] = s
		case now-s.since < stallAfter:
			result = huntWatch
		case x.steal(v):
			return huntStolen
		}
	}
	return result
}

// steal takes the waiting stack of peer v into batch and moves its calls to x; false when
// v's lane (or another thief) took it first.
func (x *LocalLane) steal(v *LocalLane) bool {
	if !v.thieves.TryLock() {
		return false
	}
	old := v.head.Load()
	if !waiting(old) || !v.head.CompareAndSwap(old, nil) {
		v.thieves.Unlock()
		return false
	}
	n := int32(0)
	for node := old; node != nil; node = node.next {
		// A call that is not v's any more was fenced by v's abandonment: it stays out.
		if node.call.moveTo(v, x) {
			x.batch = append(x.batch, node.call)
			n++
		}
	}
	v.thieves.Unlock()
	if n == 0 {
		return false
	}
	x.held.Add(n)
	if v.held.Add(-n) == 0 {
		v.owner.Idle()
	}
	x.claimed.Add(uint64(n))
	return true
}
