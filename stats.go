package knit

import (
	"cmp"
	"time"

	"github.com/knitgo/knit/supervisor"
)

// LaneStats describes one lane.
type LaneStats struct {
	Lane        int    // its index, 0 to len(Stats.Lanes)-1
	State       State  // where it is in its life
	Incarnation int    // 0 for the first start, then higher with each restart or recycle
	Restarts    int    // restarts of the lane so far (recycles not counted)
	InFlight    int    // calls on the lane, including its backlog
	Queued      int    // calls in its backlog
	Completed   uint64 // by its current incarnation
	Failed      uint64 // by its current incarnation
	PID         int    // the lane's process (process lanes)
	Node        string // the node the lane runs on (remote lanes: its address, as in RemoteConfig.Nodes)
	// Across the slot's incarnations (Restarts is, too): calls completed and failed by all
	// of them, and how many crashed (ended with a crash code: not a stop, an exit or a
	// failed start).
	TotalCompleted uint64
	TotalFailed    uint64
	Crashes        int
	Recycles       int // planned replacements (MaxCallsPerLane, MaxLaneMemory)
	// Claimed counts the calls the lane's current incarnation took from the pool's shared
	// submit ring (work stealing; InFlight and Queued count only its private ring), or, with
	// StealLocal, from its peers (they are its own from then on, in InFlight too).
	Claimed uint64
	// Holding is how many calls from the shared ring the lane has claimed and not finished,
	// as its claim journal shows them (Stats.Shared counts them too).
	Holding int
	// Moved counts the calls that waited behind a long call of the lane's current
	// incarnation and moved to other lanes (Config.MoveQueuedAfter).
	Moved uint64
}

// Stats describes a pool, as Pool.Stats returns it.
type Stats struct {
	Runtime Runtime
	Lanes   []LaneStats // every lane, in index order
	Closed  bool        // Close has begun
	// Failed: the pool ended on its own — the supervisor gave up every lane, or its actor
	// was stopped from outside — and Failure says why.
	Failed        bool
	Failure       string
	DroppedEvents uint64 // events that found Events() full
	Spares        []int  // process IDs of the spare lane processes waiting for a restart
	// Limits is what enforces ProcessConfig.Limits: a cgroup per lane process (v1 or v2),
	// or rlimits only; "" for goroutine lanes.
	Limits LimitMechanism
	// Tasks is the recent latency of each task's calls (with Config.LatencyWindow).
	Tasks []TaskStats
	// Steal is the work-stealing discipline in use (StealTicket, StealDekker or
	// StealLocal), or StealOff for private lanes; Shared counts the calls on the shared
	// submit ring or its backlog, not yet claimed or claimed and unsettled (0 with
	// StealLocal, which has no ring).
	Steal  Steal
	Shared int
	// StealGivenUp says why the pool gave its shared submit ring up — its host found it
	// written by something other than the protocol (a hostile lane), or a claim that sat —
	// after which every call goes to a lane's own ring, as with private lanes, for the
	// pool's life (docs/stealing.md). Empty while the ring serves, and without one.
	StealGivenUp string
	// Failures counts every call that failed since the pool started, by code, whatever
	// failed it: its task, its lane's end, a timeout, its caller's context, a full backlog,
	// a closed pool. TotalFailed is their sum.
	Failures    map[Code]uint64
	TotalFailed uint64
}

// Stats returns a snapshot of the pool's lanes.
func (p *Pool) Stats() Stats {
	s := Stats{Runtime: p.cfg.Runtime, Closed: p.closing.Load(),
		DroppedEvents: p.dropped.Load(), Spares: p.spares.PIDs()}
	if e := p.failed.Load(); e != nil {
		s.Failed, s.Failure = true, e.Error()
	}
	s.Limits = p.limits.mechanism
	for i := range p.laneCount() {
		ls := LaneStats{Lane: i}
		if p.tree != nil {
			var st supervisor.State
			st, ls.Incarnation, ls.Restarts = p.tree.LaneState(i)
			ls.State = State(st)
			ls.Recycles = p.tree.Recycles(i)
		}
		// Between a new incarnation's booting and its ready, the lane pointer still names
		// the old one: its PID and counters are not this incarnation's.
		if l := p.slots[i].cur.Load(); l != nil && (p.tree == nil || l.Inc == ls.Incarnation) {
			st := l.Counters()
			ls.InFlight, ls.Queued, ls.Claimed, ls.Moved = int(l.inflight.Load()), l.queued(), l.claimed.Load(), l.moved.Load()
			if l.local != nil {
				ls.Claimed = l.local.Claimed()
			}
			if sh := p.shared; sh != nil && l.cid >= 0 {
				ls.Holding = sh.prod.Held(l.cid)
			}
			ls.Completed, ls.Failed, ls.PID = st.Completed, st.Failed, l.Run().PID()
			ls.Node = nodeOf(l.Run())
		}
		p.totalsOf(i, &ls)
		s.Lanes = append(s.Lanes, ls)
	}
	s.Tasks = p.taskStats()
	s.Failures, s.TotalFailed = p.obs.failureCounts()
	s.Steal = StealOff
	if sh := p.shared; sh != nil {
		s.Steal, s.Shared = sh.mode, int(sh.inflight.Load())
		if gone, why := sh.Degraded(); gone {
			s.StealGivenUp = cmp.Or(why, "given up")
		}
	}
	if p.group != nil {
		s.Steal = StealLocal
	}
	return s
}

// TaskStats describes the recent latency of one task's calls, from submission to settlement
// (time in the backlog counts), over the last one to two LatencyWindow periods: quantiles
// are read from a log-linear histogram, within ±3.2 % of the true value; Max is exact.
type TaskStats struct {
	Task               string
	Calls              uint64 // settled in the window
	P50, P90, P99, Max time.Duration
	Window             time.Duration // the period: the figures cover the last one to two of them
}
