package knit

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// procLane is what a process lane adds to a lane: its process (lifecycle.Process), its
// region and doorbell (lifecycle.Memory), and what the host learns about it.
type procLane struct {
	*lifecycle.Process
	mem   *lifecycle.Memory
	ready chan struct{} // closed once the lane has reported ready
	gone  chan struct{} // closed once its calls are settled and its region unmapped
	spare bool          // it was a spare: initialised already, it is ready within Liveness

	final fastpath.StatsSnapshot // counters at the end, once the region is unmapped
}

// startProcess creates the region and starts the lane process (lifecycle.Launcher). It
// returns once the process has started; ready is closed when it reports ready.
//
// The region is a sealed memfd in both shared-memory modes (lifecycle.Memory). With
// SharedMemory Named the lane inherits no descriptor: it collects the memfd and the eventfd
// from a rendezvous socket named in its boot record (shm.Rendezvous).
func (l *lane) startProcess() error {
	cfg := l.p.cfg
	layout := fastpath.Layout{Inline: cfg.Payload.Inline, Arena: cfg.Payload.Arena, AbortBits: fastpath.DefaultAbortBits}
	pl := &procLane{ready: make(chan struct{}), gone: make(chan struct{})}
	if l.idx == 0 && l.inc == 0 {
		l.p.sweepShm()
	}
	var err error
	if pl.mem, err = lifecycle.NewMemory(layout, uint32(l.idx), uint32(l.inc), l.p.epoch.UnixNano()); err != nil {
		return l.startErr("%v", err)
	}
	l.region = pl.mem.Region
	l.debugRegion(cfg.Process.SharedMemory.String())
	l.proc = pl
	l.ring = l.newRing()
	l.wake, l.done = l.region.LaneWake(), l.region.Returns().Completion()
	l.laneBell, l.doneBell = fastpath.FutexBell{}, pl.mem.DoneBell()
	l.reaper = true
	if s := l.p.shared; s != nil {
		l.cid = s.join(l)
	}
	files := append(pl.mem.Files(), l.stealFiles()...)

	// A restart takes a spare — a process that has exec'd and initialised already — when
	// one is waiting; a first start, or a restart with none, spawns. A spare receives its
	// descriptors on its socket, whatever the shared-memory mode. First starts never take
	// one: they start together, and a spare is only started once the pool is up. (Lanes
	// added by Resize, whose incarnation is 0 too, start once it is up.)
	if l.inc > 0 || l.p.up.Load() {
		if sp := l.p.spares.Take(); sp != nil {
			pid := sp.PID()
			if pl.Process, err = l.p.procs.Assign(sp, l.bootRecord(), files); err == nil {
				pl.spare = true
				l.debug("spare process assigned")
			} else {
				l.debug("spare process refused its assignment: spawning", zap.Int("pid", pid), zap.Error(err))
			}
			l.p.spares.Refill()
		}
	}
	if pl.Process == nil {
		if pl.Process, err = l.p.procs.Start(l.bootRecord(), files); err != nil {
			l.release()
			if s := l.p.shared; s != nil {
				s.leave(l)
			}
			return l.startErr("%v", err)
		}
	}
	l.started = true // from here on the lane ends through waitProcess
	l.debug("lane process started", zap.Int("pid", pl.PID()))
	go l.waitProcess()
	go l.reap()
	return nil
}

// openProcesses readies a pool of process lanes to start them: its launcher and its spares.
func (p *Pool) openProcesses() {
	cfg := p.cfg
	p.procs = &lifecycle.Launcher{
		Command: cfg.Process.Command, Prefix: cfg.Process.Prefix, Env: cfg.Process.Env,
		Named: cfg.Process.SharedMemory == Named, StartupTimeout: cfg.StartupTimeout,
		Cgroups: p.limits.tree, Root: p.root, Log: p.laneLog,
		Killed: func(lane int, why lifecycle.Exit) { p.obs.killed(lane, "SIGKILL", killReason(why)) },
	}
	p.spares.Launcher, p.spares.Count, p.spares.Log = p.procs, cfg.Process.Spares, p.log
}

// sweepShm removes what dead hosts left in /dev/shm (see SweepSharedMemory).
func (p *Pool) sweepShm() {
	removed, err := shm.Sweep()
	if len(removed) > 0 {
		p.log.Info("removed shared-memory names of dead hosts", zap.Strings("names", removed))
	}
	if err != nil {
		p.log.Debug("sweeping shared-memory names of dead hosts", zap.Error(err))
	}
}

// SweepSharedMemory removes the /dev/shm/knit-<pid>-… names that knit hosts which have died
// left behind, and returns them. A host names its rendezvous sockets (SharedMemory Named)
// that way and removes each as soon as its lane has connected, or when the lane ends; a host
// killed in between cannot. Every NewPool of process lanes sweeps first, so a later pool
// cleans up after a dead one; call this to clean up without starting a pool. It only
// removes names owned by this user whose pid names no living process (a pid reused since
// protects its dead host's names until it ends too).
func SweepSharedMemory() ([]string, error) { return shm.Sweep() }

func (l *lane) startErr(format string, args ...any) error {
	return &Error{Code: CodeStartupFailed, Lane: l.idx, Message: fmt.Sprintf(format, args...)}
}

// parkSafetyNet bounds a parked process lane's sleep. The doorbell protocol loses no wake,
// and the watchdog rings a parked lane that has calls waiting (ringStalled), so this only
// matters if both failed; every expiry costs an idle lane a wake-up and its runtime a burst
// of polling, which at 1 s was most of an idle pool's CPU (docs/benchmarks.md).
const parkSafetyNet = 10 * time.Second

// bootRecord is the lane's boot record (lifecycle.Launcher fills in Shm, the rendezvous
// where it collects its descriptors, if it has one).
func (l *lane) bootRecord() lifecycle.Boot {
	cfg := l.p.cfg
	boot := lifecycle.Boot{
		Version: fastpath.Version, Lane: uint32(l.idx), Incarnation: uint32(l.inc),
		MaxCall: cfg.Payload.MaxCall, Spin: int64(cfg.LaneSpin), Park: int64(parkSafetyNet),
		Beat:  int64(cfg.Liveness / beatsPerLiveness),
		Epoch: l.p.epoch.UnixNano(), Debug: l.p.laneDebug, PanicCrash: cfg.PanicCrashesLane,
		Carry: cfg.Propagator != nil, Timed: l.p.obs.timed(),
		Limits: l.p.limits.boot,
	}
	boot.Sandbox = laneSandbox(cfg)
	boot.Steal, boot.Consumer = l.cid >= 0, l.cid
	for _, d := range l.p.defs {
		boot.Tasks = append(boot.Tasks, lifecycle.BootTask{Name: d.Name(), Index: d.Index(), Fingerprint: d.Fingerprint()})
	}
	return boot
}

// awaitReady waits for the lane to report ready, to exit, or for the startup timeout.
func (l *lane) awaitReady() error {
	timeout := l.p.cfg.StartupTimeout
	if l.proc.spare && l.p.cfg.Liveness > 0 {
		timeout = min(timeout, l.p.cfg.Liveness)
	}
	if l.proc.AwaitReady(l.proc.ready, l.ended, timeout) {
		return nil
	}
	return l.endError()
}

// stopping is the stop protocol's escalation for the lane (lifecycle.Stop): a process lane's
// process group is signalled; a goroutine lane is abandoned, its rings fenced and its calls
// settled.
func (l *lane) stopping() lifecycle.Stop {
	cfg := l.p.cfg
	s := lifecycle.Stop{AckTimeout: cfg.StopAckTimeout, KillGrace: cfg.KillGrace, Acked: l.acked, Ended: l.ended,
		Debug:    l.debug,
		TimedOut: func() { l.p.obs.stopTimedOut(l.idx) },
		Killed:   func(signal, reason string) { l.p.obs.killed(l.idx, signal, reason) },
		Abandon: func() {
			l.close(&Error{Code: CodeThreadClosed, Lane: l.idx, Message: "lane did not acknowledge its stop request; abandoned"}, false)
		},
	}
	if l.proc != nil {
		s.Signal = l.proc.Signal
	}
	return s
}

// kill ends the lane's whole process group; why says what the host will report.
func (l *lane) kill(why lifecycle.Exit) { l.proc.Kill(why) }

// waitProcess waits for the lane process to end, classifies the end, and settles every
// call the lane held. The region is unmapped only after the process has exited and the
// reaper has let go of it.
func (l *lane) waitProcess() {
	pl := l.proc
	x := pl.Wait()
	x.Lane = l.idx
	x.Stopping = l.state.Load() == laneStopping
	// Ready is what the host saw (the reaper closed ready), not the boot word now: a lane
	// may have rewritten that, or the whole region, before it went.
	select {
	case <-pl.ready:
		x.Ready = true
	default:
	}
	if !x.Ready {
		x.Fatal = l.region.Fatal()
	}
	pl.Collect(&x) // its cgroup goes, with every process left in it
	l.limitsExit(&x)
	l.debug("lane process reaped", zap.Int("pid", pl.PID()), zap.Int("status", x.Status), zap.Stringer("signal", x.Signal))
	e := lifecycle.Classify(x)
	l.normal = e.Code == CodeWorkerExited && x.Status == 0
	l.close(e, true)
	l.wakeReaper()
	<-l.reaped
	pl.final = l.region.Stats().Snapshot()
	l.release()
	close(pl.gone)
}

// release unmaps the region and closes the doorbell.
func (l *lane) release() {
	pl := l.proc
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unmapped = true
	pl.mem.Close()
}

// ready reports, from the reaper, whether the lane has booted; it closes proc.ready once.
func (l *lane) checkReady() {
	select {
	case <-l.proc.ready:
	default:
		if l.region.Boot().Load() == fastpath.BootReady {
			close(l.proc.ready)
		}
	}
}

// endError is the lane's classified end, once ended is closed.
func (l *lane) endError() *Error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endErr
}

// raiseAbort sets a call's abort bit and rings the lane's abort doorbell, if the bit still
// belongs to the call and the region is still mapped.
func (l *lane) raiseAbort(bit int32, fn, id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil || l.unmapped {
		return
	}
	l.ring.RaiseAbortLocked(bit, fn, id)
}

// AbortRaised implements actors.RingOwner: it rings the lane's abort doorbell; mu is held.
func (l *lane) AbortRaised() {
	l.region.AbortWake().Add(1)
	_, _ = futex.Wake(l.region.AbortWake(), 1)
}

// stealFiles is the shared ring's memfd, for a lane that claims from it.
func (l *lane) stealFiles() []*os.File {
	if l.cid < 0 {
		return nil
	}
	return []*os.File{l.p.shared.mp.File()}
}
