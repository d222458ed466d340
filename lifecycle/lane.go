package lifecycle

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
)

// Lane states.
const (
	LaneReady int32 = iota
	LaneStopping
	LaneEnded
	LaneRetiring // takes no new call, finishes those it holds
)

// A Lane is the life of one lane incarnation as its host sees it: it opens the incarnation
// on a Runtime and starts it, waits for it to be ready, runs the stop protocol (request,
// acknowledgement timeout, then SIGTERM and SIGKILL or abandonment) and, when the
// incarnation ends, has the host end of the lane's rings settle every call the lane held
// and releases its memory. It reaches the pool only through Rings and its LaneConfig.
//
// A pool embeds a Lane in its own lane type, which is the Rings; Init ties the two.
type Lane struct {
	Idx int // the lane's place in its pool
	Inc int // its incarnation: 0 for the first start, one more per restart or recycle

	cfg   LaneConfig
	rings Rings
	state atomic.Int32

	run    Incarnation
	region *fastpath.Region

	acked    chan struct{} // closed once the lane has acknowledged its stop request
	ackOnce  sync.Once
	settled  chan struct{} // closed once the lane has ended and every call it held is settled
	gone     chan struct{} // closed once its memory is released too (or it is abandoned)
	goneOnce sync.Once
	endErr   *Error // under mu
	normal   bool   // it ended on its own with success; set before settled is closed
	started  bool   // its incarnation was started: it will end by itself
	unmapped bool   // under mu: the region is gone
	final    fastpath.StatsSnapshot
}

// Rings is the host end of a lane's rings, as the lane's life drives it.
type Rings interface {
	// CloseLocked makes the rings take no more calls; the lane's mutex is held.
	CloseLocked()
	// Settle fences the rings and settles every call the lane held with e. release is false
	// for an abandoned lane, which may still run: its records are never reused.
	Settle(e *Error, release bool)
	// StopRequested: the lane was asked to stop; whoever drains its results watches for its
	// acknowledgement from now on (CheckAck).
	StopRequested()
	// LetGo returns once nothing of the host reads the lane's region any more.
	LetGo()
}

// LaneConfig is what a Lane needs from its pool.
type LaneConfig struct {
	Runtime Runtime
	// Mu guards the lane's rings; the lane takes it for its state changes and to release
	// its region.
	Mu                        *sync.Mutex
	StopAckTimeout, KillGrace time.Duration
	Log                       *zap.Logger // the lane namespace
	// StopTimedOut and Killed, when set, count a stop not acknowledged in time and a signal
	// sent, with its reason (the pool's metrics).
	StopTimedOut func()
	Killed       func(signal, reason string)
}

// Init makes l lane idx's incarnation inc, driving rings.
func (l *Lane) Init(idx, inc int, cfg LaneConfig, rings Rings) {
	l.Idx, l.Inc, l.cfg, l.rings = idx, inc, cfg, rings
	l.acked, l.settled, l.gone = make(chan struct{}), make(chan struct{}), make(chan struct{})
}

// OpenRegion makes the incarnation's memory on the runtime; nothing runs yet.
func (l *Lane) OpenRegion() error {
	run, err := l.cfg.Runtime.Open(l.Idx, l.Inc)
	if err != nil {
		return l.StartErr("%v", err)
	}
	l.run, l.region = run, run.Region()
	return nil
}

// Run is what runs the incarnation; Region its region (both set by OpenRegion).
func (l *Lane) Run() Incarnation         { return l.run }
func (l *Lane) Region() *fastpath.Region { return l.region }

// Start starts the incarnation with x; Start fills in x's End, Stopping and Debug. On an
// error nothing runs and the region is released.
func (l *Lane) Start(x Launch) error {
	x.End, x.Debug = l.end, l.Debug
	x.Stopping = func() bool { return l.state.Load() == LaneStopping }
	l.started = true // from here on the lane ends through end
	if err := l.run.Start(x); err != nil {
		l.started = false
		l.release()
		return l.StartErr("%v", err)
	}
	return nil
}

// AwaitReady waits for the incarnation to be ready, or for its end, or for the startup
// timeout (which kills it); it returns the lane's end when it did not become ready.
func (l *Lane) AwaitReady() error {
	if l.run.AwaitReady(l.settled) {
		return nil
	}
	<-l.gone
	return l.EndError()
}

// State is the lane's state (LaneReady, ...).
func (l *Lane) State() int32 { return l.state.Load() }

// Retiring makes a ready lane retiring: it takes no new call (the caller holds Mu).
func (l *Lane) Retiring() {
	if l.state.Load() == LaneReady {
		l.state.Store(LaneRetiring)
	}
}

// Unmapped reports whether the region is gone (the caller holds Mu).
func (l *Lane) Unmapped() bool { return l.unmapped }

// Settled is closed once the lane has ended and every call it held is settled; Ended once
// its memory is released too (a process lane's process reaped by then), or it is abandoned.
func (l *Lane) Settled() <-chan struct{} { return l.settled }
func (l *Lane) Ended() <-chan struct{}   { return l.gone }

// Outcome is how the lane ended, once Ended is closed: its classified end, and whether it
// ended on its own with success.
func (l *Lane) Outcome() (*Error, bool) { return l.EndError(), l.normal }

// EndError is the lane's classified end, once Settled is closed.
func (l *Lane) EndError() *Error {
	l.cfg.Mu.Lock()
	defer l.cfg.Mu.Unlock()
	return l.endErr
}

// Counters are the region's counters, or those it had when it was released.
func (l *Lane) Counters() fastpath.StatsSnapshot {
	l.cfg.Mu.Lock()
	defer l.cfg.Mu.Unlock()
	switch {
	case l.unmapped:
		return l.final
	case l.region != nil:
		return l.region.Stats().Snapshot()
	}
	return fastpath.StatsSnapshot{}
}

// PID is the incarnation's process (0: none).
func (l *Lane) PID() int { return l.run.PID() }

// Kill ends the incarnation (a process lane's whole process group); why says what the host
// will report. It reports false for an incarnation that cannot be killed (a goroutine).
func (l *Lane) Kill(why Exit) bool { return l.run.Kill(why) }

// Abandon ends a lane whose incarnation cannot be killed and may still run, settling its
// calls with e.
func (l *Lane) Abandon(e *Error) { l.close(e, false) }

// CheckAck notes a stopping lane's acknowledgement, which the lane writes into its region.
// Whoever drains the lane's results calls it.
func (l *Lane) CheckAck() {
	if l.state.Load() == LaneStopping && l.region.Stop().Load() == fastpath.StopAcknowledged {
		l.ackOnce.Do(func() { close(l.acked) })
	}
}

// Stop runs the stop protocol — request, acknowledgement timeout, then SIGTERM and SIGKILL
// for a process, abandonment for a goroutine — and returns once the lane has ended. It
// reports whether the lane acknowledged (or ended) in time.
func (l *Lane) Stop() bool {
	mu := l.cfg.Mu
	mu.Lock()
	if l.state.Load() == LaneEnded || !l.started {
		l.state.Store(LaneEnded)
		mu.Unlock()
		<-l.endedOrNever()
		return true
	}
	l.state.Store(LaneStopping)
	l.region.Stop().Store(fastpath.StopRequested)
	l.region.LaneWake().Force(l.run.LaneBell())
	mu.Unlock()
	l.rings.StopRequested()
	l.Debug("stop requested")
	acked := Stop{AckTimeout: l.cfg.StopAckTimeout, KillGrace: l.cfg.KillGrace, Acked: l.acked, Ended: l.settled,
		Debug: l.Debug, Signal: l.run.Signal(), TimedOut: l.cfg.StopTimedOut, Killed: l.cfg.Killed,
		Abandon: func() {
			l.close(&Error{Code: CodeThreadClosed, Lane: l.Idx, Message: "lane did not acknowledge its stop request; abandoned"}, false)
		},
	}.Run()
	<-l.gone
	return acked
}

// endedOrNever is Ended for a lane that started, and a closed channel for one that never
// did (it has nothing to wait for).
func (l *Lane) endedOrNever() <-chan struct{} {
	if l.started {
		return l.gone
	}
	return closedChan
}

// end runs once the incarnation has ended (Launch.End): the rings are fenced and every call
// the lane held is settled, and the region is released once the host has let go of it.
func (l *Lane) end(e *Error, normal bool) {
	l.normal = normal
	l.close(e, true)
	l.rings.LetGo()
	l.release()
	l.goneOnce.Do(func() { close(l.gone) })
}

// close ends the lane with e, once: the rings take no more, and they settle what the lane
// held. release is false for a lane that may still run (abandoned).
func (l *Lane) close(e *Error, release bool) {
	l.cfg.Mu.Lock()
	if l.state.Swap(LaneEnded) == LaneEnded {
		l.cfg.Mu.Unlock()
		return
	}
	l.endErr = e
	l.rings.CloseLocked()
	l.cfg.Mu.Unlock()
	l.rings.Settle(e, release)
	close(l.settled)
	if !release { // abandoned: its end may never come
		l.goneOnce.Do(func() { close(l.gone) })
	}
}

// release releases the region (a process lane's mapping and doorbell) once nothing reads it.
func (l *Lane) release() {
	l.cfg.Mu.Lock()
	defer l.cfg.Mu.Unlock()
	l.final = l.region.Stats().Snapshot()
	l.unmapped = true
	l.run.Close()
}

// StartErr is a STARTUP_FAILED error of this lane.
func (l *Lane) StartErr(format string, args ...any) error {
	return &Error{Code: CodeStartupFailed, Lane: l.Idx, Message: fmt.Sprintf(format, args...)}
}

// Debug logs msg at Debug in the lane namespace with the lane's identity. Not for the call
// path: the caller builds its fields even when the namespace is off.
func (l *Lane) Debug(msg string, fields ...zap.Field) { l.DebugTo(l.cfg.Log, msg, fields...) }

// DebugTo is Debug on another namespace's logger.
func (l *Lane) DebugTo(log *zap.Logger, msg string, fields ...zap.Field) {
	if ce := logging.Debug(log, msg); ce != nil {
		ce.Write(append([]zap.Field{zap.Int("lane", l.Idx), zap.Int("incarnation", l.Inc)}, fields...)...)
	}
}
