package knit

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit/internal/cgroup"
	"github.com/knitgo/knit/lifecycle"
)

// Limits bound each lane process's resources (ProcessConfig.Limits). A zero field sets no
// limit; core dumps are off unless CoreDumps is set. docs/process-lanes.md, "Limits and
// cgroups", says what each one protects against and what it does not.
//
// Where the host can make cgroups (CgroupAuto with a limit set, or CgroupRequired), each
// lane process runs in a cgroup of its own, which enforces Memory, Processes and CPUs and is
// killed whole when the lane ends, descendants included. Otherwise the lane applies
// rlimits to itself in knit.Main before it serves, and CPUs cannot be enforced. Stats.Limits
// says which mechanism is in force.
type Limits struct {
	// Memory is the most memory a lane may use, in bytes. A cgroup enforces it (v2
	// memory.max with no swap, v1 memory.limit_in_bytes and memsw) for the lane and its
	// descendants; without one, RLIMIT_DATA on the lane process (not RLIMIT_AS: an idle Go
	// lane reserves 1.6-1.8 GB of address space). Either way the lane's Go runtime gets a
	// soft limit an eighth below (debug.SetMemoryLimit; lifecycle.GoMemoryLimit), so that
	// its GC works before the hard limit (it replaces a GOMEMLIMIT in Process.Env). A lane
	// past it ends WORKER_OUT_OF_MEMORY. (RLIMIT_DATA lets one allocation larger than what is
	// left be mapped: docs/process-lanes.md, "Limits and cgroups"; a cgroup has no such gap.)
	Memory int64
	// CPUTime is the CPU time a lane process may use over its life (RLIMIT_CPU, in whole
	// seconds, rounded up): a lane that uses it up ends WORKER_CPU_LIMIT and is restarted.
	// It bounds runaway computation per lane, not per call (HardTimeout does that).
	CPUTime time.Duration
	// CPUs caps a lane's CPU bandwidth, in cores (0.5: half a core), with cgroup cpu.max (v1
	// cpu.cfs_quota_us): a lane over it is throttled, not ended. Only a cgroup can enforce
	// it; without one it is not enforced, and NewPool logs so.
	CPUs float64
	// OpenFiles bounds a lane's open descriptors (RLIMIT_NOFILE). A task that opens past it
	// gets EMFILE ("too many open files") as an error of its own; the lane serves on. A lane
	// needs about 10 descriptors for itself.
	OpenFiles int
	// Processes bounds the processes and threads of a lane and its descendants: a cgroup's
	// pids.max. Without a cgroup it becomes RLIMIT_NPROC, which counts every process and
	// thread of the lane's user (not just the lane's), and which root ignores. A Go lane
	// runs about ten threads of its own.
	Processes int
	// CoreDumps lets a crashing lane dump core. Default: RLIMIT_CORE 0. A sandboxed lane
	// (ProcessConfig.Sandbox) is not dumpable and dumps no core either way.
	CoreDumps bool
	// Cgroup says whether lanes get cgroups (default CgroupAuto).
	Cgroup CgroupMode
	// CgroupParent is the cgroup under which the pool makes its own (knit-<pid>-<pool>), as
	// a path inside the hierarchy; it must exist. Default: the host's own cgroup. On cgroup v2 the parent
	// must hold no process to give its children controllers, so a host in a non-root cgroup
	// with processes (a systemd service, a container) needs a delegated one, e.g. a
	// subdirectory of a unit with Delegate=yes.
	CgroupParent string
}

// CgroupMode says whether lane processes get cgroups of their own.
type CgroupMode int

// Cgroup modes.
const (
	// CgroupAuto: a cgroup per lane process when a limit is set and the host can make one;
	// otherwise rlimits, logged once when the pool starts.
	CgroupAuto CgroupMode = iota
	// CgroupOff: never; the lanes apply rlimits only.
	CgroupOff
	// CgroupRequired: a cgroup per lane process even with no limit set (it still kills a
	// lane's descendants with it); NewPool fails where the host cannot make one.
	CgroupRequired
)

func (m CgroupMode) String() string {
	switch m {
	case CgroupAuto:
		return "auto"
	case CgroupOff:
		return "off"
	case CgroupRequired:
		return "required"
	}
	return fmt.Sprintf("CgroupMode(%d)", int(m))
}

// LimitMechanism names what enforces a pool's limits (Stats.Limits).
type LimitMechanism string

// Limit mechanisms.
const (
	LimitsNone     LimitMechanism = ""          // goroutine lanes: nothing
	LimitsRlimits  LimitMechanism = "rlimits"   // each lane applies rlimits to itself
	LimitsCgroupV1 LimitMechanism = "cgroup v1" // a cgroup v1 per lane process, plus rlimits for the rest
	LimitsCgroupV2 LimitMechanism = "cgroup v2" // a cgroup v2 per lane process, plus rlimits for the rest
)

// cpuPeriod is the cgroup CPU bandwidth period, in microseconds (the kernel's default).
const cpuPeriod = 100000

// poolLimits is what a pool of process lanes enforces, and how.
type poolLimits struct {
	mechanism LimitMechanism
	tree      *lifecycle.Cgroups    // nil: no cgroups
	boot      *lifecycle.BootLimits // what each lane applies to itself
	memory    int64                 // for classification messages
	cpu       time.Duration         // the CPU-time limit as applied (whole seconds)
}

// zero reports whether l sets no limit (CoreDumps and the cgroup fields aside).
func (l Limits) zero() bool {
	return l.Memory == 0 && l.CPUTime == 0 && l.CPUs == 0 && l.OpenFiles == 0 && l.Processes == 0
}

func (l Limits) check() error {
	switch {
	case l.Memory < 0:
		return fmt.Errorf("Memory %d is negative (0 means no limit)", l.Memory)
	case l.CPUTime < 0:
		return fmt.Errorf("CPUTime %v is negative (0 means no limit)", l.CPUTime)
	case l.CPUs < 0 || l.CPUs != l.CPUs:
		return fmt.Errorf("CPUs %v is not a positive number of cores (0 means no limit)", l.CPUs)
	case l.CPUs > 0 && l.CPUs*cpuPeriod < 1000:
		return fmt.Errorf("CPUs %v is below the kernel's least bandwidth, 0.01", l.CPUs)
	case l.OpenFiles < 0:
		return fmt.Errorf("OpenFiles %d is negative (0 means no limit)", l.OpenFiles)
	case l.Processes < 0:
		return fmt.Errorf("Processes %d is negative (0 means no limit)", l.Processes)
	case l.Cgroup < CgroupAuto || l.Cgroup > CgroupRequired:
		return fmt.Errorf("Cgroup mode %d unknown", l.Cgroup)
	}
	return nil
}

// openLimits decides how a pool of process lanes enforces its limits: it makes the pool's
// cgroup where it should and can, and the boot limits each lane applies to itself.
func (p *Pool) openLimits() error {
	l := p.cfg.Process.Limits
	pl := &p.limits
	pl.mechanism, pl.memory = LimitsRlimits, l.Memory
	// By default every lane gets a cgroup, limits or not: it is what kills a lane's
	// descendants with it, setsid ones too (docs/process-lanes.md, "Limits and cgroups").
	if l.Cgroup != CgroupOff {
		p.sweepCgroups()
		name := fmt.Sprintf("knit-%d-%d", os.Getpid(), p.id)
		tree, err := lifecycle.OpenCgroups(name, l.CgroupParent, lifecycle.CgroupLimits{
			Memory: l.Memory, Pids: int64(l.Processes), CPUQuota: int64(l.CPUs * cpuPeriod), CPUPeriod: cpuPeriod,
		})
		switch {
		case err == nil:
			pl.tree = tree
			pl.mechanism = LimitMechanism(tree.Version())
			lvl := zapcore.InfoLevel
			if l.zero() { // the default: news only to whoever looks at Debug
				lvl = zapcore.DebugLevel
			}
			p.log.Log(lvl, "process lanes run in cgroups of their own", zap.String("mechanism", string(pl.mechanism)),
				zap.String("cgroup", name))
		case l.Cgroup == CgroupRequired:
			return &Error{Code: CodePoolUnavailable, Lane: -1, Message: "ProcessConfig.Limits.Cgroup is CgroupRequired", Cause: err}
		case l.zero():
			p.log.Info("process lanes: no cgroup; a lane's descendants that leave its process group outlive it", zap.Error(err))
		default:
			lost := ""
			if l.CPUs > 0 {
				lost = "; CPUs is not enforced"
			}
			p.log.Warn("process lanes: no cgroup; their limits are rlimits only"+lost+", and a lane's descendants outside its process group outlive it",
				zap.Error(err))
		}
	}
	b := &lifecycle.BootLimits{Version: lifecycle.LimitsVersion, Core: l.CoreDumps,
		CPU: lifecycle.CPUSeconds(l.CPUTime), Files: int64(l.OpenFiles)}
	pl.cpu = time.Duration(b.CPU) * time.Second
	if l.Memory > 0 {
		b.GoMemory = lifecycle.GoMemoryLimit(l.Memory)
		if pl.tree == nil {
			b.Data = l.Memory
		}
	}
	if l.Processes > 0 && pl.tree == nil {
		b.Procs = int64(l.Processes)
	}
	pl.boot = b
	return nil
}

// sweepCgroups removes the cgroups that dead hosts left (see cgroup.Sweep).
func (p *Pool) sweepCgroups() {
	removed, err := cgroup.Sweep(cgroup.Options{Parent: p.cfg.Process.Limits.CgroupParent})
	if len(removed) > 0 {
		p.log.Info("removed the cgroups of dead hosts", zap.Strings("cgroups", removed))
	}
	if err != nil {
		p.log.Debug("sweeping the cgroups of dead hosts", zap.Error(err))
	}
}

// closeLimits removes the pool's cgroups, killing whatever still runs in them (a lane's
// descendants, escapees into cgroups a lane made beneath its own). What it could not end or
// remove is the error, which Close returns.
func (p *Pool) closeLimits() error {
	if t := p.limits.tree; t != nil {
		if err := t.Close(); err != nil {
			p.log.Warn("removing the pool's cgroups", zap.Error(err))
			return &Error{Code: CodeThreadClosed, Lane: -1, Message: "the pool's cgroups could not all be ended and removed", Cause: err}
		}
	}
	return nil
}

// limitsExit adds to a lane process's Exit the limits it ran under. The process has been
// waited for (lifecycle.Process.Collect added what the kernel says about them).
func (p *Pool) limitsExit(x *lifecycle.Exit) {
	x.MemoryLimit, x.CPULimit = p.limits.memory, p.limits.cpu
	if b := p.limits.boot; b != nil {
		x.DataLimited = b.Data > 0 && b.Procs == 0 && p.cfg.Process.Limits.Processes == 0
	}
}
