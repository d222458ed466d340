package knit

import (
	"github.com/knitgo/knit/internal/pool"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// The public types of a pool are defined in internal/pool, the implementation behind this
// package, and named here; their fields and methods are documented there.

// Pool runs tasks on lanes. Make one with NewPool; it is safe for concurrent use.
type Pool = pool.Pool

// Task is a typed task definition made by Define.
type Task[In, Out any] = pool.Task[In, Out]

// Future is the pending result of a call started with Task.Go. It settles once, whatever
// happens to the lane that runs the call; its methods may be used from many goroutines.
// Settling it belongs to knit: a Future has no method that could.
type Future[Out any] = pool.Future[Out]

// Definition is a task that NewPool accepts: a *Task of any type.
type Definition = pool.Definition

// NewPool starts a pool serving tasks: its supervision tree boots every lane, in parallel,
// and NewPool returns once all are ready, or with the first startup error.
func NewPool(cfg Config, tasks ...Definition) (*Pool, error) { return pool.New(cfg, tasks...) }

// SweepSharedMemory removes the /dev/shm/knit-<pid>-… names that knit hosts which have died
// left behind, and returns them. A host names its rendezvous sockets (SharedMemory Named)
// that way and removes each as soon as its lane has connected, or when the lane ends; a host
// killed in between cannot. Every NewPool of process lanes sweeps first, so a later pool
// cleans up after a dead one; call this to clean up without starting a pool. It only
// removes names owned by this user whose pid names no living process (a pid reused since
// protects its dead host's names until it ends too).
func SweepSharedMemory() ([]string, error) { return pool.SweepSharedMemory() }

// Runtime says what a lane is.
type Runtime = pool.Runtime

// Runtimes.
const (
	Goroutine = pool.Goroutine // a goroutine in the host process (default)
	Process   = pool.Process   // a child OS process of the same binary, or Config.Process.Command
)

// Balancer picks the lane for a call.
type Balancer = pool.Balancer

// Balancers.
const (
	// LeastLoaded sends a call to the first lane with nothing in flight, else to the lane
	// holding the fewest calls (default). One call at a time keeps going to lane 0, whose
	// side stays awake while the others park; under load it spreads calls by queue depth, so
	// a slow or stuck lane gets fewer.
	LeastLoaded       = pool.LeastLoaded
	RoundRobin        = pool.RoundRobin        // each call to the next live lane
	FirstIdle         = pool.FirstIdle         // the first lane with nothing in flight, else round-robin
	Random            = pool.Random            // a live lane at random
	FirstIdleOrRandom = pool.FirstIdleOrRandom // the first idle lane, else a random one
)

// Steal says whether a pool's idle lanes take calls from one shared submit ring (work
// stealing) and which claim discipline they use (docs/stealing.md). While that ring is
// empty, a stealing pool gives a call straight to an idle lane, as LeastLoaded would.
type Steal = pool.Steal

// Steal modes.
const (
	// StealAuto (the default) is knit's choice: in pools of 2 to 31 lanes whose Balancer
	// is the default, goroutine lanes steal with StealLocal; process lanes keep private
	// lanes for now (docs/stealing.md, "The default"). Other pools use private lanes.
	StealAuto = pool.StealAuto
	// StealOff sends every call to one lane's private ring, chosen by the Balancer.
	StealOff = pool.StealOff
	// StealTicket: lanes claim batches by advancing a 64-bit ticket head with CAS.
	StealTicket = pool.StealTicket
	// StealDekker: lanes claim regions of the ring, announcing themselves in WANT words.
	StealDekker = pool.StealDekker
	// StealLocal (goroutine lanes only): a lane with nothing to run takes the calls waiting
	// on a busy lane's own queue, with no slot ring and no claim journal.
	StealLocal = pool.StealLocal
)

// Payload sets the sizes of the fast path.
type Payload = pool.Payload

// Config configures a pool. The zero value is a pool of GOMAXPROCS goroutine lanes.
type Config = pool.Config

// Restart is a pool's supervision policy (see the supervisor package).
type Restart = supervisor.Policy

// Backoff spaces restarts: exponential from Min to Max (CrashLoopMax for a lane in crash-loop
// backoff) with Jitter, reset after a quiet period.
type Backoff = supervisor.Backoff

// IntensityAction says what becomes of a lane that exceeds its restart intensity.
type IntensityAction = supervisor.IntensityAction

// Intensity actions (Restart.OnIntensity).
const (
	CrashLoop = supervisor.CrashLoop // keep restarting, ever more slowly, up to Backoff.CrashLoopMax (default)
	GiveUp    = supervisor.GiveUp    // give the lane up (dead); with none left the pool fails, as in OTP
)

// RestartType says which ends of a lane bring it back.
type RestartType = supervisor.RestartType

// Restart types, as in OTP.
const (
	Transient = supervisor.Transient // restart after a crash or a non-zero exit (default)
	Permanent = supervisor.Permanent // restart after any end the host did not ask for
	Temporary = supervisor.Temporary // never restart
)

// Strategy says which lanes restart together.
type Strategy = supervisor.Strategy

// Strategies, as in OTP.
const (
	OneForOne  = supervisor.OneForOne  // only the lane that failed (default)
	AllForOne  = supervisor.AllForOne  // every lane
	RestForOne = supervisor.RestForOne // the lane that failed and the lanes after it
)

// Event is one lifecycle transition of a lane (Lane -1: the pool).
type Event = supervisor.Event

// State is where a lane is in its life.
type State = supervisor.State

// States.
const (
	StateBooting          = supervisor.Booting
	StateReady            = supervisor.Ready
	StateStopping         = supervisor.Stopping
	StateClosed           = supervisor.Closed
	StateCrashed          = supervisor.Crashed
	StateExited           = supervisor.Exited
	StateStartupFailed    = supervisor.StartupFailed
	StateRestarting       = supervisor.Restarting
	StateCrashLoopBackoff = supervisor.CrashLoopBackoff // restarting after Event.Delay, past the restart intensity
	StateDead             = supervisor.Dead
	StateFailed           = supervisor.Failed    // the pool: no lane is left
	StateNew              = supervisor.New       // before a lane's first boot
	StateRecycling        = supervisor.Recycling // a planned replacement (MaxCallsPerLane, MaxLaneMemory); Reason says why
	StateRetiring         = supervisor.Retiring  // removed by Resize: finishing its calls
	StateRemoved          = supervisor.Removed   // gone from the pool (Resize)
)

// PoolFailed is the message Config.Parent receives when the pool has failed.
type PoolFailed = supervisor.PoolFailed

// SharedMemoryMode says how a process lane receives its region.
type SharedMemoryMode = pool.SharedMemoryMode

// Shared-memory modes.
const (
	Inherit = pool.Inherit // the sealed memfd passed as an inherited descriptor (default)
	Named   = pool.Named   // the sealed memfd handed over on a named 0600 socket, removed once used
)

// ProcessConfig configures process lanes.
type ProcessConfig = pool.ProcessConfig

// NumberedEvent is a lifecycle event and its number in the pool's log of recent events.
type NumberedEvent = pool.NumberedEvent

// Limits bound each lane process's resources (ProcessConfig.Limits). A zero field sets no
// limit; core dumps are off unless CoreDumps is set. docs/process-lanes.md, "Limits and
// cgroups", says what each one protects against and what it does not.
//
// Where the host can make cgroups (CgroupAuto with a limit set, or CgroupRequired), each
// lane process runs in a cgroup of its own, which enforces Memory, Processes and CPUs and is
// killed whole when the lane ends, descendants included. Otherwise the lane applies
// rlimits to itself in knit.Main before it serves, and CPUs cannot be enforced. Stats.Limits
// says which mechanism is in force.
type Limits = pool.Limits

// CgroupMode says whether lane processes get cgroups of their own.
type CgroupMode = pool.CgroupMode

// Cgroup modes.
const (
	// CgroupAuto: a cgroup per lane process when a limit is set and the host can make one;
	// otherwise rlimits, logged once when the pool starts.
	CgroupAuto = pool.CgroupAuto
	// CgroupOff: never; the lanes apply rlimits only.
	CgroupOff = pool.CgroupOff
	// CgroupRequired: a cgroup per lane process even with no limit set (it still kills a
	// lane's descendants with it); NewPool fails where the host cannot make one.
	CgroupRequired = pool.CgroupRequired
)

// LimitMechanism names what enforces a pool's limits (Stats.Limits).
type LimitMechanism = pool.LimitMechanism

// Limit mechanisms.
const (
	LimitsNone     = pool.LimitsNone     // goroutine lanes: nothing
	LimitsRlimits  = pool.LimitsRlimits  // each lane applies rlimits to itself
	LimitsCgroupV1 = pool.LimitsCgroupV1 // a cgroup v1 per lane process, plus rlimits for the rest
	LimitsCgroupV2 = pool.LimitsCgroupV2 // a cgroup v2 per lane process, plus rlimits for the rest
)

// TaskStats describes the recent latency of one task's calls, from submission to settlement
// (time in the backlog counts), over the last one to two LatencyWindow periods: quantiles
// are read from a log-linear histogram, within ±3.2 % of the true value; Max is exact.
type TaskStats = pool.TaskStats

// LaneStats describes one lane.
type LaneStats = pool.LaneStats

// Stats describes a pool.
type Stats = pool.Stats

// Sandbox confines process lanes (ProcessConfig.Sandbox): a Landlock policy and a seccomp
// preset, each off, best effort or required. docs/process-lanes.md, "Containing untrusted
// or crashy code", says what each layer stops and what it does not.
type Sandbox = lifecycle.Sandbox

// Landlock is the filesystem and network policy of a Sandbox.
type Landlock = lifecycle.Landlock

// Seccomp is the system-call preset of a Sandbox.
type Seccomp = lifecycle.Seccomp

// SandboxMode says whether a sandbox layer applies and what happens when the kernel lacks it.
type SandboxMode = lifecycle.SandboxMode

// Sandbox modes.
const (
	// SandboxOff applies nothing (the default).
	SandboxOff = lifecycle.SandboxOff
	// SandboxBestEffort applies what the kernel supports and logs the rest once.
	SandboxBestEffort = lifecycle.SandboxBestEffort
	// SandboxRequired fails a lane that cannot apply the whole layer with
	// WORKER_STARTUP_FAILED, saying why.
	SandboxRequired = lifecycle.SandboxRequired
)
