package lifecycle

import (
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// A Runtime is where a pool's lanes run: Goroutines runs each incarnation as a goroutine of
// the host, Processes as a process of its own. The host end of a lane — its rings, its
// state, its stop protocol, its accounting — sees a runtime only through Runtime and
// Incarnation, so a third one (lanes on another machine) is a third implementation of these
// two interfaces, not a change to the pool.
type Runtime interface {
	// Caps says what the runtime's lanes are and can do. The pool asks this, never which
	// runtime it has.
	Caps() Caps
	// Open makes the memory of incarnation inc of lane idx: its region and doorbells.
	// Nothing runs until Incarnation.Start.
	Open(idx, inc int) (Incarnation, error)
}

// Caps is what a runtime's lanes are and can do, as far as the pool's choices depend on it.
type Caps struct {
	// Remote: lanes run outside the host's memory (every Incarnation.Remote is true).
	// Inputs are encoded and copied, so only portable types cross; results wait on return
	// rings for a reaper; deadlines travel with each call; a call is interrupted through its
	// abort bit and ended at its hard timeout by a kill; a lane that does not stop is
	// killed, not abandoned; a shared submit ring lives in a mapping every lane shares.
	Remote bool
	// Spin is how long a lane and a caller poll by default before they park (zero: they
	// park at once).
	Spin time.Duration
	// Watched: a lane can stop without ending (frozen, a stuck runtime), so the watchdog
	// checks its heartbeat, and it has a resident memory to sample.
	Watched bool
	// Confined: lanes take the process settings: spares, limits and cgroups, a sandbox.
	Confined bool
	// LocalSteal: lanes can take calls from one another's queues in the host's memory.
	LocalSteal bool
	// Networked: lanes run on other machines (Remote too): they share no memory with the
	// host or with each other, so no shared submit ring; a node's own settings, not the
	// pool's process settings, confine them.
	Networked bool
}

// ProcessSpin is how long a process lane, and a caller of one, poll before they park.
const ProcessSpin = 50 * time.Microsecond

// An Incarnation is one start of a lane, as its host sees it.
type Incarnation interface {
	// Region holds its rings; LaneBell is the doorbell it parks on; DoneBell the one the
	// host sleeps on for results (nil when the incarnation settles its own results).
	Region() *fastpath.Region
	LaneBell() fastpath.Bell
	DoneBell() fastpath.Bell
	// DirectBell is the doorbell of the return ring's direct completion (Ring.Direct),
	// which a caller alone on the lane sleeps on: whatever publishes the lane's results
	// rings it. A futex for a process, whose executor rings it across the mapping; a
	// channel for a lane whose results are published by a goroutine of the host's, so that
	// the caller waits as a goroutine and frees its thread (nil: no direct waits).
	DirectBell() fastpath.Bell
	// Remote reports whether it runs outside the host's memory: its payloads are copied,
	// its results are drained by a reaper, a call is interrupted by its abort bit and
	// ended at its hard timeout by a kill, its region can be unmapped under the host, and
	// it reports ready through its region (Poll).
	Remote() bool
	// Start starts it. It returns once the incarnation runs; l.End is called once, from a
	// goroutine of the incarnation's, when it has ended.
	Start(l Launch) error
	// Ready is closed once the host has seen it ready (at once, for a goroutine). Poll
	// looks for the ready report in its region and closes Ready when it finds one.
	Ready() <-chan struct{}
	Poll()
	// AwaitReady waits for Ready, for ended, or for the startup timeout, at which it kills
	// the incarnation and waits for ended; it reports whether it became ready.
	AwaitReady(ended <-chan struct{}) bool
	// Signal sends sig to what runs it; nil when nothing can be signalled (a goroutine),
	// whose stop protocol abandons it instead.
	Signal() func(sig syscall.Signal)
	// Kill ends it, why saying what the host will report; false when it cannot be killed
	// (a goroutine), which its lane then abandons.
	Kill(why Exit) bool
	// PID is its process (0: none).
	PID() int
	// Close releases its memory once it has ended and nothing reads its region any more.
	Close()
}

// A Launch is what a lane gives its incarnation to start with. Each runtime takes the
// fields it needs.
type Launch struct {
	// Exec gives what a goroutine incarnation runs over its region, parked on its bell: an
	// *actors.Executor, or an *actors.LocalLane.
	Exec func(region *fastpath.Region, bell fastpath.Bell) (Runner, error)
	// Boot is a process's boot record; Files the descriptors it gets beyond its region and
	// doorbell (a stealing pool's shared ring).
	Boot  func() Boot
	Files []*os.File
	// Spare lets a process incarnation take a spare process instead of spawning one.
	Spare bool
	// Stopping reports whether the host has asked the lane to stop (read at its end).
	Stopping func() bool
	// Refill moves calls waiting in the lane's backlog into the request slots the
	// incarnation has freed. A remote lane's forwarder calls it after it sends: the results
	// whose drain refills a local lane's ring are a network round trip away. Nil: none.
	Refill func()
	// Drain settles the results on the lane's return ring, as the pool's reaper does, and
	// reports how many; 0 when another goroutine is draining it. A remote lane's receiver
	// calls it on the results it has just published, rather than hand them to the reaper.
	// Nil: none.
	Drain func() int
	// End is called once the incarnation has ended, with its classified end; normal: it
	// ended on its own with success.
	End func(e *Error, normal bool)
	// Debug logs a step (the lane namespace, with the lane's identity).
	Debug func(msg string, fields ...zap.Field)
}

// A Runner is what a goroutine incarnation runs: it returns when the lane ends.
type Runner interface{ Run() error }

// Goroutines runs lanes as goroutines of the host over heap memory. They park on a Go
// channel, settle their own results and are never killed: a goroutine that does not stop is
// abandoned.
type Goroutines struct {
	Inline int   // inline payload bytes per slot
	Epoch  int64 // the pool's epoch (Unix nanoseconds), stamped into each region
}

// Caps implements Runtime: goroutine lanes share the host's memory and are handed calls
// through the Go scheduler, which beats spinning on small machines (docs/benchmarks.md).
func (Goroutines) Caps() Caps { return Caps{LocalSteal: true} }

// Open implements Runtime.
func (g Goroutines) Open(idx, inc int) (Incarnation, error) {
	// Payloads stay on their records: the arena only has to exist.
	layout := fastpath.Layout{Inline: g.Inline, Arena: 64, AbortBits: 1}
	r, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, uint32(idx), uint32(inc), g.Epoch)
	if err != nil {
		return nil, err
	}
	return &goroutine{idx: idx, region: r, bell: fastpath.NewChanBell()}, nil
}

type goroutine struct {
	idx    int
	region *fastpath.Region
	bell   fastpath.Bell
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (g *goroutine) Region() *fastpath.Region         { return g.region }
func (g *goroutine) LaneBell() fastpath.Bell          { return g.bell }
func (g *goroutine) DoneBell() fastpath.Bell          { return nil }
func (g *goroutine) DirectBell() fastpath.Bell        { return nil }
func (g *goroutine) Remote() bool                     { return false }
func (g *goroutine) Ready() <-chan struct{}           { return closedChan }
func (g *goroutine) Poll()                            {}
func (g *goroutine) AwaitReady(<-chan struct{}) bool  { return true }
func (g *goroutine) Signal() func(sig syscall.Signal) { return nil }
func (g *goroutine) Kill(Exit) bool                   { return false }
func (g *goroutine) PID() int                         { return 0 }
func (g *goroutine) Close()                           {}

// Start implements Incarnation: it runs l.Exec on a new goroutine.
func (g *goroutine) Start(l Launch) error {
	exec, err := l.Exec(g.region, g.bell)
	if err != nil {
		return err
	}
	go func() {
		var err error
		returned := false
		defer func() {
			if !returned { // runtime.Goexit in a task
				err = ErrGoexit
			}
			l.End(ClassifyReturn(g.idx, l.Stopping(), err))
		}()
		err = exec.Run()
		returned = true
	}()
	if l.Debug != nil {
		l.Debug("lane goroutine started")
	}
	return nil
}

// Processes runs lanes as processes of their own (Launcher), each over a sealed memfd
// region (Memory), taking a waiting spare (Spares) for a restart when it can.
type Processes struct {
	Launcher *Launcher
	Spares   *Spares
	Layout   fastpath.Layout
	Epoch    int64
	// StartupTimeout bounds the wait for a spawned process's ready report; Liveness, when
	// positive, a spare's (it has initialised already).
	StartupTimeout, Liveness time.Duration
	// Limits, if set, adds to a process's Exit the limits it ran under.
	Limits func(x *Exit)
}

// Caps implements Runtime.
func (*Processes) Caps() Caps {
	return Caps{Remote: true, Spin: ProcessSpin, Watched: true, Confined: true}
}

// Open implements Runtime.
func (p *Processes) Open(idx, inc int) (Incarnation, error) {
	mem, err := NewMemory(p.Layout, uint32(idx), uint32(inc), p.Epoch)
	if err != nil {
		return nil, err
	}
	return &process{rt: p, idx: idx, mem: mem, ready: make(chan struct{})}, nil
}

type process struct {
	rt    *Processes
	idx   int
	mem   *Memory
	proc  *Process
	ready chan struct{}
	spare bool // it was a spare: initialised already (AwaitReady)
}

func (p *process) Region() *fastpath.Region  { return p.mem.Region }
func (p *process) LaneBell() fastpath.Bell   { return fastpath.FutexBell{} }
func (p *process) DoneBell() fastpath.Bell   { return p.mem.DoneBell() }
func (p *process) DirectBell() fastpath.Bell { return fastpath.FutexBell{} }
func (p *process) Remote() bool              { return true }
func (p *process) Ready() <-chan struct{}    { return p.ready }
func (p *process) PID() int                  { return p.proc.PID() }
func (p *process) Close()                    { p.mem.Close() }

func (p *process) Signal() func(sig syscall.Signal) { return p.proc.Signal }

func (p *process) Kill(why Exit) bool {
	p.proc.Kill(why)
	return true
}

// Poll implements Incarnation; only the lane's reaper calls it.
func (p *process) Poll() {
	select {
	case <-p.ready:
	default:
		if p.mem.Region.Boot().Load() == fastpath.BootReady {
			close(p.ready)
		}
	}
}

// AwaitReady implements Incarnation. A spare has initialised before it was taken, so it is
// ready within Liveness, unless it has a large boot record to read (a pool of many tasks) on
// a loaded machine: at each Liveness that it is not, the host looks at it, gives up on one
// that is stopped (SIGSTOP: it would make the restart wait for nothing), and lets one that
// runs have up to StartupTimeout, as a spawned process has. (Giving every spare only
// Liveness killed the spares of a race-built pool of 100,000 tasks one after another.)
func (p *process) AwaitReady(ended <-chan struct{}) bool {
	timeout := p.rt.StartupTimeout
	if p.spare && p.rt.Liveness > 0 {
		start := time.Now()
		for {
			left := timeout - time.Since(start)
			if left <= 0 || waitFor(min(p.rt.Liveness, left), p.ready, ended) {
				break
			}
			if frozen(p.PID()) {
				p.proc.Kill(Exit{Startup: time.Since(start).Round(time.Millisecond)})
				<-ended
				return false
			}
		}
		select {
		case <-p.ready:
			return true
		case <-ended:
			return false
		default:
		}
		timeout = max(timeout-time.Since(start), time.Millisecond)
	}
	return p.proc.AwaitReady(p.ready, ended, timeout)
}

// Start implements Incarnation. A restart takes a spare — a process that has exec'd and
// initialised already — when l.Spare allows and one is waiting; otherwise it spawns. A spare
// receives its descriptors on its socket, whatever the shared-memory mode.
func (p *process) Start(l Launch) error {
	files := append(p.mem.Files(), l.Files...)
	var err error
	if l.Spare {
		if sp := p.rt.Spares.Take(); sp != nil {
			pid := sp.PID()
			if p.proc, err = p.rt.Launcher.Assign(sp, l.Boot(), files); err == nil {
				p.spare = true
				l.Debug("spare process assigned")
			} else {
				l.Debug("spare process refused its assignment: spawning", zap.Int("pid", pid), zap.Error(err))
			}
		}
		p.rt.Spares.Refill() // after a miss too: the stock may have grown (Spares.Max)
	}
	if p.proc == nil {
		if p.proc, err = p.rt.Launcher.Start(l.Boot(), files); err != nil {
			p.proc = &Process{} // nothing to signal or kill
			return err
		}
	}
	l.Debug("lane process started", zap.Int("pid", p.proc.PID()))
	go p.watch(l)
	return nil
}

// watch waits for the process to end and classifies the end.
func (p *process) watch(l Launch) {
	x := p.proc.Wait()
	x.Lane = p.idx
	x.Stopping = l.Stopping()
	// Ready is what the host saw (the reaper closed ready), not the boot word now: a lane
	// may have rewritten that, or the whole region, before it went.
	select {
	case <-p.ready:
		x.Ready = true
	default:
		x.Fatal = p.mem.Region.Fatal()
	}
	p.proc.Collect(&x) // its cgroup goes, with every process left in it
	if p.rt.Limits != nil {
		p.rt.Limits(&x)
	}
	l.Debug("lane process reaped", zap.Int("pid", p.proc.PID()), zap.Int("status", x.Status), zap.Stringer("signal", x.Signal))
	e := Classify(x)
	l.End(e, e.Code == CodeWorkerExited && x.Status == 0)
}
