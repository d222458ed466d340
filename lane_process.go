package knit

import (
	"os"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// openProcesses readies a pool of process lanes to start them: its runtime, launcher and
// spares. It sweeps what dead hosts left in /dev/shm first.
func (p *Pool) openProcesses() (lifecycle.Runtime, error) {
	cfg := p.cfg
	if err := p.openLimits(); err != nil {
		return nil, err
	}
	// The host watches its own resource limits, which any process of its user — an
	// unsandboxed lane — can lower, and raises them back (docs/process-lanes.md).
	var err error
	if p.hostLimits, err = lifecycle.WatchHostLimits(p.log); err != nil {
		p.log.Debug("the host's own limits are not watched", zap.Error(err))
	}
	p.sweepShm()
	p.procs = &lifecycle.Launcher{
		Command: cfg.Process.Command, Prefix: cfg.Process.Prefix, Env: cfg.Process.Env,
		Named: cfg.Process.SharedMemory == Named, StartupTimeout: cfg.StartupTimeout,
		Cgroups: p.limits.tree, Root: p.root, Log: p.laneLog,
		Killed: func(lane int, why lifecycle.Exit) { p.obs.killed(lane, "SIGKILL", killReason(why)) },
	}
	p.spares.Launcher, p.spares.Count, p.spares.Log = p.procs, cfg.Process.Spares, p.log
	if p.adaptiveSpares {
		p.spares.Max = min(max(cfg.Lanes, 1), maxSpares) // a burst of deaths finds spares ready
	}
	p.memory = cfg.Process.SharedMemory.String()
	return &lifecycle.Processes{
		Launcher: p.procs, Spares: &p.spares, Epoch: p.epoch.UnixNano(),
		Layout:         fastpath.Layout{Inline: cfg.Payload.Inline, Arena: cfg.Payload.Arena, AbortBits: fastpath.DefaultAbortBits},
		StartupTimeout: cfg.StartupTimeout, Liveness: cfg.Liveness, Limits: p.limitsExit,
	}, nil
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
		Version: fastpath.Version, Lane: uint32(l.Idx), Incarnation: uint32(l.Inc),
		MaxCall: cfg.Payload.MaxCall, Spin: int64(l.p.laneSpin(l.Idx)), SpinOne: int64(l.p.laneSpinOne(l.Idx)), Park: int64(parkSafetyNet),
		Beat:  int64(cfg.Liveness / beatsPerLiveness),
		Epoch: l.p.epoch.UnixNano(), Debug: l.p.laneDebug, PanicCrash: cfg.PanicCrashesLane,
		Carry: cfg.Propagator != nil, Timed: l.p.obs.timed() || l.p.pace != nil || cfg.node, // pace: notePace; a node's: packable
		Limits: l.p.limits.boot,
	}
	boot.Sandbox = laneSandbox(cfg)
	boot.Steal, boot.Consumer = l.cid >= 0, l.cid
	if boot.Steal {
		rc := l.p.shared.ring.Config()
		boot.StealRing = &rc // not the mapping's control block, which any lane can write
	}
	for _, d := range l.p.defs {
		boot.Tasks = append(boot.Tasks, lifecycle.BootTask{Name: d.Name(), Index: d.Index(), Fingerprint: d.Fingerprint()})
	}
	return boot
}

// raiseAbort sets a call's abort bit and rings the lane's abort doorbell, if the bit still
// belongs to the call and the region is still mapped.
func (l *lane) raiseAbort(bit int32, fn, id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.reaper || l.Unmapped() {
		return
	}
	l.ring.RaiseAbortLocked(bit, fn, id)
}

// running is the lane's running word (false: its region is gone).
func (l *lane) running() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return 0, false
	}
	return l.Region().Running().Load(), true
}

// since is when the lane says it started the call with a hard timeout it runs now
// (Region.Since; false: its region is gone).
func (l *lane) since() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return time.Time{}, false
	}
	return time.Unix(0, l.Region().Since().Load()), true
}

// AbortRaised implements actors.RingOwner: it rings the lane's abort doorbell; mu is held.
func (l *lane) AbortRaised() {
	l.Region().AbortWake().Add(1)
	_, _ = futex.Wake(l.Region().AbortWake(), 1)
}

// Main must be the first statement of main (and of TestMain in tests that use process
// lanes). In a process started as a lane it serves tasks and exits; in the host it returns
// at once.
func Main(opts ...MainOption) {
	if lifecycle.IsLane() {
		h := lifecycle.Hooks{DeadlineCause: ErrCallerDeadline, CanceledCause: ErrCallerCanceled}
		for _, o := range opts {
			o.applyMain(&h)
		}
		os.Exit(lifecycle.Serve(h))
	}
}

// A MainOption configures what Main gives the lanes of this binary.
type MainOption interface{ applyMain(*lifecycle.Hooks) }

type mainOption func(*lifecycle.Hooks)

func (o mainOption) applyMain(h *lifecycle.Hooks) { o(h) }

// WithPropagator makes lanes put the context values their callers' pools carry
// (Config.Propagator) into each task's context, e.g. propagation.TraceContext{}.
func WithPropagator(p propagation.TextMapPropagator) MainOption {
	return mainOption(func(h *lifecycle.Hooks) { h.Propagator = p })
}
