package knit

import (
	"fmt"
	"runtime"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/lifecycle"
)

// Balancer picks the lane for a call.
type Balancer int

// Balancers.
const (
	// LeastLoaded sends a call to the first lane with nothing in flight, else to the lane
	// holding the fewest calls (default). One call at a time keeps going to lane 0, whose
	// side stays awake while the others park; under load it spreads calls by queue depth, so
	// a slow or stuck lane gets fewer. In a process pool with the default LaneSpin, the
	// lanes that spin take a quick task's calls first, the least loaded of them, each up to
	// what it runs in about 40 µs, or 1024 calls of a task that runs under 1 µs (the caller
	// sets the pace then, not the lane), before a parked lane is given one: a parked lane
	// costs a wake-up per batch it is given. A task is quick once its lanes have reported
	// calls that run under 40 µs; the calls of other tasks are spread by queue depth from
	// the first, so that none waits behind a slow one while a lane parks.
	LeastLoaded       Balancer = iota
	RoundRobin                 // each call to the next live lane
	FirstIdle                  // the first lane with nothing in flight, else round-robin
	Random                     // a live lane at random
	FirstIdleOrRandom          // the first idle lane, else a random one
)

// Steal says whether a pool's idle lanes take calls from one shared submit ring (work
// stealing) and which claim discipline they use (docs/stealing.md). While that ring is
// empty, a stealing pool gives a call straight to an idle lane, as LeastLoaded would.
type Steal int

// Steal modes.
const (
	// StealAuto (the default) is knit's choice: in pools of 2 to 31 lanes whose Balancer
	// is the default, goroutine lanes steal with StealLocal; process lanes keep private
	// lanes for now (docs/stealing.md, "The default"). Other pools use private lanes.
	StealAuto Steal = iota
	// StealOff sends every call to one lane's private ring, chosen by the Balancer.
	StealOff
	// StealTicket: lanes claim batches by advancing a 64-bit ticket head with CAS.
	StealTicket
	// StealDekker: lanes claim regions of the ring, announcing themselves in WANT words.
	StealDekker
	// StealLocal (goroutine lanes only): each lane keeps its own queue, chosen by the
	// balancer, and a lane with nothing to run takes the calls waiting on a busy lane; no
	// slot ring, no claim journal (docs/stealing.md, "Goroutine lanes: stealing stacks").
	StealLocal
)

func (s Steal) String() string {
	switch s {
	case StealAuto:
		return "auto"
	case StealOff:
		return "off"
	case StealTicket:
		return "ticket"
	case StealDekker:
		return "dekker"
	case StealLocal:
		return "local"
	}
	return fmt.Sprintf("Steal(%d)", int(s))
}

// Payload sets the sizes of the fast path.
type Payload struct {
	Inline  int // bytes carried inside a slot; a multiple of 64 up to 64 KiB (default 512)
	Arena   int // payload arena per direction and lane; a multiple of 64 up to 1 GiB (default 4 MiB)
	MaxCall int // largest encoded value a call may carry (default, and at most: the arena size)
}

// Config configures a pool. The zero value is a pool of GOMAXPROCS goroutine lanes. NewPool
// refuses, with an INVALID_ARGUMENT *Error naming the field, a value outside the bounds its
// doc gives, an unknown enum value, and a negative count where none is documented.
type Config struct {
	// Name names the pool in its logs (field "pool"), its metrics (attribute knit.pool:
	// pools that share a MeterProvider need names of their own) and the inspector (default
	// "knit-pool-<pid>-<n>", unique in the process).
	Name string
	// Lanes is the number of lanes, 1 to 1024 (default runtime.GOMAXPROCS(0)).
	Lanes int
	// Runtime is Goroutine (default), Process or Remote.
	Runtime Runtime
	// Balancer picks a lane per call (default LeastLoaded).
	Balancer Balancer
	// Backlog bounds the calls a lane holds beyond its 32 slots, at most 65536; each lane
	// allocates its backlog up front (default 4096).
	Backlog int
	// BlockWhenFull makes a call wait, within its context, for room in a full backlog;
	// by default it fails at once with ErrOverloaded.
	BlockWhenFull bool
	// LaneSpin is how long an idle lane polls for work before parking, at most 1s. Zero:
	// the runtime's default — none for goroutine lanes (a parked goroutine lane is woken
	// through the Go scheduler on the caller's own core, which on small machines beats a
	// spinner on another core: docs/benchmarks.md), 50µs for process lanes, of which only the
	// lowest GOMAXPROCS−1 spin (a spinner needs a core of its own, and the callers one). A
	// spinner never yields its core: one that loses it while it spins (the machine is busy)
	// parks at once for a while. Negative: none.
	LaneSpin time.Duration
	// CallerSpin is how long a caller polls for its result before parking, at most 1s.
	// Zero: the runtime's default, as for LaneSpin; negative: none.
	CallerSpin time.Duration
	// Payload sets the fast path's sizes.
	Payload Payload
	// PanicCrashesLane makes a panicking task crash its lane instead of failing only its
	// call with ErrTaskPanic.
	PanicCrashesLane bool
	// Restart is the supervision policy: which lane ends bring a lane back, which lanes
	// restart together, how often and how soon. The zero value restarts a crashed lane on
	// its own (Transient, OneForOne) after 1ms, 2ms, 4ms … 2s; a lane that restarts more
	// than 5 times in 10s is in crash-loop backoff (restarts doubling up to 1min, logged at
	// Error) until one incarnation serves for 10s. OnIntensity: GiveUp gives such a lane up
	// instead, as OTP does.
	Restart Restart
	// FailFast makes a call fail at once with ErrPoolUnavailable when no lane is ready and
	// every lane is in crash-loop backoff (or dead); by default it waits, within its
	// context, for a lane to come back. Calls still wait for lanes on an ordinary restart.
	FailFast bool
	// StopAckTimeout, KillGrace and StartupTimeout are at most 24h; zero or negative takes
	// the default.
	//
	// StopAckTimeout is how long a lane has to acknowledge its stop request before it is
	// killed (process) or abandoned (goroutine) (default 50ms).
	StopAckTimeout time.Duration
	// KillGrace is how long a process lane that ignored its stop request has between
	// SIGTERM and SIGKILL (default 1s).
	KillGrace time.Duration
	// StartupTimeout bounds a process lane's boot, from spawn to ready (default 10s).
	StartupTimeout time.Duration
	// Liveness bounds how long a process lane may stop without ending — frozen by SIGSTOP,
	// its runtime stuck, its doorbells gone — before the host notices: the lane's runtime
	// bumps a heartbeat whatever its tasks do, and a lane whose heartbeat stands still for
	// Liveness is killed (WORKER_UNRESPONSIVE) and restarted. An idle lane (parked for a
	// beat with nothing to do, outside a stealing pool) pauses its heartbeat until it wakes:
	// one that froze while idle is killed once a call has waited Liveness for it, and the
	// call runs on its next incarnation. At the same interval the host
	// looks at every return ring, so that a lost doorbell cannot strand results (default
	// 3s; negative: no watchdog; otherwise 10ms to 24h).
	Liveness time.Duration
	// MoveQueuedAfter is how long a process lane's call may run before the calls queued
	// behind it on that lane move to other lanes, which take them sooner, at most 24h
	// (default 100ms; negative: they wait). A call that has started never moves, and a lane
	// that has run one call that long gets no new calls until it is done with it. Nothing
	// moves while every lane is in that state; a call then goes to the lane whose long call
	// began last. Goroutine lanes steal instead (Steal).
	MoveQueuedAfter time.Duration
	// Propagator carries values of each caller's context into process lanes — with
	// propagation.TraceContext{}, a trace goes on in the task — when the lane binary's
	// knit.Main has the same propagator (WithPropagator). Default: none; with one, each call
	// to a process lane costs an Inject and a few small allocations. (Goroutine lanes run
	// tasks under the caller's own context.)
	Propagator propagation.TextMapPropagator
	// Process configures process lanes.
	Process ProcessConfig
	// Remote configures remote lanes (Runtime: Remote): the nodes they run on, and TLS.
	Remote RemoteConfig
	// Logger receives knit's logs and the output of process lanes; it decides their levels
	// (process lanes log Debug entries if it takes them). Default: Info and above to stderr,
	// plus Debug for the namespaces KNIT_DEBUG names (lifecycle, fastpath, steal,
	// supervisor, codec, lane, or *); docs/lifecycle.md lists what each one logs.
	Logger *zap.Logger
	// ActorSystem runs the pool's supervision tree in an existing protoactor system, where
	// application actors can watch Pool.PID. Default: a system of the pool's own.
	ActorSystem *actor.ActorSystem
	// Parent, if set, is sent a *PoolFailed message when the supervisor has given up every
	// lane (a lane is given up when its RestartType does not restart it, or past its
	// intensity under OnIntensity: GiveUp).
	Parent *actor.PID
	// OnEvent is called with every lifecycle transition, in order, from the supervisor's
	// goroutines. It must not block and must not call Close.
	OnEvent func(Event)
	// EventBuffer is the capacity of the channel Pool.Events returns, at most 65536
	// (default 1024); events
	// that find it full are dropped and counted in Stats.DroppedEvents. OnEvent drops none.
	EventBuffer int
	// MeterProvider receives the pool's OpenTelemetry metrics (docs/operating.md lists the
	// instruments). Default: none, which costs calls nothing; the application chooses the
	// SDK and exporter.
	MeterProvider metric.MeterProvider
	// LatencyWindow, if positive, has Stats.Tasks give each task's latency quantiles over
	// the last one to two periods of LatencyWindow (30*time.Second is a good start). It
	// costs each task 5 KB and each call two monotonic clock reads (as a MeterProvider that
	// records does; with both, the reads are shared) and an atomic add. Default: none; at
	// most 24h.
	LatencyWindow time.Duration
	// MaxCallsPerLane recycles a lane incarnation once it has taken this many calls (zero:
	// never), goroutine and process lanes alike: its replacement boots while it serves on
	// (a process lane's from a spare), takes its place once ready, and then the recycled
	// incarnation finishes the calls it holds and stops. It is a trigger, not a cap: a lane
	// takes the calls that reach it while its replacement boots. Each element of a Map
	// counts as a call, on every runtime. docs/lifecycle.md.
	MaxCallsPerLane int
	// Steal has idle lanes take calls waiting for a busy one: from a shared submit ring
	// (StealTicket, StealDekker), or from one another's queues (StealLocal, goroutine lanes),
	// so that no call waits behind a busy lane while another lane is free. Each lane still
	// answers on its own return ring, and when a lane dies the calls it had claimed settle
	// exactly as on private lanes (docs/stealing.md). Default StealAuto: see there.
	Steal Steal

	// test is how knit's own tests build a pool beyond what a Config says
	// (export_test.go); the zero value is the pool everyone else gets.
	test testBuild
	// node: the pool is a node's, for one host's lanes (ServeNode): no supervision tree and
	// no lane at the start; the node starts and stops lanes as the host asks (node.go).
	node bool
	// spinOne: how long a lane whose calls come one at a time polls for the next
	// (actors.Executor.SpinOne); a node's lanes, by default (NodeConfig.LaneSpin).
	spinOne time.Duration
}

// testBuild changes how a pool is built, for knit's own tests and benchmarks.
type testBuild struct {
	unsupervised bool // the lanes run with no supervision tree
	noMonitor    bool // no monitor at all: the call path as it was before metrics
	ticketWidth  int  // Ticket's claim width (0: ticketWidth)
}

// SharedMemoryMode says how a process lane receives its region.
type SharedMemoryMode int

// Shared-memory modes.
const (
	Inherit SharedMemoryMode = iota // the sealed memfd passed as an inherited descriptor (default)
	Named                           // the sealed memfd handed over on a named 0600 socket, removed once used
)

func (m SharedMemoryMode) String() string {
	if m == Named {
		return "named"
	}
	return "inherit"
}

// ProcessConfig configures process lanes.
type ProcessConfig struct {
	// Command is the lane binary and its arguments; its main must call knit.Main first
	// and define the same tasks. Default: this executable (os.Executable), no arguments.
	Command []string
	// Prefix wraps the command, e.g. {"nice", "-n", "10"}, {"prlimit", "--data=1000000000"}
	// (1 GB of heap: a lane beyond it crashes with "out of memory") or a bwrap invocation.
	// Limit memory with --data, not --as: an idle Go lane reserves 1.6–1.8 GB of address
	// space, so --as below about 2 GB fails every lane at boot (docs/process-lanes.md).
	// Limits does this, and more, without a wrapper.
	Prefix []string
	// Env lists what the lane's scrubbed environment carries besides KNIT_* variables and
	// the host's PATH: "NAME" copies NAME from the host, "NAME=value" sets it ("PATH=..."
	// replaces the host's PATH).
	Env []string
	// SharedMemory is Inherit (default: the region and doorbell on fds 3 and 4) or Named,
	// for wrappers that close inherited fds: the lane then collects them from a rendezvous
	// socket under /dev/shm. The region is a sealed memfd either way.
	SharedMemory SharedMemoryMode
	// Spares is how many lane processes the pool keeps started ahead — exec'd, initialised,
	// waiting for a boot record — so that a restart skips process start-up (negative: none;
	// at most 64). A spare is started once the pool is up and after each one is taken.
	// Default: adaptive, from 1 up to Lanes: each restart that finds no spare waiting keeps
	// one more, and a minute without such a restart one fewer, so that a burst of lanes
	// killed by their calls finds spares ready.
	Spares int
	// Limits bound each lane process's memory, CPU time, CPU bandwidth, open files and
	// processes, in a cgroup of its own where the host can make one (see Limits). The zero
	// value limits nothing; core dumps are off unless Limits.CoreDumps is set.
	Limits Limits
	// Sandbox confines each lane with Landlock and a seccomp preset, applied by the lane
	// before it serves; a layer is off, best effort or required (docs/process-lanes.md,
	// "Containing untrusted or crashy code").
	Sandbox Sandbox
	// MaxLaneMemory recycles a process lane whose resident memory (RSS, of the lane's
	// process: a Prefix that forks measures the wrapper) is above this many bytes (zero:
	// never), the way MaxCallsPerLane does. It is sampled from /proc/PID/statm at the
	// watchdog's tick (Liveness/3, or 1s with the watchdog off), so a lane may grow past it
	// between two looks: it is a trigger, not a limit.
	MaxLaneMemory int64
}

const (
	defaultBacklog     = 4096
	defaultEventBuffer = 1024
	defaultStopAck     = 50 * time.Millisecond
	defaultLiveness    = 3 * time.Second
	// defaultMoveQueuedAfter: a call queued behind a long one waits about this long and
	// half again (the watchdog's look) before it moves; calls that run this long are rare
	// among fast ones, and moving a few costs one requeue each.
	defaultMoveQueuedAfter = 100 * time.Millisecond
	// beatsPerLiveness: a lane beats this many times per Liveness, and the watchdog looks
	// as often, so a frozen lane is killed between Liveness and 4/3 Liveness after it
	// stopped, and a live one always beats between the first and the last of the looks
	// that would condemn it. (Each beat wakes an idle lane process: fewer is cheaper.)
	beatsPerLiveness = 3
)

// withDefaults is c with the documented defaults, for lanes that can do what caps says.
func (c Config) withDefaults(caps lifecycle.Caps) Config {
	if c.Lanes <= 0 {
		c.Lanes = runtime.GOMAXPROCS(0)
	}
	if c.Backlog <= 0 {
		c.Backlog = defaultBacklog
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = defaultEventBuffer
	}
	if c.StopAckTimeout <= 0 {
		c.StopAckTimeout = defaultStopAck
	}
	if c.KillGrace <= 0 {
		c.KillGrace = time.Second
	}
	if c.StartupTimeout <= 0 {
		c.StartupTimeout = 10 * time.Second
	}
	if c.Liveness == 0 {
		c.Liveness = defaultLiveness
	}
	if c.MoveQueuedAfter == 0 {
		c.MoveQueuedAfter = defaultMoveQueuedAfter
	}
	switch {
	case c.Process.Spares == 0:
		c.Process.Spares = 1
	case c.Process.Spares < 0:
		c.Process.Spares = 0
	}
	if c.LaneSpin == 0 {
		c.LaneSpin = caps.Spin
	}
	if c.CallerSpin == 0 {
		c.CallerSpin = caps.Spin
	}
	if c.Payload.Inline == 0 {
		c.Payload.Inline = 512
	}
	if c.Payload.Arena == 0 {
		c.Payload.Arena = 4 << 20
	}
	if c.Payload.MaxCall <= 0 || c.Payload.MaxCall > c.Payload.Arena {
		c.Payload.MaxCall = c.Payload.Arena
	}
	return c
}

// checkTasks refuses what NewPool cannot serve: no task at all, or a nil one (a nil *Task,
// or a Task value not made by Define).
func checkTasks(tasks []Definition) error {
	if len(tasks) == 0 {
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "NewPool needs at least one task"}
	}
	for i, t := range tasks {
		if t == nil || t.actorsDef() == nil {
			return &Error{Code: CodeInvalidArgument, Lane: -1,
				Message: fmt.Sprintf("NewPool: task %d of %d is nil (tasks come from knit.Define)", i+1, len(tasks))}
		}
	}
	return nil
}

// checkPortable refuses, for a pool with process lanes, a task whose values would not
// cross a process boundary intact (see actors.CheckPortable). Goroutine lanes pass values
// by reference: any type will do.
func checkPortable(caps lifecycle.Caps, defs []actors.Def) error {
	if !caps.Remote {
		return nil
	}
	for _, d := range defs {
		if err := actors.CheckPortable(d); err != nil {
			return &Error{Code: CodeUnsupportedType, Lane: -1, Task: d.Name(), Message: "cannot run on process lanes", Cause: err}
		}
	}
	return nil
}

// Bounds of Config fields that would otherwise exhaust memory or mean nothing.
const (
	maxBacklog     = 1 << 16
	maxEventBuffer = 1 << 16
	maxSpin        = time.Second
	maxSpares      = 64
	maxDuration    = 24 * time.Hour // StopAckTimeout, KillGrace, StartupTimeout, Liveness, LatencyWindow, MoveQueuedAfter
	minLiveness    = 10 * time.Millisecond
)

// check refuses, at NewPool, a Config no pool can run: an unknown enum, a negative count, a
// size or duration beyond its bound (each field's doc says which). The error is an
// INVALID_ARGUMENT *Error naming the field.
func (c Config) check() error {
	bad := func(field string, v any, why string) error {
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: fmt.Sprintf("Config.%s %v: %s", field, v, why)}
	}
	durations := []struct {
		name string
		d    time.Duration
	}{{"StopAckTimeout", c.StopAckTimeout}, {"KillGrace", c.KillGrace}, {"StartupTimeout", c.StartupTimeout},
		{"Liveness", c.Liveness}, {"LatencyWindow", c.LatencyWindow}, {"MoveQueuedAfter", c.MoveQueuedAfter}}
	for _, d := range durations {
		if d.d > maxDuration {
			return bad(d.name, d.d, fmt.Sprintf("over %v", maxDuration))
		}
	}
	r := c.Restart
	switch {
	case c.Lanes < 0 || c.Lanes > maxLanes:
		return bad("Lanes", c.Lanes, fmt.Sprintf("want 1 to %d (0: GOMAXPROCS)", maxLanes))
	case c.Runtime < 0 || int(c.Runtime) >= len(runtimes):
		return bad("Runtime", int(c.Runtime), "unknown (Goroutine, Process or Remote)")
	case c.Balancer < LeastLoaded || c.Balancer > FirstIdleOrRandom:
		return bad("Balancer", int(c.Balancer), "unknown")
	case c.Steal < StealAuto || c.Steal > StealLocal:
		return bad("Steal", int(c.Steal), "unknown")
	case c.Backlog < 0 || c.Backlog > maxBacklog:
		return bad("Backlog", c.Backlog, fmt.Sprintf("want 0 to %d (0: %d)", maxBacklog, defaultBacklog))
	case c.EventBuffer < 0 || c.EventBuffer > maxEventBuffer:
		return bad("EventBuffer", c.EventBuffer, fmt.Sprintf("want 0 to %d (0: %d)", maxEventBuffer, defaultEventBuffer))
	case c.LaneSpin > maxSpin:
		return bad("LaneSpin", c.LaneSpin, fmt.Sprintf("over %v", maxSpin))
	case c.CallerSpin > maxSpin:
		return bad("CallerSpin", c.CallerSpin, fmt.Sprintf("over %v", maxSpin))
	case c.Liveness > 0 && c.Liveness < minLiveness:
		return bad("Liveness", c.Liveness, fmt.Sprintf("under %v (negative: no watchdog)", minLiveness))
	case c.LatencyWindow < 0:
		return bad("LatencyWindow", c.LatencyWindow, "negative (0: none)")
	case c.MaxCallsPerLane < 0:
		return bad("MaxCallsPerLane", c.MaxCallsPerLane, "negative (0: never)")
	case c.Payload.Inline != 0 && (c.Payload.Inline < 64 || c.Payload.Inline > fastpath.MaxInline || c.Payload.Inline%64 != 0):
		return bad("Payload.Inline", c.Payload.Inline, fmt.Sprintf("want a multiple of 64 from 64 to %d", fastpath.MaxInline))
	case c.Payload.Arena != 0 && (c.Payload.Arena < 64 || c.Payload.Arena > fastpath.MaxArena || c.Payload.Arena%64 != 0):
		return bad("Payload.Arena", c.Payload.Arena, fmt.Sprintf("want a multiple of 64 from 64 to %d", fastpath.MaxArena))
	case c.Payload.MaxCall < 0:
		return bad("Payload.MaxCall", c.Payload.MaxCall, "negative (0: the arena size)")
	case r.Type < Transient || r.Type > Temporary:
		return bad("Restart.Type", int(r.Type), "unknown")
	case r.Strategy < OneForOne || r.Strategy > RestForOne:
		return bad("Restart.Strategy", int(r.Strategy), "unknown")
	case r.OnIntensity < CrashLoop || r.OnIntensity > GiveUp:
		return bad("Restart.OnIntensity", int(r.OnIntensity), "unknown")
	case r.Period > maxDuration || r.Backoff.Max > maxDuration || r.Backoff.CrashLoopMax > maxDuration || r.Backoff.Reset > maxDuration || r.Backoff.Min > maxDuration:
		return bad("Restart", "durations", fmt.Sprintf("a period or backoff over %v", maxDuration))
	case c.Process.Spares > maxSpares:
		return bad("Process.Spares", c.Process.Spares, fmt.Sprintf("over %d (negative: none)", maxSpares))
	case c.Process.SharedMemory < Inherit || c.Process.SharedMemory > Named:
		return bad("Process.SharedMemory", int(c.Process.SharedMemory), "unknown")
	case c.Process.MaxLaneMemory < 0:
		return bad("Process.MaxLaneMemory", c.Process.MaxLaneMemory, "negative (0: never)")
	}
	if err := c.Process.Limits.check(); err != nil {
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "Config.Process.Limits: " + err.Error()}
	}
	if err := c.Process.Sandbox.lane().Check(); err != nil {
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "Config.Process.Sandbox", Cause: err}
	}
	return nil
}

var balancerNames = [...]string{"least-loaded", "round-robin", "first-idle", "random", "first-idle-or-random"}

func (b Balancer) String() string {
	if b >= 0 && int(b) < len(balancerNames) {
		return balancerNames[b]
	}
	return fmt.Sprintf("Balancer(%d)", int(b))
}

// The enums marshal as their names, so that JSON (the inspector's, a log's) carries
// "ticket", not 2.

// MarshalText names the balancer.
func (b Balancer) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// MarshalText names the discipline.
func (s Steal) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText names the mode.
func (m SharedMemoryMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// MarshalText names the mode.
func (m CgroupMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// MarshalText names the restart type.
func (t RestartType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText names the strategy.
func (s Strategy) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText names the action.
func (a IntensityAction) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// parseEnum finds the value of an enum whose n values 0…n-1 String names, for the enums'
// UnmarshalText: what MarshalText writes, UnmarshalText reads.
func parseEnum[E interface {
	~int
	String() string
}](b []byte, n int, what string) (E, error) {
	for v := range n {
		if E(v).String() == string(b) {
			return E(v), nil
		}
	}
	return 0, fmt.Errorf("knit: unknown %s %q", what, b)
}

// UnmarshalText reads a balancer's name.
func (b *Balancer) UnmarshalText(t []byte) (err error) {
	*b, err = parseEnum[Balancer](t, int(FirstIdleOrRandom)+1, "balancer")
	return err
}

// UnmarshalText reads a discipline's name.
func (s *Steal) UnmarshalText(t []byte) (err error) {
	*s, err = parseEnum[Steal](t, int(StealLocal)+1, "steal mode")
	return err
}

// UnmarshalText reads a mode's name.
func (m *SharedMemoryMode) UnmarshalText(t []byte) (err error) {
	*m, err = parseEnum[SharedMemoryMode](t, int(Named)+1, "shared-memory mode")
	return err
}

// UnmarshalText reads a mode's name.
func (m *CgroupMode) UnmarshalText(t []byte) (err error) {
	*m, err = parseEnum[CgroupMode](t, int(CgroupRequired)+1, "cgroup mode")
	return err
}

// UnmarshalText reads a restart type's name.
func (r *RestartType) UnmarshalText(t []byte) (err error) {
	*r, err = parseEnum[RestartType](t, int(Temporary)+1, "restart type")
	return err
}

// UnmarshalText reads a strategy's name.
func (s *Strategy) UnmarshalText(t []byte) (err error) {
	*s, err = parseEnum[Strategy](t, int(RestForOne)+1, "strategy")
	return err
}

// UnmarshalText reads an action's name.
func (a *IntensityAction) UnmarshalText(t []byte) (err error) {
	*a, err = parseEnum[IntensityAction](t, int(GiveUp)+1, "intensity action")
	return err
}

// UnmarshalText reads a mode's name.
func (m *SandboxMode) UnmarshalText(t []byte) (err error) {
	*m, err = parseEnum[SandboxMode](t, int(SandboxRequired)+1, "sandbox mode")
	return err
}
