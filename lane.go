package knit

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// lane is the host end of one lane's rings (ring: the request ring and its backlog under mu,
// shared by every caller; the return ring, one drainer at a time: callers waiting for
// results and the lane's reaper goroutine take turns) and its accounting. Its life — start,
// ready, stop protocol, end — is the embedded lifecycle.Lane, which drives the rings through
// lifecycle.Rings and never sees the pool.
type lane struct {
	lifecycle.Lane // its life: start, stop protocol, end (lifecycle.Rings is this type)

	p   *Pool
	key int32 // names this incarnation in call records: inc·lanes + idx

	mu   sync.Mutex
	ring *actors.HostRing // the host end of its rings, which mu guards; set by start
	// local, instead of ring, is a goroutine lane of a pool with no shared ring (private
	// lanes, or StealLocal): its callers push their records onto it, and it runs and
	// settles them by reference (actors.LocalLane).
	local *actors.LocalLane
	// afterDrain, if set, runs after each drain that settled results: a node's lane sends
	// the batch to its host then (set before the lane's first call; read by drainers).
	afterDrain func()
	// diedRunning: a call was running on the incarnation when it ended (Settle), which
	// the supervisor blames on the call (supervisor.End.Running).
	diedRunning atomic.Bool

	wake     *fastpath.Wake
	laneBell fastpath.Bell
	done     fastpath.Completion
	doneBell fastpath.Bell
	reaper   bool         // results are drained by a reaper goroutine (Incarnation.Remote)
	waiters  atomic.Int32 // calls whose settlement is up to the reaper
	kick     chan struct{}
	// agentDrains: a node's agent drains the lane's one call in flight itself
	// (nodeLane.awaitOne), so the reaper idles until kicked instead of sleeping on the
	// doorbell, which the lane would ring with every result (a write to the eventfd, and a
	// wake-up of the reaper through the netpoller while the agent sends the result).
	// Whoever clears it kicks the reaper.
	agentDrains atomic.Bool
	idling      atomic.Bool // the reaper idles until kicked (tests watch it)
	// directDone is the return ring's direct doorbell, which a caller alone on the lane sleeps
	// on itself (waitDirect); direct is held while one does.
	directDone fastpath.Completion
	directBell fastpath.Bell
	direct     atomic.Bool

	inflight atomic.Int32
	rang     atomic.Bool   // the last publication woke the lane from a park (slowWake)
	claimed  atomic.Uint64 // results of calls it claimed from the shared ring
	cid      int           // its consumer id on the shared ring (-1: it does not claim)

	reaped chan struct{}

	calls int // under mu: calls accepted, for MaxCallsPerLane
	// stalled and stalledAt are the watchdog's: at its last look calls waited on the
	// request ring and the lane's consumer word was stalledAt (ringStalled).
	stalled   bool
	stalledAt uint32
	// longSeq and longSince are the watchdog's too: the call the lane was running at its
	// looks, and since when (moveQueued); long is longSince in Unix nanoseconds once that
	// call has run MoveQueuedAfter (0 before), and the balancer passes the lane by.
	longSeq   uint64
	longSince time.Time
	long      atomic.Int64
	moved     atomic.Uint64 // calls moved from behind a long call (LaneStats.Moved)
	idle      chan struct{} // a retiring lane's last call has settled (recycle.go)
}

func newLane(p *Pool, idx, inc int) *lane {
	l := &lane{
		p: p, key: laneKey(idx, inc), cid: -1,
		kick:   make(chan struct{}, 1),
		reaped: make(chan struct{}),
		idle:   make(chan struct{}, 1),
	}
	l.Init(idx, inc, lifecycle.LaneConfig{
		Runtime: p.runtime, Mu: &l.mu, Log: p.laneLog,
		StopAckTimeout: p.cfg.StopAckTimeout, KillGrace: p.cfg.KillGrace,
		StopTimedOut: func() { p.obs.stopTimedOut(idx) },
		Killed:       func(signal, reason string) { p.obs.killed(idx, signal, reason) },
	}, l)
	return l
}

// start opens an incarnation on the pool's runtime and starts it: a goroutine running the
// executor, or a process (lifecycle.Runtime). It returns once the incarnation runs; a
// process's ready report comes later (lifecycle.Incarnation.AwaitReady).
func (l *lane) start() error {
	if err := l.OpenRegion(); err != nil {
		return err
	}
	run, region := l.Run(), l.Region()
	l.debugRegion(l.p.memory)
	l.reaper = run.Remote() // its results wait on the return ring for a drainer
	if !l.reaper && l.p.shared == nil {
		l.local = actors.NewLocalLane(actors.LocalConfig{Owner: l, Key: l.key, Held: &l.inflight, Closing: &l.p.closing,
			// The call it runs, and as many waiting as a ring's slots and backlog hold.
			Capacity: 1 + fastpath.Slots + l.p.cfg.Backlog, BlockWhenFull: l.p.cfg.BlockWhenFull,
			Region: region, Timed: l.p.obs.timed(), Panic: l.p.cfg.PanicCrashesLane, Group: l.p.group})
	} else {
		l.ring = l.newRing()
	}
	l.wake, l.laneBell = region.LaneWake(), run.LaneBell()
	l.done, l.doneBell = region.Returns().Completion(), run.DoneBell()
	l.directDone, l.directBell = region.Returns().Direct(), run.DirectBell()
	launch := lifecycle.Launch{
		Exec: l.executor, Boot: l.bootRecord,
		// A restart takes a spare; a first start never does: the first lanes start
		// together, and spares start once the pool is up (lanes added by Resize, whose
		// incarnation is 0 too, start once it is up).
		Spare: l.Inc > 0 || l.p.up.Load(),
	}
	if l.ring != nil {
		launch.Refill, launch.Drain = l.ring.FlushBacklogs, l.drain
	}
	if s := l.p.shared; s != nil {
		if l.cid = s.join(l); l.cid >= 0 && s.mp != nil { // a process lane maps the ring's memfd
			launch.Files = []*os.File{s.mp.File()}
		}
	}
	if err := l.Start(launch); err != nil {
		if s := l.p.shared; s != nil {
			s.leave(l)
		}
		return err
	}
	if l.reaper {
		go l.reap()
	} else {
		close(l.reaped) // the lane drains its own results: no reaper
	}
	return nil
}

// executor is what a goroutine incarnation runs: its LocalLane in a pool with private
// lanes; in a stealing pool, an executor that settles its results itself, right after each
// call, and claims from the shared ring.
func (l *lane) executor(region *fastpath.Region, bell fastpath.Bell) (lifecycle.Runner, error) {
	if l.local != nil {
		return l.local, nil
	}
	cfg := l.p.cfg
	exec := &actors.Executor{
		Region: region, Lane: bell,
		Host: l.ring, Corrupt: l.corrupt, Spin: l.p.laneSpin(l.Idx), Local: true, Tasks: l.p.byIndex,
		Panic: cfg.PanicCrashesLane, Timed: l.p.obs.timed(),
	}
	var err error
	if l.cid >= 0 {
		exec.Steal, err = l.p.shared.ring.Consumer(l.cid, l.p.root)
	}
	return exec, err
}

// debugRegion logs a new region's shape in the fastpath namespace.
func (l *lane) debugRegion(kind string) {
	layout := l.Region().Layout()
	l.DebugTo(l.p.fastLog, "region created", zap.String("memory", kind), zap.Int("bytes", layout.Size()),
		zap.Int("slots", fastpath.Slots), zap.Int("inline", layout.Inline), zap.Int("arena", layout.Arena),
		zap.Int("abort_bits", layout.AbortBits))
}

// newRing builds the host end of the lane's rings over its region. A process lane's calls
// get abort bits; a goroutine lane's are interrupted through their callers' contexts.
func (l *lane) newRing() *actors.HostRing {
	c := actors.RingConfig{Mu: &l.mu, Owner: l, Submit: &actors.LaneProducer{Producer: l.Region().Requests().Producer()},
		Key: l.key, Backlog: l.p.cfg.Backlog, BlockWhenFull: l.p.cfg.BlockWhenFull,
		Returns: l.Region().Returns().Consumer(), Tasks: l.p.byIndex, Settle: l, Remote: l.reaper,
		CountChunks: l.p.cfg.MaxCallsPerLane > 0}
	if l.reaper {
		c.Aborts = l.Region().Aborts()
		c.Room = l.roomFreed
	}
	if sh := l.p.shared; sh != nil {
		c.Shared = sh.host
	}
	return actors.NewHostRing(c)
}

// submit publishes c on this lane, or queues it in the backlog. It fails when the lane is
// not ready (the caller picks another) or its backlog is full.
func (l *lane) submit(c actors.Call) error {
	if l.local != nil {
		return l.submitLocal(c.Lane, c.Local)
	}
	_, err := l.ring.Submit(&c)
	return err
}

// queued is how many calls wait in the lane's backlog (a LocalLane: in its queue).
func (l *lane) queued() int {
	if l.local != nil {
		return l.local.Queued()
	}
	return int(l.ring.Queued())
}

// Admit implements actors.RingOwner: a lane takes calls while it is ready.
func (l *lane) Admit() error {
	if l.State() != lifecycle.LaneReady {
		return errLaneGone
	}
	return nil
}

// Accept implements actors.RingOwner: it counts a call as held by this lane before it is
// published, so a lane that ends finds every call it held.
func (l *lane) Accept(calls int) {
	if l.inflight.Add(1) == 1 && l.p.moveIdle.Load() {
		l.p.wakeMover() // the watchdog stopped looking for long calls: see Pool.moveIdle
	}
	if max := l.p.cfg.MaxCallsPerLane; max > 0 {
		l.countCalls(max, calls)
	}
}

// Published implements actors.RingOwner.
func (l *lane) Published() {
	if woke := l.wake.Ring(l.laneBell); woke != l.rang.Load() { // a load when nothing changes
		l.rang.Store(woke)
	}
}

// slowWake reports whether the lane was woken for the last calls published, or is parked:
// a caller whose spin ran out waited for the lane's wake-up, not for its pace.
// The lane may have ended while its caller spun: its wake word is read under mu, only
// while the region is mapped (a process lane's is unmapped once its calls have settled).
func (l *lane) slowWake() bool {
	if l.rang.Load() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return true // it ended: its pace says nothing
	}
	awake, woken := l.wake.Awake()
	return !awake || woken
}

// roomFreed rings the lane, parked until its full return ring has room, after a drain.
// l.wake is set after the ring is built: the method value reads it when it is called.
func (l *lane) roomFreed() { l.wake.Force(l.laneBell) }

// Dropped implements actors.RingOwner: calls whose callers had gone left the backlog.
func (l *lane) Dropped(n int) {
	l.inflight.Add(int32(-n))
	l.p.callDone()
}

// submitLocal queues the call of record lane field lane on the lane's LocalLane: the lane
// takes it while it is ready and holds fewer calls than its capacity.
func (l *lane) submitLocal(lane *atomic.Int32, c actors.LocalCall) error {
	if l.State() != lifecycle.LaneReady {
		return errLaneGone
	}
	// Counted and marked before it is pushed: whoever settles it finds it counted, and the
	// lane's end finds it held.
	n := l.inflight.Add(1)
	if max := l.p.cfg.MaxCallsPerLane; max > 0 {
		l.mu.Lock()
		l.countCalls(max, 1)
		l.mu.Unlock()
	}
	if n > l.local.Cap() {
		l.unhold()
		return l.local.Full()
	}
	lane.Store(l.key)
	if l.local.Push(c, n > 1) {
		return nil
	}
	// The lane ended after the state check. Its end may have found the call by its record
	// already (and run it elsewhere, or failed it): then it is settled.
	if !lane.CompareAndSwap(l.key, -1) {
		return nil
	}
	l.unhold()
	return errLaneGone
}

// submitLocalBatch queues the calls of batch, oldest first, on the lane's LocalLane with one
// push (one CAS, and one hand-off if the lane sleeps), as submitLocal queues one: the lane
// takes them while it is ready and has room for them all. An error means none was taken.
// pushed is false, with no error, when the lane ended after the state check: the caller
// takes the calls back (actors.TakeBack) and submits those it gets back again.
func (l *lane) submitLocalBatch(batch []actors.LocalCall) (pushed bool, err error) {
	if l.State() != lifecycle.LaneReady {
		return false, errLaneGone
	}
	k := int32(len(batch))
	n := l.inflight.Add(k)
	if max := l.p.cfg.MaxCallsPerLane; max > 0 {
		l.mu.Lock()
		l.countCalls(max, len(batch))
		l.mu.Unlock()
	}
	if n > l.local.Cap() {
		l.inflight.Add(-k)
		l.p.callDone()
		return false, l.local.Full()
	}
	actors.NameLane(batch, l.key)
	if l.local.PushBatch(batch, n > k) {
		return true, nil
	}
	// The lane ended after the state check: the caller takes back what its end has not.
	return false, nil
}

// unhold uncounts a call that did not go into the lane's queue.
func (l *lane) unhold() {
	l.inflight.Add(-1)
	l.p.callDone()
}

// Idle implements actors.LocalOwner.
func (l *lane) Idle() {
	if l.State() == lifecycle.LaneRetiring {
		l.retireIdle()
	}
}

// CallDone implements actors.LocalOwner.
func (l *lane) CallDone() { l.p.callDone() }

var errLaneGone = errors.New("lane not ready")

// flush moves backlog calls into free slots.
func (l *lane) flush() { l.ring.Flush() }

// drain settles every result waiting on the return ring, unless someone else is draining
// (actors.HostRing.Drain), and kills the lane if one broke the protocol.
func (l *lane) drain() int {
	settled, err := l.ring.Drain()
	if err != nil {
		l.corrupt(err)
	}
	if settled > 0 && l.afterDrain != nil {
		stamp.S(stamp.NodeDrained)
		l.afterDrain()
	}
	return settled
}

// SettleResult implements actors.Settler: the lane's accounting for a result the ring has
// checked, and the settling of its call.
func (l *lane) SettleResult(r actors.Result) error {
	var sh *shared
	if r.Shared { // a call the lane claimed from the shared ring
		sh = l.p.shared
	}
	// The lane counts as idle, and a claimed call as its own, before the caller wakes: a
	// balancer sees it free, and Stats read after the result count the call.
	if sh == nil && l.inflight.Add(-1) == 0 && l.State() == lifecycle.LaneRetiring {
		l.retireIdle()
	}
	if sh != nil {
		l.claimed.Add(1)
	} else if l.p.pace != nil {
		l.p.notePace(r.Def.Index(), r.Ran)
	}
	if err := r.Def.SettleResult(l.p.id, r.Key, r.ID, r.Gen, r.Outcome, r.Payload, !l.reaper, r.Ran, l); err != nil {
		if sh == nil {
			l.inflight.Add(1)
		} else {
			l.claimed.Add(^uint64(0))
		}
		return fmt.Errorf("%w: %v", fastpath.ErrCorrupt, err)
	}
	if sh != nil {
		sh.settled()
		if max := l.p.cfg.MaxCallsPerLane; max > 0 {
			l.mu.Lock()
			n := 1
			if r.Outcome == actors.OK { // an error's payload holds no count
				n = actors.Calls(r.Def, r.Payload)
			}
			l.countCalls(max, n)
			l.mu.Unlock()
		}
	}
	l.p.callDone()
	return nil
}

// Wrap implements actors.Wrapper: a lane's outcome as the caller's error.
func (l *lane) Wrap(t actors.Def, o actors.Outcome, err error) error {
	if e := wrapOutcome(l.Idx, t, o, err); e != nil {
		return e
	}
	l.DebugTo(l.p.codecLog, "payload did not decode", zap.String("task", t.Name()), zap.Stringer("outcome", o), zap.Error(err))
	return brokeProtocol(l.Idx, t, err)
}

// wrapOutcome is Wrap for lane idx, or nil where the outcome breaks the protocol.
func wrapOutcome(idx int, t actors.Def, o actors.Outcome, err error) error {
	var ke coded
	var we actors.WireError
	switch {
	case o == actors.Failed && errors.As(err, &we) && we.Code != "":
		return &Error{Code: Code(we.Code), Lane: idx, Task: t.Name(), Message: we.Message}
	case o == actors.Panicked:
		// The cause is a *actors.PanicError: a short message, the lane's stack in a field.
		return &Error{Code: CodeTaskPanic, Lane: idx, Task: t.Name(), Cause: panicOf(actors.AsPanic(err))}
	case o == actors.Failed && errors.As(err, &ke):
		return errorOf(err)
	case o == actors.Failed:
		return &Error{Code: CodeTaskError, Lane: idx, Task: t.Name(), Cause: err}
	case (o == actors.BadInput || o == actors.BadOutput) && errors.As(err, &we):
		// The lane reports that the call's value could not cross (it did not decode or
		// encode there, or the result is over the size limit): the call fails, the lane is
		// sound. Only the codes of those cases are taken from the lane.
		code := CodeUnsupportedType
		if Code(we.Code) == CodePayloadTooLarge {
			code = CodePayloadTooLarge
		}
		return &Error{Code: code, Lane: idx, Task: t.Name(), Message: we.Message}
	}
	return nil
}

// brokeProtocol is the error of a call whose lane answered it with what cannot be.
func brokeProtocol(idx int, t actors.Def, err error) *Error {
	return &Error{Code: CodeWorkerCrashed, Lane: idx, Task: t.Name(), Message: "lane broke the protocol", Cause: err}
}

// reap drains results for callers that are not spinning: parked callers and futures. It
// sleeps on the completion doorbell only while someone needs it, so a caller that catches
// its own result costs the lane no wake-up.
func (l *lane) reap() {
	defer close(l.reaped)
	for !isClosed(l.Run().Ready()) { // boot: the lane rings the doorbell once ready
		select {
		case <-l.Settled():
			return
		default:
		}
		l.done.Wait(l.doneBell, 0)
		l.Run().Poll()
	}
	safety := time.NewTimer(reapSafety)
	defer safety.Stop()
	for {
		l.drain()
		select {
		case <-l.Settled():
			return
		default:
		}
		// Nobody waits, or a spinning caller (or a node's agent) drains: idle until kicked. Not
		// while the lane is stopping: a spinner drains every lane but notes only its own
		// lane's acknowledgement, so this reaper must wait for it on the doorbell.
		if l.State() != lifecycle.LaneStopping && (!l.needsReaper() && l.p.futures.Load() == 0 && !l.p.closing.Load() || l.p.spinning.Load() || l.agentDrains.Load()) {
			// The safety net drains, now and then, results nobody has asked for yet: those
			// of futures nobody waits on, or the last calls of a retiring lane.
			safety.Reset(reapSafety)
			l.idling.Store(true)
			select {
			case <-l.kick:
			case <-safety.C:
			case <-l.Settled():
				return
			}
			l.idling.Store(false)
			continue
		}
		// While results keep coming, drain them by polling (for every lane: one reaper
		// at a time does it for the whole pool); the doorbell only when they stop.
		if l.linger() {
			continue // results came: look again
		}
		l.done.Arm()
		if !l.ring.Waiting() {
			l.done.Wait(l.doneBell, 0)
		}
		l.done.Disarm()
		l.CheckAck()
	}
}

// linger polls every process lane's return ring for as long as results keep coming back
// sooner than the spin budget after the last one and calls are out, holding the pool's
// spinner token (so a busy pool settles its results without a doorbell on either side).
// It reports whether it settled any result: false when another goroutine spins already,
// spinning is off, or no result came within the budget (the reaper then sleeps on the
// doorbell instead of lingering again, which it would do for as long as the pool is
// closing).
func (l *lane) linger() (settled bool) {
	p := l.p
	budget := p.cfg.CallerSpin
	if budget <= 0 || p.cold.Cold(fastpath.Now()) || !p.spinning.CompareAndSwap(false, true) {
		return false
	}
	p.lingering.Store(true)
	var last time.Duration // when the last result came (0: none yet)
	polled := fastpath.Now()
	for i := 1; !p.handover.Load(); i++ {
		if p.drainAll() > 0 {
			last, settled = 0, true
		}
		if isClosed(l.Settled()) || p.futures.Load() == 0 && !l.needsReaper() {
			break // (Close waits for acknowledgements on the doorbell, not here)
		}
		spin.Pause()
		if i%64 != 0 {
			continue
		}
		l.CheckAck()
		if p.idle() {
			break // no call is out: no result can come, and the core is someone else's
		}
		now := fastpath.Now()
		if now-polled > fastpath.Descheduled {
			p.cold.Descheduled(now) // it lost its core: park, as help does
			break
		}
		if last == 0 {
			last = now
		} else if now-last > budget {
			break
		}
		runtime.Gosched()
		polled = fastpath.Now()
	}
	p.lingering.Store(false)
	p.spinning.Store(false)
	// Other reapers stood aside while this one lingered: wake them all while a future is
	// waited on, as help does when it stops (the future's call may be on any lane, and a
	// reaper that saw the token taken idles until kicked), else those whose lanes need a
	// reaper (their own kick may have come while the token was taken).
	if p.futures.Load() > 0 || p.closing.Load() {
		p.kickReapers()
		return settled
	}
	for i := range p.laneCount() {
		s := &p.slots[i]
		if o := s.cur.Load(); o != nil && o != l && o.needsReaper() {
			o.kickReaper()
		}
		if o := s.old.Load(); o != nil && o != l && o.needsReaper() {
			o.kickReaper()
		}
	}
	return settled
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// needReaper registers a caller that will block until the reaper settles its call.
// In-process lanes need none: they drain their own results.
func (l *lane) needReaper() {
	if l.reaper && l.waiters.Add(1) == 1 {
		l.kickReaper()
	}
}

// polling reports whether the lane is awake between calls, polling for the next
// (actors.Executor.SpinOne): a call published now needs no wake-up, and a quick one is
// answered within microseconds.
func (l *lane) polling() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return false
	}
	awake, woken := l.wake.Awake()
	return awake && !woken && !fastpath.Busy(l.Region().Running().Load())
}

// expectResults wakes the lane's reaper, if it sleeps on the completion doorbell, for
// calls just submitted that no caller of this process waits on (a node's: its host does):
// the reaper lingers for their results (linger) while the lane wakes and runs them,
// instead of being woken by the first result through the eventfd and the netpoller, which
// came after it (docs/benchmarks.md, "A sequential remote call, hop by hop").
func (l *lane) expectResults() { l.done.Signal(l.doneBell) }

// drained reports whether the lane's results wait on its return ring for a drainer (a
// process lane), rather than being settled by the lane itself.
func (l *lane) drained() bool { return l.reaper }

func (l *lane) crowded() {
	if l.reaper && l.inflight.Load() > fastpath.Slots {
		l.kickReaper()
	}
}

// needsReaper reports whether the lane's results must be drained without its callers' help:
// a caller waits for one, more calls are in flight than its return ring has slots (the lane
// stops at a full ring), or the lane is retiring (it ends once its calls have settled).
func (l *lane) needsReaper() bool {
	n := l.inflight.Load()
	if l.waiters.Load() > 0 || n > fastpath.Slots || n > 0 && l.State() == lifecycle.LaneRetiring {
		return true
	}
	// In a stealing pool any lane may answer a caller blocked on a call of the shared
	// ring, and a lane may hold more results than its return ring takes.
	sh := l.p.shared
	return sh != nil && (sh.waiters.Load() > 0 || sh.inflight.Load() > fastpath.Slots)
}

// reapSafety is how long an idle reaper sleeps before it drains its lane anyway.
const reapSafety = time.Second

// kickReaper wakes a reaper idling for want of waiters. A reaper asleep on the completion
// doorbell is armed already: the lane rings it with the next result.
func (l *lane) kickReaper() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *lane) doneWaiting() {
	if l.reaper {
		l.waiters.Add(-1)
	}
}

func (l *lane) wakeReaper() {
	if !l.reaper {
		return
	}
	l.kickReaper()
	l.doneBell.Wake(l.done.Word())
}

// CloseLocked implements lifecycle.Rings: the lane takes no more calls; mu is held. (A
// LocalLane's Admit refuses them already: the lane has ended.)
func (l *lane) CloseLocked() {
	if l.ring != nil {
		l.ring.CloseLocked()
	}
}

// Settle implements lifecycle.Rings: it fences the rings and settles what the lane held with
// e. release is false for a lane whose goroutine may still run (abandoned): its records are
// never reused.
func (l *lane) Settle(le *lifecycle.Error, release bool) {
	e := fromLifecycle(le)
	end := actors.LaneEnd{Owner: l.p.id, Lane: l.key, Release: release, Requeue: l.p.requeue, Err: laneEndError(l, e)}
	if x := l.local; x != nil {
		x.Seal()
		l.DebugTo(l.p.fastLog, "queue sealed", zap.Bool("release", release))
		end.Local = true
		if release { // the lane goroutine has ended: what it ran last is no longer written
			end.Running = x.Running()
			l.diedRunning.Store(end.Running != nil)
		}
	} else {
		l.ring.Fence(release)
		l.DebugTo(l.p.fastLog, "rings fenced", zap.Bool("results_drained", release))
		if release {
			word := l.Region().Running().Load()
			end.Started, end.Chunk = fastpath.Started(word), l.Region().Chunk().Load()
			l.diedRunning.Store(fastpath.Busy(word))
			// A lane runs its calls in order: what it had started is exact, unless its end
			// was inferred (a remote lane on a lost node).
			x, ok := l.Run().(interface{ Inferred() bool })
			end.Exact = !ok || !x.Inferred()
		}
	}
	held := 0
	for _, d := range l.p.defs {
		held += d.FailLane(end)
	}
	l.inflight.Add(int32(-held))
	if !release {
		// An abandoned lane's end (LetGo) may never come: ring a caller asleep on the direct
		// doorbell now, after its call has settled (or moved), as LetGo would.
		l.ringDirect()
	}
	if sh := l.p.shared; sh != nil {
		if !release {
			// An abandoned lane may still run its task: once that returns, the stop
			// request keeps it from journaling or claiming more.
			l.Region().Stop().Store(fastpath.StopAbandoned)
		}
		sh.recover(l, e, release)
	}
	l.p.callDone()
	fields := []zap.Field{zap.String("code", string(e.Code)), zap.String("reason", e.Message), zap.Int("calls_settled", held)}
	if len(e.Stack) > 0 { // the lane's account of its crash: never in Error(), logged here
		fields = append(fields, zap.Strings("stack", e.Stack))
	}
	if len(e.Stderr) > 0 {
		fields = append(fields, zap.Strings("stderr", e.Stderr))
	}
	l.Debug("lane ended", fields...)
}

// StopRequested implements lifecycle.Rings: an idle reaper waits for the acknowledgement
// from now on; a LocalLane waiting for calls looks at its stop word.
func (l *lane) StopRequested() {
	if l.local != nil {
		l.local.Nudge()
	}
	l.kickReaper()
}

// LetGo implements lifecycle.Rings: submitters still ringing the lane, the reaper and a
// caller waiting on the direct doorbell let go of the region. Its calls are settled
// (Settled is closed): the waiter, woken, finds its call settled or gone elsewhere and
// leaves, and one about to wait finds the doorbell no longer armed.
func (l *lane) LetGo() {
	if l.ring != nil {
		l.ring.Quiesce() // a submitter may still be ringing the lane for calls it published
	}
	l.wakeReaper()
	if l.ringDirect() {
		for l.direct.Load() {
			time.Sleep(10 * time.Microsecond)
		}
	}
	<-l.reaped
}

// ringDirect stores Signalled in the direct doorbell's arm word and wakes a caller asleep on
// it, once the lane's calls have settled; false when the lane has no direct doorbell. The
// region must still be mapped: before LetGo returns, or for an abandoned lane (never
// released).
func (l *lane) ringDirect() bool {
	w := l.directDone.Word()
	if !l.reaper || w == nil || l.directBell == nil {
		return false
	}
	w.Store(fastpath.ArmSignalled)
	l.directBell.Wake(w)
	return true
}

// directSafety bounds a caller's sleep on the direct doorbell: the lane rings it for every
// result while it is armed, so this only matters if that failed.
const directSafety = time.Second

// waitDirect waits for call c, the only call the lane holds, on the return ring's direct
// doorbell: the caller arms it, looks at the ring once more, and sleeps on the lane's
// direct bell until the lane, publishing a result, rings it; then it drains the ring
// itself. Parked through a reaper instead, a process lane's result went lane → eventfd →
// netpoller → reaper goroutine → channel → caller, a goroutine hand-off more and a wake-up
// of another thread by the Go scheduler on the way, each of which waits for a core on a
// loaded machine (docs/benchmarks.md). A process lane's bell is the futex itself; a remote
// lane's is a channel (its results are published by a goroutine of the host's): a caller
// asleep in a futex held its thread, so the forwarder it had just readied waited for the
// scheduler to take that thread's P back, and the publisher's futex wake cost a thread
// wake-up, about 25 µs each on the reference VM (docs/benchmarks.md). key is
// the call record's lane field: a call that leaves the lane (run again elsewhere after its
// death) is waited for as any other. False when it did not wait until c settled: another
// caller waits on the doorbell, the lane holds more calls (their callers need the reaper
// anyway), or c left the lane; the caller then waits through the reaper.
func (l *lane) waitDirect(c actors.Pender, key *atomic.Int32) bool {
	if !l.reaper || l.directBell == nil || l.inflight.Load() > 1 || l.direct.Load() || !l.direct.CompareAndSwap(false, true) {
		return false
	}
	d := l.directDone
	for c.Pending() && key.Load() == l.key {
		l.drain()
		if !c.Pending() {
			break
		}
		d.Arm() // a full barrier before looking again: see Completion
		// The ring after the arm, then the call: a result retired since was settled first.
		if !l.ring.Waiting() && c.Pending() && key.Load() == l.key && !isClosed(l.Settled()) {
			d.Wait(l.directBell, directSafety)
			stamp.S(stamp.CallerWoke)
		}
		d.Disarm()
		if isClosed(l.Settled()) {
			break
		}
	}
	l.direct.Store(false)
	return !c.Pending()
}

// corrupt kills a lane whose return ring broke the protocol, or abandons it if it cannot be
// killed.
func (l *lane) corrupt(err error) {
	l.DebugTo(l.p.fastLog, "return ring broke the protocol", zap.Error(err))
	if !l.Kill(lifecycle.Exit{Corrupt: err}) {
		l.Abandon(&lifecycle.Error{Code: lifecycle.CodeWorkerCrashed, Lane: l.Idx, Message: "corrupt return ring", Cause: err})
	}
}

// Open implements supervisor.Worker: the lane takes calls from now on. When the
// incarnation it follows has not ended, this one replaces it in a recycle: the recycled one
// stays findable (results, aborts, hard timeouts, Close's drain) until it has retired.
func (l *lane) Open() {
	s := &l.p.slots[l.Idx]
	if prev := s.cur.Load(); prev != nil && prev != l && !isClosed(prev.Settled()) {
		s.old.Store(prev)
	}
	s.cur.Store(l)
	if l.cid >= 0 { // a stealing pool's lane claims from now on, not before it counts as ready
		l.mu.Lock()
		if !l.Unmapped() {
			l.Region().Open().Store(1)
			l.wake.Force(l.laneBell)
		}
		l.mu.Unlock()
	}
	if l.local != nil && l.p.group != nil { // the same for a group's stealing (its region is heap)
		l.Region().Open().Store(1)
		l.local.Nudge()
	}
	l.p.obs.opened(l)
	l.p.signal()
}

// End implements supervisor.Worker (lifecycle.Lane gives it Ended and Stop).
func (l *lane) End() supervisor.End {
	e, normal := l.Outcome()
	end := supervisor.End{Err: e, Normal: normal}
	if e != nil {
		switch e.Code {
		case lifecycle.CodeThreadClosed, lifecycle.CodeStartupFailed, lifecycle.CodeWorkerUnresponsive, lifecycle.CodeNodeLost:
			// asked for, never started, frozen, or its node lost: not a call's doing
		default:
			end.Running = l.diedRunning.Load()
		}
	}
	return end
}
