package knit

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
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

// call is a call waiting in a lane's backlog for a free slot.
type call struct {
	def         actors.Def
	id, gen     uint32
	lane, abort *atomic.Int32   // the record's lane and abort-bit fields, set by the lane that takes it
	seq         *atomic.Uint64  // the record's sequence number, set when it is published
	payload     []byte          // the encoded input (process lanes)
	done        <-chan struct{} // the caller's context's Done (nil: it cannot end); a process lane gives such a call an abort bit
	deadline    int64           // the caller's deadline in Unix nanoseconds, 0 for none (process lanes)
}

// lane is the host side of one lane: the producer of its request ring (under mu, shared by
// every caller), the consumer of its return ring (one drainer at a time: callers waiting
// for results and the lane's reaper goroutine take turns), the backlog, and accounting.
type lane struct {
	p      *Pool
	idx    int
	inc    int   // incarnation: 0 for the first start, one more per restart
	key    int32 // names this incarnation in call records: inc·lanes + idx
	region *fastpath.Region

	mu      sync.Mutex
	state   atomic.Int32
	req     *fastpath.Producer
	backlog []call // FIFO ring of calls beyond the 32 slots
	head, n int
	seq     uint64        // the sequence number of the last call published (the lane runs them in order)
	space   chan struct{} // closed when the backlog frees room (BlockWhenFull)
	queued  atomic.Int32  // len(backlog), readable without mu

	ret      *fastpath.Consumer
	draining atomic.Bool
	fenced   atomic.Bool // the return ring is never read again

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
		backlog: make([]call, p.cfg.Backlog),
		kick:    make(chan struct{}, 1),
		acked:   make(chan struct{}),
		ended:   make(chan struct{}),
		reaped:  make(chan struct{}),
		space:   make(chan struct{}),
		idle:    make(chan struct{}, 1),
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
	l.req, l.ret = region.Requests().Producer(), region.Returns().Consumer()
	l.wake, l.laneBell = region.LaneWake(), fastpath.NewChanBell()
	l.done = region.Returns().Completion()
	close(l.reaped) // an in-process lane drains its own results: no reaper
	l.started = true
	exec := &actors.Executor{
		Region: l.region, Lane: l.laneBell, Drain: func() { l.drain() },
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

// submit publishes c on this lane, or queues it in the backlog. It fails when the lane is
// not ready (the caller picks another) or its backlog is full.
func (l *lane) submit(c call) (queued bool, err error) {
	l.mu.Lock()
	if l.state.Load() != laneReady {
		l.mu.Unlock()
		return false, errLaneGone
	}
	if l.n == 0 {
		if slot, ok := l.req.Reserve(); ok {
			l.accept(&c)
			if l.publish(slot, c) {
				l.req.Flush()
				l.mu.Unlock()
				l.wake.Ring(l.laneBell)
				return false, nil
			}
			l.enqueue(c)
			l.mu.Unlock()
			return true, nil
		}
	}
	if l.n == len(l.backlog) {
		space := l.space
		l.mu.Unlock()
		return false, &backlogFull{space: space}
	}
	l.accept(&c)
	l.enqueue(c)
	// The lane may have retired its slots and drained its last result between our failed
	// Reserve and the enqueue, and then found no backlog to flush: look again now.
	// (enqueue's store of queued and Reserve's load of the consumer word pair with the
	// lane's Retire and its load of queued in drain.)
	l.flushLocked()
	l.mu.Unlock()
	l.wake.Ring(l.laneBell)
	return true, nil
}

// enqueue appends an accepted call to the backlog. Called with mu held.
func (l *lane) enqueue(c call) {
	c.seq.Store(0) // not published: it has not started, whatever it carried before
	l.backlog[(l.head+l.n)%len(l.backlog)] = c
	l.n++
	l.queued.Swap(int32(l.n)) // a full barrier before the flush's reload of the consumer word
}

// accept counts c as held by this lane; called with mu held, before c is published, so a
// lane that ends finds every call it held.
func (l *lane) accept(c *call) {
	c.lane.Store(l.key)
	if l.proc != nil {
		bit := int32(-1)
		if c.done != nil {
			bit = l.proc.aborts.alloc(c.def.Index(), c.id)
			select {
			case <-c.done:
				// The caller gave up while the call looked for a lane (a Go future's
				// context, or a call run again after its lane died): its expiry may have
				// looked for the call on no lane or another one, so raise the bit here, or
				// the task would run on until its lane dies.
				l.raiseAbortLocked(bit)
			default:
			}
		}
		c.abort.Store(bit)
	}
	l.inflight.Add(1)
	if max := l.p.cfg.MaxCallsPerLane; max > 0 {
		l.countCall(max)
	}
}

var errLaneGone = errors.New("lane not ready")

// backlogFull carries the channel that is closed when the backlog has room again.
type backlogFull struct{ space chan struct{} }

func (*backlogFull) Error() string { return "backlog full" }

// publish writes c into a reserved slot and stages it (the caller flushes); false means the
// arena has no room for its payload now (the slot is given back and c waits in the
// backlog). Goroutine lanes carry no payload: the value stays on the call's record. Called
// with mu held.
func (l *lane) publish(slot int, c call) bool {
	buf, err := l.req.Put(slot, len(c.payload))
	if err != nil {
		l.req.Release(slot)
		return false
	}
	copy(buf, c.payload)
	s := l.req.Slot(slot)
	s.SetFn(c.def.Index())
	s.SetCall(c.id, c.gen)
	s.SetAbort(uint32(c.abort.Load() + 1))
	l.seq++
	s.SetSeq(l.seq)
	s.SetDeadline(c.deadline)
	c.seq.Store(l.seq)
	l.req.Stage(slot)
	return true
}

// flush moves backlog calls into free slots.
func (l *lane) flush() {
	l.mu.Lock()
	moved := l.flushLocked()
	l.mu.Unlock()
	if moved {
		l.wake.Ring(l.laneBell)
	}
}

// flushLocked moves backlog calls, oldest first, into free slots; mu is held. It reports
// whether it moved any.
func (l *lane) flushLocked() bool {
	moved := 0
	for l.n > 0 {
		slot, ok := l.req.Reserve()
		if !ok || !l.publish(slot, l.backlog[l.head]) {
			break
		}
		l.backlog[l.head] = call{}
		l.head = (l.head + 1) % len(l.backlog)
		l.n--
		moved++
	}
	l.req.Flush() // one store for the whole burst
	l.queued.Store(int32(l.n))
	if moved > 0 && l.p.cfg.BlockWhenFull {
		close(l.space)
		l.space = make(chan struct{})
	}
	return moved > 0
}

// drain settles every result waiting on the return ring, unless someone else is draining.
// It looks at the ring only while it holds draining: close takes it before fencing the
// rings, so a drainer never touches a region that is being unmapped. A goroutine lane's
// region is never unmapped: after letting go, drain looks again there, so that a result
// published while it held the lock, whose producer found the lock taken, is still drained.
// (A process lane's results are found by the reaper or a spinning caller, which loop.)
func (l *lane) drain() (settled int) {
	for {
		if !l.draining.CompareAndSwap(false, true) {
			return settled
		}
		if l.fenced.Load() {
			l.draining.Store(false)
			return settled
		}
		pending := l.ret.Poll()
		if pending == 0 {
			l.draining.Store(false)
			if l.proc != nil || l.ret.Peek() == 0 {
				return settled
			}
			continue
		}
		settled += bits.OnesCount32(pending)
		if l.proc != nil {
			// A result from another process is caused by a request we published under mu,
			// but Go's memory model (and the race detector, which does not track mapped
			// memory) cannot see through that process: taking mu orders what callers wrote
			// before publishing (their call records) before what we read now.
			l.mu.Lock()
			//lint:ignore SA2001 the empty critical section is the point
			l.mu.Unlock()
		}
		var bad error
		for m := pending; m != 0; {
			i := l.ret.Next(m)
			m &^= 1 << i
			if err := l.settle(i); err != nil {
				bad = err
				break
			}
		}
		l.ret.Retire(pending)
		l.draining.Store(false)
		if bad != nil {
			l.corrupt(bad)
			return settled
		}
		if l.queued.Load() > 0 {
			l.flush()
		}
		if sh := l.p.shared; sh != nil && sh.queued.Load() > 0 {
			sh.flush()
		}
		if l.proc != nil || l.ret.Peek() == 0 {
			return settled
		}
	}
}

func (l *lane) settle(i int) error {
	s := l.ret.Slot(i)
	fn := s.Fn()
	if int(fn) >= len(l.p.byIndex) || l.p.byIndex[fn] == nil {
		return fmt.Errorf("%w: result for function %d", fastpath.ErrCorrupt, fn)
	}
	flags := s.Flags()
	key, sh := l.key, (*shared)(nil)
	if flags&actors.SharedResult != 0 { // a call the lane claimed from the shared ring
		if sh = l.p.shared; sh == nil {
			return fmt.Errorf("%w: %w", fastpath.ErrCorrupt, errNotShared)
		}
		key = sharedKey
	}
	o := actors.Outcome(flags &^ actors.SharedResult)
	payload, err := l.ret.Payload(i)
	if err != nil {
		return err
	}
	if bit := int32(s.Abort()) - 1; bit >= 0 && l.proc != nil {
		if sh != nil {
			err = sh.freeAbort(bit, fn, s.Call())
		} else {
			err = l.freeAbort(bit, fn, s.Call())
		}
		if err != nil {
			return err
		}
	}
	// The lane counts as idle before the caller wakes, so a balancer sees it free.
	if sh == nil && l.inflight.Add(-1) == 0 && l.state.Load() == laneRetiring {
		l.retireIdle()
	}
	if err := l.p.byIndex[fn].SettleResult(l.p.id, key, s.Call(), s.Gen(), o, payload, l.proc == nil, s.Seq(), l); err != nil {
		if sh == nil {
			l.inflight.Add(1)
		}
		return fmt.Errorf("%w: %v", fastpath.ErrCorrupt, err)
	}
	if sh != nil {
		sh.settled()
		l.claimed.Add(1)
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
		if l.ret.Peek() == 0 {
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
	l.n, l.head = 0, 0
	l.queued.Store(0)
	close(l.space)
	l.mu.Unlock()
	for !l.draining.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	if release { // the lane is gone: what it published before it ended still counts
		pending := l.ret.Poll()
		for m := pending; m != 0; {
			i := l.ret.Next(m)
			m &^= 1 << i
			if l.settle(i) != nil {
				break
			}
		}
		l.ret.Retire(pending)
	}
	l.fenced.Store(true)
	l.draining.Store(false)
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
