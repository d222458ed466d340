package actors

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/latency"
)

// A LocalLane is a goroutine lane, both ends of it: the queue its callers submit to and the
// loop the lane goroutine runs. Nothing of a call crosses a process boundary, so nothing
// goes through a slot ring: the queue links the calls' records themselves, and the lane
// runs and settles them by reference. A slot ring in heap memory cost a goroutine-lane call
// the ring's mutex, a slot header, two doorbell handshakes and two lookups of the record by
// index; a Go channel in its place cost a contended runtime lock per call on each side
// (docs/benchmarks.md, "Goroutine lanes without a ring").
//
// The queue is one word, head: a stack of the calls submitted and not taken yet, linked
// through their records, or a mark. A submitter pushes with one CAS; the lane takes the
// whole stack with another and runs it oldest first. A lane that finds the stack empty
// yields a few times while calls keep coming that soon (spun), then swaps in the asleep
// mark and parks on its bell; the submitter that replaces the mark (by handed, which counts
// as empty) hands its call over on the bell itself, so a call to a sleeping lane costs one
// CAS and one channel hand-off, and a busy lane costs its submitters no wake-up at all. The
// lane's end swaps in the closed mark, after which no call is pushed.
//
// In a stealing pool the lanes form a LocalGroup: a lane that has run dry takes the whole
// stack of a stuck peer before it parks (localsteal.go).
//
// Queue closure works as on any lane: a submitter names the lane in the call's record
// (Lane) before it pushes, the host finds every call the lane held by that field, and the
// one the lane was running when it died is the one in its cur field. The record's Lane
// field is also who settles a call: the lane takes it back (from the lane's key to -1) with
// a CAS after it ran the call, the host with a CAS when the lane has ended or is abandoned,
// a submitter that met the closed mark with a CAS as well, and a thief moves it to its own
// key with one.
type LocalLane struct {
	key     int32
	owner   LocalOwner
	held    *atomic.Int32 // the calls the lane holds, as its owner counts them
	closing *atomic.Bool  // the pool is closing: the owner hears of every settled call
	cap     int32         // calls held at most
	block   bool
	group   *LocalGroup // a stealing pool's lanes (nil: none)

	_    [64]byte
	head atomic.Pointer[localNode] // the submitters' line

	_        [64]byte
	bell     chan *localNode // the lane parks on it: a call handed over, or nil (a nudge)
	roomMu   sync.Mutex
	space    chan struct{} // closed when a full lane has room again (BlockWhenFull)
	wantRoom atomic.Bool   // a submitter waits on space
	sealed   bool          // under roomMu: the lane has ended; space stays closed
	// thieves is held by a peer that has taken this lane's stack until it has moved every
	// call of it to its own key; Seal waits for it, so that the host's look for this
	// lane's calls meets none half-moved.
	thieves sync.Mutex

	_       [64]byte
	stop    *atomic.Uint32 // the region's stop word
	open    *atomic.Uint32 // the region's open word: in a group, the lane steals while it is 1
	claimed atomic.Uint64  // calls it took from peers
	stats   fastpath.Stats
	timed   bool
	panic   bool
	batch   []LocalCall             // the calls taken, newest first; run from the end
	seen    map[*LocalLane]sighting // in a group: what the lane's hunts saw of its peers
	hunts   uint64                  // how many times it has hunted, and parked
	cur     LocalCall               // the call running; it stays set when the lane dies in it
	began   time.Duration
	// spin is how many times the lane has yielded looking for calls since it last had
	// one; budget how many it may (spun adapts it); parks how many times in a row it parked
	// without spinning.
	spin, budget, parks int
	err                 error // a panic that crashes the lane (PanicCrashesLane)
}

// maxSpins bounds how many times a lane yields (runtime.Gosched) looking for calls before it
// parks; parksToSpin is how many parks in a row make it try one yield again.
const (
	maxSpins    = 4
	parksToSpin = 8
)

// The marks head holds besides a stack of calls (nil, too, is an empty stack).
var (
	localAsleep = new(localNode) // the lane parks: whoever replaces the mark hands it a call
	localHanded = new(localNode) // empty: a call or nudge was handed to the sleeping lane
	localClosed = new(localNode) // the lane has ended: nothing is pushed any more
)

// isMark reports whether n is one of head's marks, not a call.
func isMark(n *localNode) bool { return n == localAsleep || n == localHanded || n == localClosed }

// LocalCall is a call as a LocalLane queues it: its record.
type LocalCall interface {
	runLocal(x *LocalLane)
	// panicked settles the call the lane was running when its task panicked with v.
	panicked(x *LocalLane, v any, stack []byte)
	// moveTo moves the call from lane from to lane to (false: it is not from's any more).
	moveTo(from, to *LocalLane) bool
	node() *localNode
	laneKey() *atomic.Int32
}

// NameLane names lane key in the record of every call of batch, as a submitter does before
// it pushes (PushBatch).
func NameLane(batch []LocalCall, key int32) {
	for _, c := range batch {
		c.laneKey().Store(key)
	}
}

// TakeBack takes call c back from lane key, after a PushBatch that found the lane ended,
// with the CAS on its record's Lane field that the lane's end uses too: true when it got it
// back (the caller submits it again), false when the lane's end has settled it already.
func TakeBack(c LocalCall, key int32) bool { return c.laneKey().CompareAndSwap(key, -1) }

// localNode links a record into a LocalLane's stack. next is a plain field: a submitter
// writes it before the CAS that publishes the node, and the lane (or a thief) reads it after
// the CAS that takes the stack.
type localNode struct {
	next *localNode
	call LocalCall
}

// LocalOwner is the pool's side of a LocalLane. It admits calls and counts them in Held
// itself (the lane only pushes them: Push); the lane tells it of the calls it settles.
type LocalOwner interface {
	// Idle: the lane's count of held calls went down to zero (as it settled a call, before
	// its caller woke, or a peer took its calls). CallDone: a call settled while the pool
	// was closing.
	Idle()
	CallDone()
	Wrapper
}

// LocalConfig configures a LocalLane.
type LocalConfig struct {
	Owner LocalOwner
	Key   int32 // names the lane in call records
	// Held is the owner's count of the calls the lane holds, which the lane lowers as it
	// settles them; Closing says that the owner wants to hear of every settled call.
	Held    *atomic.Int32
	Closing *atomic.Bool
	// Capacity is how many calls the lane holds at most; beyond it the owner fails a call
	// with Full's *BacklogFull, whose Space, with BlockWhenFull, is closed when there is
	// room.
	Capacity      int
	BlockWhenFull bool
	// Region is the lane's region: its stop word, open word and counters.
	Region *fastpath.Region
	// Timed has the lane time each call for the record's observer; Panic makes a task
	// panic end the lane (PanicCrashesLane).
	Timed, Panic bool
	// Group, if set, is the stealing pool's lanes: the lane joins it, and while its region's
	// open word is 1 it takes calls from busy peers when it has none of its own.
	Group *LocalGroup
}

// NewLocalLane returns a LocalLane (a member of c.Group, if set).
func NewLocalLane(c LocalConfig) *LocalLane {
	x := &LocalLane{key: c.Key, owner: c.Owner, held: c.Held, closing: c.Closing,
		cap: int32(max(c.Capacity, 1)), block: c.BlockWhenFull, group: c.Group,
		bell: make(chan *localNode, 1), space: make(chan struct{}),
		stop: c.Region.Stop(), open: c.Region.Open(), stats: c.Region.Stats(), timed: c.Timed, panic: c.Panic}
	if x.group != nil {
		x.group.join(x)
	}
	return x
}

// closedSpace is the Space of a full LocalLane's BacklogFull without BlockWhenFull, or once
// it has room again: there is nothing to wait for.
var closedSpace = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Cap is how many calls the lane holds at most.
func (x *LocalLane) Cap() int32 { return x.cap }

// Push queues call c, which its owner has admitted, counted in Held and named the lane's in
// its record's Lane field, on the lane; false once the lane has ended (Seal), when the owner
// takes the call back from the record's Lane field with a CAS, or finds that the lane's
// end has settled it already. busy says the lane held calls before this one: in an eager
// group, a parked peer is woken to take them if this lane is stuck.
func (x *LocalLane) Push(c LocalCall, busy bool) bool {
	n := c.node()
	return x.push(n, n, busy)
}

// PushBatch queues the calls of batch, oldest first, as Push queues one: with one CAS (and one
// hand-off on the bell of a sleeping lane) for them all, which the lane takes together.
// Their owner has admitted them, counted them in Held and named the lane in their records.
// False, with none queued, once the lane has ended.
func (x *LocalLane) PushBatch(batch []LocalCall, busy bool) bool {
	if len(batch) == 0 {
		return true
	}
	// The stack is newest first: link the batch so, its oldest call last (the lane runs a
	// stack from its end).
	first := batch[len(batch)-1].node()
	for i := len(batch) - 1; i > 0; i-- {
		batch[i].node().next = batch[i-1].node()
	}
	return x.push(first, batch[0].node(), busy)
}

// push queues the chain of nodes from first to last (linked through next, newest first).
func (x *LocalLane) push(first, last *localNode, busy bool) bool {
	n := first
	for {
		old := x.head.Load()
		switch old {
		case localClosed:
			return false
		case localAsleep:
			// One submitter wins the mark, so the bell's one slot is free for its calls.
			if x.head.CompareAndSwap(localAsleep, localHanded) {
				last.next = nil
				x.bell <- n
				return true
			}
			continue
		case nil, localHanded:
			last.next = nil
		default:
			last.next = old
		}
		if x.head.CompareAndSwap(old, n) {
			if busy && x.group != nil && x.group.eager {
				x.group.pushed() // after the push (a full barrier): see LocalGroup.idle
			}
			return true
		}
	}
}

// Full is the error of a call that found the lane full.
func (x *LocalLane) Full() error {
	if !x.block {
		return &BacklogFull{Space: closedSpace}
	}
	x.roomMu.Lock()
	space := x.space
	if !x.sealed {
		x.wantRoom.Store(true)
	}
	x.roomMu.Unlock()
	// After wantRoom (a full barrier): calls that settled before the lane could see it
	// may have made room already.
	if x.held.Load() < x.cap {
		return &BacklogFull{Space: closedSpace}
	}
	return &BacklogFull{Space: space}
}

// room lets the submitters waiting for room try again, once a call has settled.
func (x *LocalLane) room() {
	if !x.wantRoom.Load() {
		return
	}
	x.roomMu.Lock()
	if x.wantRoom.Swap(false) && !x.sealed {
		close(x.space)
		x.space = make(chan struct{})
	}
	x.roomMu.Unlock()
}

// Queued is about how many calls wait in the queue: those the lane holds, less the one it
// is taken to run (the queue itself keeps no count).
func (x *LocalLane) Queued() int { return max(int(x.held.Load())-1, 0) }

// Nudge wakes the lane if it sleeps, so that it looks at its stop word, which the host has
// set before (a lane that does not sleep looks at it before it parks). It reports whether
// the lane slept.
func (x *LocalLane) Nudge() bool {
	if x.head.CompareAndSwap(localAsleep, localHanded) {
		x.bell <- nil
		return true
	}
	return false
}

// Seal closes the queue once the owner's Admit refuses every call: nothing is pushed from
// now on, and no peer moves a call away, so the host finds every call the lane held by its
// records (those left on the stack are never run: their records still name the lane).
// Submitters waiting for room are let go.
func (x *LocalLane) Seal() {
	x.head.Swap(localClosed)
	x.thieves.Lock() // a thief that took the stack before the swap has finished moving it
	x.thieves.Unlock()
	if x.group != nil {
		x.group.leave(x)
	}
	x.roomMu.Lock()
	if !x.sealed {
		x.sealed = true
		close(x.space)
	}
	x.roomMu.Unlock()
}

// Running is the call the lane was running when it ended (nil: none). Only for a lane
// whose goroutine has ended.
func (x *LocalLane) Running() LocalCall { return x.cur }

// Claimed is how many calls the lane took from its peers.
func (x *LocalLane) Claimed() uint64 { return x.claimed.Load() }

// Run serves calls until the host asks the lane to stop, which it acknowledges once its
// queue is empty. It returns the *PanicError of a task that panicked when panics crash the
// lane.
func (x *LocalLane) Run() error {
	for !x.serve() {
		if x.err != nil {
			return x.err
		}
	}
	x.stop.Store(fastpath.StopAcknowledged)
	return nil
}

// serve runs calls, oldest first, until the lane is to stop (true), or a task panics
// (false): the deferred recover, one per panic rather than one per call, settles the call
// with the panic (or keeps it as the lane's crash), and Run serves on.
func (x *LocalLane) serve() (stop bool) {
	defer func() {
		if v := recover(); v != nil {
			x.cur.panicked(x, v, debug.Stack())
		}
	}()
	for {
		for i := len(x.batch) - 1; i >= 0; i-- {
			c := x.batch[i]
			x.batch[i] = nil
			x.batch = x.batch[:i]
			c.runLocal(x)
		}
		if !x.take() {
			return true
		}
	}
}

// take waits for calls and takes them all into batch (in a group, a stuck peer's, when the
// lane has none of its own and is about to park); false once the host has asked the lane
// to stop and no call waits (or the queue is closed: an abandoned lane that returned).
func (x *LocalLane) take() bool {
	for {
		old := x.head.Load()
		if !isMark(old) && old != nil {
			if !x.head.CompareAndSwap(old, nil) {
				continue
			}
			x.spun(true)
			for n := old; n != nil; n = n.next {
				x.batch = append(x.batch, n.call)
			}
			return true
		}
		if old == localClosed {
			return false
		}
		if old != localAsleep && x.spin < x.budget {
			x.spin++
			runtime.Gosched()
			continue
		}
		if old != localAsleep {
			switch x.look() {
			case huntStolen:
				x.spun(true)
				return true
			case huntWatch:
				runtime.Gosched()
				continue
			}
		}
		x.spun(false)
		if old != localAsleep && !x.head.CompareAndSwap(old, localAsleep) {
			continue
		}
		// After the mark (a full barrier): a stop request stored before it is seen here,
		// and one stored after it is followed by a Nudge that finds the mark. In an eager
		// group the same goes for a call pushed onto a busy peer (LocalGroup.idle).
		counted := false
		if g := x.group; g != nil && g.eager && x.stealing() {
			if !g.idle(x) {
				counted = true
			} else if x.head.CompareAndSwap(localAsleep, nil) {
				continue // a peer has calls this hunt has not seen move: hunt them
			}
			// (else something was handed over meanwhile: the bell has it)
		} else if x.stop.Load() != fastpath.StopRunning && x.head.CompareAndSwap(localAsleep, nil) {
			return false // a call pushed from now on is found by the lane's end
		}
		n := <-x.bell
		if counted {
			x.group.awake()
		}
		x.hunts++ // a new hunt after each park
		if n != nil {
			for ; n != nil; n = n.next { // a call, or a batch of them (PushBatch)
				x.batch = append(x.batch, n.call)
			}
			return true
		}
		// A nudge: a stop request, a stealing lane opened (lane.Open), or (eager group) a
		// call pushed onto a busy peer.
	}
}

// spun adapts the lane's spin budget: it found a call (found), or it is about to park.
// Spinning pays while calls come within a few yields of each other (a caller that waits
// for each result, on a P the lane yields to, gets it and calls again without the lane
// parking on its bell and the caller handing the call over on it); it doubles while it
// finds calls and halves when it does not, and after parksToSpin parks in a row the lane
// tries one yield again.
func (x *LocalLane) spun(found bool) {
	switch {
	case found && x.spin > 0:
		x.budget = min(2*x.budget+1, maxSpins)
		x.parks = 0
	case found:
	case x.spin > 0:
		x.budget /= 2
	default:
		if x.parks++; x.parks >= parksToSpin && x.budget == 0 {
			x.budget, x.parks = 1, 0
		}
	}
	x.spin = 0
}

// stealing reports whether the lane takes calls from its peers now: it is open to it (a
// retiring lane is not) and has not been asked to stop.
func (x *LocalLane) stealing() bool {
	return x.open.Load() != 0 && x.stop.Load() == fastpath.StopRunning
}

// runLocal implements LocalCall: the lane runs the call by reference and settles it.
func (r *Record[In, Out]) runLocal(x *LocalLane) {
	if r.Lane.Load() != x.key {
		return // settled and fenced when the host abandoned the lane: not its call any more
	}
	x.cur = r
	if x.timed {
		x.began = latency.Now()
	}
	if err := r.ctx.Err(); err != nil { // the caller gave up before the call started
		var zero Out
		r.settleLocal(x, Failed, zero, err)
		return
	}
	out, err := r.table.def.fn(r.ctx, r.In)
	o := OK
	if err != nil {
		o = Failed
	}
	r.settleLocal(x, o, out, err)
}

// panicked implements LocalCall.
func (r *Record[In, Out]) panicked(x *LocalLane, v any, stack []byte) {
	pe := &PanicError{Value: v, Stack: stack}
	if x.panic {
		x.err = pe // the call stays the lane's: it had started when the lane died
		return
	}
	var zero Out
	r.settleLocal(x, Panicked, zero, pe)
}

// settleLocal ends the call the lane ran with outcome o.
func (r *Record[In, Out]) settleLocal(x *LocalLane, o Outcome, out Out, err error) {
	var ran uint64
	if x.timed {
		ran = uint64(max(latency.Now()-x.began, 1))
	}
	x.cur = nil
	if o == OK {
		x.stats.Completed.Add(1)
	} else {
		x.stats.Failed.Add(1)
	}
	// The lane takes the record back from its key, unless the host has fenced it: it
	// abandoned the lane meanwhile, settled the call and counted it (FailLane), and the
	// record is never reused. From here the call is the lane's alone to settle.
	if !r.Lane.CompareAndSwap(x.key, -1) {
		return
	}
	if x.held.Add(-1) == 0 {
		x.owner.Idle()
	}
	// A call that failed after its context ended is settled by the caller's context
	// (timeout rules, TimeoutDefault), which is certain to fire.
	if r.Pending() && (o == OK || r.ctx.Err() == nil) {
		if o != OK {
			err = x.owner.Wrap(r.table.def, o, err)
		}
		if !r.finishDrop(out, err, ran) {
			r.table.Release(r)
		}
	} else {
		r.table.Release(r)
	}
	x.room()
	if x.closing.Load() {
		x.owner.CallDone()
	}
}

// moveTo implements LocalCall.
func (r *Record[In, Out]) moveTo(from, to *LocalLane) bool {
	return r.Lane.CompareAndSwap(from.key, to.key)
}

func (r *Record[In, Out]) node() *localNode { return &r.link }

func (r *Record[In, Out]) laneKey() *atomic.Int32 { return &r.Lane }
