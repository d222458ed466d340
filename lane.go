package knit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// Lane states.
const (
	laneReady int32 = iota
	laneStopping
	laneEnded
	laneRetiring // takes no new call, finishes those it holds (recycle.go)
)

// lane is the host side of one lane: the host end of its rings (ring: the request ring and
// its backlog under mu, shared by every caller; the return ring, one drainer at a time:
// callers waiting for results and the lane's reaper goroutine take turns), and accounting.
type lane struct {
	p      *Pool
	idx    int
	inc    int   // incarnation: 0 for the first start, one more per restart
	key    int32 // names this incarnation in call records: inc·lanes + idx
	region *fastpath.Region

	mu    sync.Mutex
	state atomic.Int32
	ring  *actors.HostRing // the host end of its rings, which mu guards; set by start

	wake     *fastpath.Wake
	laneBell fastpath.Bell
	done     fastpath.Completion
	doneBell fastpath.Bell
	reaper   bool         // results are drained by a reaper goroutine (process lanes)
	waiters  atomic.Int32 // calls whose settlement is up to the reaper
	kick     chan struct{}

	inflight atomic.Int32
	claimed  atomic.Uint64 // results of calls it claimed from the shared ring
	cid      int           // its consumer id on the shared ring (-1: it does not claim)

	acked   chan struct{} // closed when a process lane has acknowledged its stop request
	ackOnce sync.Once
	ended   chan struct{} // closed once the lane has ended and its calls are settled
	endErr  *Error
	reaped  chan struct{}
	exitErr error // what the lane's goroutine returned

	calls int           // under mu: calls accepted, for MaxCallsPerLane
	idle  chan struct{} // a retiring lane's last call has settled (recycle.go)

	proc     *procLane // nil for goroutine lanes
	started  bool      // the lane's goroutine or process was started: it will end by itself
	unmapped bool      // under mu: the region is gone
	normal   bool      // it ended on its own with success; set before ended is closed
}

func newLane(p *Pool, idx, inc int) *lane {
	return &lane{
		p: p, idx: idx, inc: inc, key: laneKey(idx, inc), cid: -1,
		kick:   make(chan struct{}, 1),
		acked:  make(chan struct{}),
		ended:  make(chan struct{}),
		reaped: make(chan struct{}),
		idle:   make(chan struct{}, 1),
	}
}

// start starts the lane: a goroutine running the executor, or a process (see startProcess).
func (l *lane) start() error {
	if l.p.cfg.Runtime == Process {
		return l.startProcess()
	}
	cfg := l.p.cfg
	layout := fastpath.Layout{Inline: cfg.Payload.Inline, Arena: 64, AbortBits: 1}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, uint32(l.idx), uint32(l.inc), l.p.epoch.UnixNano())
	if err != nil {
		return err
	}
	l.region = region
	l.debugRegion("heap")
	l.ring = l.newRing()
	l.wake, l.laneBell = region.LaneWake(), fastpath.NewChanBell()
	l.done = region.Returns().Completion()
	close(l.reaped) // an in-process lane drains its own results: no reaper
	l.started = true
	exec := &actors.Executor{
		Region: l.region, Lane: l.laneBell, Host: l.ring, Corrupt: l.corrupt,
		Spin: cfg.LaneSpin, Local: true, Tasks: l.p.byIndex, Panic: cfg.PanicCrashesLane,
		Timed: l.p.obs.timed(),
	}
	if s := l.p.shared; s != nil {
		if exec.Steal, err = s.consumer(l); err != nil {
			return err
		}
	}
	go func() {
		returned := false
		defer func() {
			if !returned { // runtime.Goexit in a task
				l.exitErr = lifecycle.ErrGoexit
			}
			l.end()
		}()
		l.exitErr = exec.Run()
		returned = true
	}()
	l.debug("lane goroutine started")
	return nil
}

// debug logs msg at Debug in the lane namespace with the lane's identity.
func (l *lane) debug(msg string, fields ...zap.Field) { l.debugTo(l.p.laneLog, msg, fields...) }

// debugTo logs msg at Debug on log (a namespace logger) with the lane's identity. Not for
// the call path: the caller builds its fields even when the namespace is off.
func (l *lane) debugTo(log *zap.Logger, msg string, fields ...zap.Field) {
	if ce := logging.Debug(log, msg); ce != nil {
		ce.Write(append([]zap.Field{zap.Int("lane", l.idx), zap.Int("incarnation", l.inc)}, fields...)...)
	}
}

// debugRegion logs a new region's shape in the fastpath namespace.
func (l *lane) debugRegion(kind string) {
	layout := l.region.Layout()
	l.debugTo(l.p.fastLog, "region created", zap.String("memory", kind), zap.Int("bytes", layout.Size()),
		zap.Int("slots", fastpath.Slots), zap.Int("inline", layout.Inline), zap.Int("arena", layout.Arena),
		zap.Int("abort_bits", layout.AbortBits))
}

// newRing builds the host end of the lane's rings over its region. A process lane's calls
// get abort bits; a goroutine lane's are interrupted through their callers' contexts.
func (l *lane) newRing() *actors.HostRing {
	c := actors.RingConfig{Mu: &l.mu, Owner: l, Submit: &actors.LaneProducer{Producer: l.region.Requests().Producer()},
		Key: l.key, Backlog: l.p.cfg.Backlog, BlockWhenFull: l.p.cfg.BlockWhenFull,
		Returns: l.region.Returns().Consumer(), Tasks: l.p.byIndex, Settle: l, Remote: l.proc != nil}
	if l.proc != nil {
		c.Aborts = l.region.Aborts()
	}
	if sh := l.p.shared; sh != nil {
		c.Shared = sh.host
	}
	return actors.NewHostRing(c)
}

// submit publishes c on this lane, or queues it in the backlog. It fails when the lane is
// not ready (the caller picks another) or its backlog is full.
func (l *lane) submit(c actors.Call) (queued bool, err error) { return l.ring.Submit(&c) }

// Admit implements actors.RingOwner: a lane takes calls while it is ready.
func (l *lane) Admit() error {
	if l.state.Load() != laneReady {
		return errLaneGone
	}
	return nil
}

// Accept implements actors.RingOwner: it counts a call as held by this lane before it is
// published, so a lane that ends finds every call it held.
func (l *lane) Accept() {
	l.inflight.Add(1)
	if max := l.p.cfg.MaxCallsPerLane; max > 0 {
		l.countCall(max)
	}
}

// Published implements actors.RingOwner.
func (l *lane) Published() { l.wake.Ring(l.laneBell) }

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
	return settled
}

// Settle implements actors.Settler: the lane's accounting for a result the ring has
// checked, and the settling of its call.
func (l *lane) Settle(r actors.Result) error {
	var sh *shared
	if r.Shared { // a call the lane claimed from the shared ring
		sh = l.p.shared
	}
	// The lane counts as idle, and a claimed call as its own, before the caller wakes: a
	// balancer sees it free, and Stats read after the result count the call.
	if sh == nil && l.inflight.Add(-1) == 0 && l.state.Load() == laneRetiring {
		l.retireIdle()
	}
	if sh != nil {
		l.claimed.Add(1)
	}
	if err := r.Def.SettleResult(l.p.id, r.Key, r.ID, r.Gen, r.Outcome, r.Payload, l.proc == nil, r.Ran, l); err != nil {
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
			l.countCall(max)
			l.mu.Unlock()
		}
	}
	l.p.callDone()
	return nil
}

// Wrap implements actors.Wrapper: a lane's outcome as the caller's error.
func (l *lane) Wrap(t actors.Def, o actors.Outcome, err error) error {
	var ke *Error
	var we actors.WireError
	switch {
	case o == actors.Failed && errors.As(err, &we) && we.Code != "":
		return &Error{Code: Code(we.Code), Lane: l.idx, Task: t.Name(), Message: we.Message}
	case o == actors.Panicked:
		// The cause is a *actors.PanicError: a short message, the lane's stack in a field.
		return &Error{Code: CodeTaskPanic, Lane: l.idx, Task: t.Name(), Cause: actors.AsPanic(err)}
	case o == actors.Failed && errors.As(err, &ke):
		return err
	case o == actors.Failed:
		return &Error{Code: CodeTaskError, Lane: l.idx, Task: t.Name(), Cause: err}
	case (o == actors.BadInput || o == actors.BadOutput) && errors.As(err, &we):
		// The lane reports that the call's value could not cross (it did not decode or
		// encode there, or the result is over the size limit): the call fails, the lane is
		// sound. Only the codes of those cases are taken from the lane.
		code := CodeUnsupportedType
		if Code(we.Code) == CodePayloadTooLarge {
			code = CodePayloadTooLarge
		}
		return &Error{Code: code, Lane: l.idx, Task: t.Name(), Message: we.Message}
	}
	l.debugTo(l.p.codecLog, "payload did not decode", zap.String("task", t.Name()), zap.Stringer("outcome", o), zap.Error(err))
	return &Error{Code: CodeWorkerCrashed, Lane: l.idx, Task: t.Name(), Message: "lane broke the protocol", Cause: err}
}

// reap drains results for callers that are not spinning: parked callers and futures. It
// sleeps on the completion doorbell only while someone needs it, so a caller that catches
// its own result costs the lane no wake-up.
func (l *lane) reap() {
	defer close(l.reaped)
	for l.proc != nil && !l.isReady() { // boot: the lane rings the doorbell once ready
		select {
		case <-l.ended:
			return
		default:
		}
		l.done.Wait(l.doneBell, 0)
		l.checkReady()
	}
	safety := time.NewTimer(reapSafety)
	defer safety.Stop()
	for {
		l.drain()
		select {
		case <-l.ended:
			return
		default:
		}
		// Nobody waits, or a spinning caller drains for everyone: idle until kicked. Not
		// while the lane is stopping: a spinner drains every lane but notes only its own
		// lane's acknowledgement, so this reaper must wait for it on the doorbell.
		if l.state.Load() != laneStopping && (!l.needsReaper() && l.p.futures.Load() == 0 && !l.p.closing.Load() || l.p.spinning.Load()) {
			// The safety net drains, now and then, results nobody has asked for yet: those
			// of futures nobody waits on, or the last calls of a retiring lane.
			safety.Reset(reapSafety)
			select {
			case <-l.kick:
			case <-safety.C:
			case <-l.ended:
				return
			}
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
		l.checkAck()
	}
}

// checkAck notes a stopping lane's acknowledgement.
func (l *lane) checkAck() {
	if l.state.Load() == laneStopping && l.region.Stop().Load() == fastpath.StopAcknowledged {
		l.ackOnce.Do(func() { close(l.acked) })
	}
}

// linger polls every process lane's return ring for as long as results keep coming back
// sooner than the spin budget after the last one, holding the pool's spinner token (so a
// busy pool settles its results without a doorbell on either side). It reports whether it
// settled any result: false when another goroutine spins already, spinning is off, or no
// result came within the budget (the reaper then sleeps on the doorbell instead of
// lingering again, which it would do for as long as the pool is closing).
func (l *lane) linger() (settled bool) {
	p := l.p
	budget := p.cfg.CallerSpin
	if budget <= 0 || !p.spinning.CompareAndSwap(false, true) {
		return false
	}
	p.lingering.Store(true)
	var last time.Time
	for i := 1; !p.handover.Load(); i++ {
		if p.drainAll() > 0 {
			last, settled = time.Time{}, true
		}
		if isClosed(l.ended) || p.futures.Load() == 0 && !l.needsReaper() {
			break // (Close waits for acknowledgements on the doorbell, not here)
		}
		spin.Pause()
		if i%64 != 0 {
			continue
		}
		l.checkAck()
		now := time.Now()
		if last.IsZero() {
			last = now
		} else if now.Sub(last) > budget {
			break
		}
		yield()
	}
	p.lingering.Store(false)
	p.spinning.Store(false)
	// Other reapers stood aside while this one lingered: wake them all while a future is
	// waited on, as Help does when it stops (the future's call may be on any lane, and a
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

func (l *lane) isReady() bool {
	select {
	case <-l.proc.ready:
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

// needsReaper reports whether the lane's results must be drained without its callers' help:
// a caller waits for one, more calls are in flight than its return ring has slots (the lane
// stops at a full ring), or the lane is retiring (it ends once its calls have settled).
func (l *lane) drained() bool { return l.reaper }

func (l *lane) crowded() {
	if l.reaper && l.inflight.Load() > fastpath.Slots {
		l.kickReaper()
	}
}

func (l *lane) needsReaper() bool {
	n := l.inflight.Load()
	if l.waiters.Load() > 0 || n > fastpath.Slots || n > 0 && l.state.Load() == laneRetiring {
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

// end runs once the lane's goroutine has returned: it classifies the end, fences the
// rings and settles every call the lane held.
func (l *lane) end() {
	e, normal := lifecycle.ClassifyReturn(l.idx, l.state.Load() == laneStopping, l.exitErr)
	l.normal = normal
	l.close(e, true)
}

// close fences the lane and settles what it held with e. release is false for a lane whose
// goroutine may still run (abandoned): its records are never reused.
func (l *lane) close(e *Error, release bool) {
	l.mu.Lock()
	if l.state.Swap(laneEnded) == laneEnded {
		l.mu.Unlock()
		return
	}
	l.endErr = e
	l.ring.CloseLocked()
	l.mu.Unlock()
	l.ring.Fence(release)
	l.debugTo(l.p.fastLog, "rings fenced", zap.Bool("results_drained", release))
	end := actors.LaneEnd{Owner: l.p.id, Lane: l.key, Release: release, Requeue: l.p.requeue, Err: laneEndError(l, e)}
	if release {
		end.Started = fastpath.Started(l.region.Running().Load())
	}
	held := 0
	for _, d := range l.p.defs {
		held += d.FailLane(end)
	}
	l.inflight.Add(int32(-held))
	if sh := l.p.shared; sh != nil && l.started {
		if !release && l.proc == nil {
			// An abandoned goroutine may still run its task: once that returns, the stop
			// request keeps it from journaling or claiming more.
			l.region.Stop().Store(fastpath.StopAbandoned)
		}
		sh.recover(l, e, release)
	}
	l.p.callDone()
	l.debug("lane ended", zap.String("code", string(e.Code)), zap.String("reason", e.Message), zap.Int("calls_settled", held))
	close(l.ended)
}

// corrupt kills a lane whose return ring broke the protocol.
func (l *lane) corrupt(err error) {
	l.debugTo(l.p.fastLog, "return ring broke the protocol", zap.Error(err))
	if l.proc != nil {
		l.kill(lifecycle.Exit{Corrupt: err})
		return
	}
	l.close(&Error{Code: CodeWorkerCrashed, Lane: l.idx, Message: "corrupt return ring", Cause: err}, false)
}

// Ended implements supervisor.Worker: closed once the lane has ended, its calls are settled
// and, for a process lane, its process is reaped and its region unmapped.
func (l *lane) Ended() <-chan struct{} {
	if l.proc != nil {
		return l.proc.gone
	}
	return l.ended
}

// Open implements supervisor.Worker: the lane takes calls from now on. When the
// incarnation it follows has not ended, this one replaces it in a recycle: the recycled one
// stays findable (results, aborts, hard timeouts, Close's drain) until it has retired.
func (l *lane) Open() {
	s := &l.p.slots[l.idx]
	if prev := s.cur.Load(); prev != nil && prev != l && !isClosed(prev.ended) {
		s.old.Store(prev)
	}
	s.cur.Store(l)
	if l.cid >= 0 { // a stealing pool's lane claims from now on, not before it counts as ready
		l.mu.Lock()
		if !l.unmapped {
			l.region.Open().Store(1)
			l.wake.Force(l.laneBell)
		}
		l.mu.Unlock()
	}
	l.p.obs.opened(l)
	l.p.signal()
}

// End implements supervisor.Worker.
func (l *lane) End() supervisor.End { return supervisor.End{Err: l.endError(), Normal: l.normal} }

// Stop implements supervisor.Worker: the stop protocol, then the wait for Ended.
func (l *lane) Stop() bool {
	acked := l.stop()
	<-l.Ended()
	return acked
}
