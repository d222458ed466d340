package knit

// Hooks for knit's own tests: compiled only into the test binary, never into a program
// that links knit.
import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// NewUnsupervisedPool starts a pool whose lanes run without a supervision tree, for the
// benchmark that shows the tree costs the call path nothing.
func NewUnsupervisedPool(cfg Config, tasks ...Definition) (*Pool, error) {
	cfg.test.unsupervised = true
	return newPool(cfg, tasks...)
}

// NewPoolWithoutMonitor starts a pool with no monitor: the call path as it was before
// metrics, for the benchmark that compares the two.
func NewPoolWithoutMonitor(cfg Config, tasks ...Definition) (*Pool, error) {
	cfg.test.noMonitor = true
	return NewPool(cfg, tasks...)
}

// AwaitSpares waits until the spares being started have initialised (or failed).
func AwaitSpares(p *Pool) { p.spares.Wait() }

// LaneDebug is the KNIT_DEBUG value the pool's process lanes get.
func LaneDebug(p *Pool) string { return p.laneDebug }

// TaskIndex is a task's registry index (hostile tests forge slots naming it).
func TaskIndex[In, Out any](t *Task[In, Out]) uint32 { return t.def.Index() }

// ResultHarness is the host side of one process lane over a heap region, with no process
// behind it: FuzzHostResults plays the lane, writing whatever it likes into the return ring
// and arena, and has the host drain them. It starts no goroutine.
type ResultHarness struct {
	p *Pool
	l *lane
}

// NewResultHarness builds a process pool of one lane with no process, serving tasks.
func NewResultHarness(tasks ...Definition) (*ResultHarness, error) {
	caps := harnessRuntime{}.Caps()
	cfg := Config{Runtime: Process, Lanes: 1, CallerSpin: -1, Liveness: -1}.withDefaults(caps)
	nop := zap.NewNop()
	p := &Pool{cfg: cfg, caps: caps, id: poolIDs.Add(1), epoch: time.Now(), reaped: true,
		root: nop, log: nop, laneLog: nop, fastLog: nop, codecLog: nop,
		drained: make(chan struct{}), closeDone: make(chan struct{}), changed: make(chan struct{}),
		slots: make([]laneSlot, maxLanes), events: make(chan Event, 1)}
	p.size.Store(1)
	p.byIndex = make([]actors.Def, actors.Count())
	for _, t := range tasks {
		d := t.actorsDef()
		if p.byIndex[d.Index()] == nil {
			p.byIndex[d.Index()] = d
			p.defs = append(p.defs, d)
		}
	}
	layout := fastpath.Layout{Inline: 64, Arena: 4096, AbortBits: 8}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		return nil, err
	}
	run := &harnessRun{region: region}
	p.runtime = harnessRuntime{run}
	l := newLane(p, 0, 0)
	if err := l.OpenRegion(); err != nil {
		return nil, err
	}
	_ = l.Start(lifecycle.Launch{}) // harnessRun.Start only keeps the lane's end
	close(l.reaped)                 // no reaper runs: the harness drains
	l.ring = l.newRing()
	l.wake, l.laneBell = region.LaneWake(), fastpath.NewChanBell()
	l.wake.SetAwake() // calls are not rung for: the harness takes them when it likes
	l.done, l.doneBell = region.Returns().Completion(), fastpath.NewChanBell()
	l.reaper = true
	p.slots[0].cur.Store(l)
	return &ResultHarness{p: p, l: l}, nil
}

// Pool is the harness's pool: calls made on it are published on the request ring.
func (h *ResultHarness) Pool() *Pool { return h.p }

// Region is the lane's region, for the harness to play the lane on.
func (h *ResultHarness) Region() *fastpath.Region { return h.l.Region() }

// Drain has the host drain the return ring, as its reaper would.
func (h *ResultHarness) Drain() int { return h.l.drain() }

// Corrupt is why the host would have killed the lane as corrupt, if it would have.
func (h *ResultHarness) Corrupt() error {
	return h.l.Run().(*harnessRun).killed()
}

// harnessRun is the harness lane's incarnation: remote, with no process behind it; the kill
// a corrupt ring causes only records why.
type harnessRun struct {
	region *fastpath.Region
	end    func(e *lifecycle.Error, normal bool) // the lane's end, as its runtime reports it
	mu     sync.Mutex
	why    lifecycle.Exit
}

func (h *harnessRun) Region() *fastpath.Region         { return h.region }
func (h *harnessRun) LaneBell() fastpath.Bell          { return fastpath.NewChanBell() }
func (h *harnessRun) DoneBell() fastpath.Bell          { return fastpath.NewChanBell() }
func (h *harnessRun) DirectBell() fastpath.Bell        { return fastpath.FutexBell{} }
func (h *harnessRun) Remote() bool                     { return true }
func (h *harnessRun) Start(x lifecycle.Launch) error   { h.end = x.End; return nil }
func (h *harnessRun) Ready() <-chan struct{}           { return closed }
func (h *harnessRun) Poll()                            {}
func (h *harnessRun) AwaitReady(<-chan struct{}) bool  { return true }
func (h *harnessRun) Signal() func(sig syscall.Signal) { return nil }
func (h *harnessRun) PID() int                         { return 0 }
func (h *harnessRun) Close()                           {}

func (h *harnessRun) Kill(why lifecycle.Exit) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.why.Corrupt == nil {
		h.why = why
	}
	return true
}

func (h *harnessRun) killed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.why.Corrupt
}

// harnessRuntime opens the harness's one incarnation.
type harnessRuntime struct{ run *harnessRun }

func (r harnessRuntime) Open(int, int) (lifecycle.Incarnation, error) { return r.run, nil }
func (harnessRuntime) Caps() lifecycle.Caps                           { return (*lifecycle.Processes)(nil).Caps() }

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Close ends the lane as if its process had exited: every call it still holds settles.
func (h *ResultHarness) Close() {
	h.p.closing.Store(true) // calls that had not started fail rather than look for a lane
	h.l.Run().(*harnessRun).end(&lifecycle.Error{Code: lifecycle.CodeThreadClosed, Lane: 0, Message: "harness closed"}, false)
}

// StealState describes a stealing pool's ring and lanes, for a test that fails.
func StealState(p *Pool) string {
	s := p.shared
	if s == nil {
		return "not stealing"
	}
	h, w := s.ring.Submit().Words()
	out := fmt.Sprintf("waiting %d, inflight %d, queued %d, H %#x W %#x, shared waiters %d, futures %d, spinning %v lingering %v;", s.prod.Waiting(), s.inflight.Load(), s.host.Queued(), h.Load(), w.Load(),
		s.waiters.Load(), p.futures.Load(), p.spinning.Load(), p.lingering.Load())
	if gone, why := s.Degraded(); gone {
		out += fmt.Sprintf(" ring given up: %s;", why)
	}
	for i := range p.laneCount() {
		l := p.slots[i].cur.Load()
		if l == nil {
			continue
		}
		a, r := l.wake.Awake()
		js, je, want := s.prod.Journal(l.cid)
		out += fmt.Sprintf(" lane %d cid %d state %d awake %v rung %v running %#x journal %#x %x want %#x results %v armed %d requests unread %v backlog %d;", i, l.cid, l.State(), a, r, l.Region().Running().Load(), js, je[:min(4, len(je))], want, l.ring.Waiting(), l.done.Word().Load(), l.Region().Requests().Unread(), l.ring.Queued())
	}
	return out
}

// StopStealBackstop stops a stealing pool's watchdog, whose backstop rings parked lanes
// while calls wait unclaimed: for a test that must show that no call waits for a lane
// without it. (A goroutine pool runs the watchdog for that alone; a process pool loses its
// liveness checks too.)
func StopStealBackstop(p *Pool) {
	if p.shared == nil || p.watchDone == nil {
		panic("StopStealBackstop: not a stealing pool with a watchdog")
	}
	close(p.stopWatch)
	<-p.watchDone
	p.watchDone = nil
}

// WithTicketWidth is cfg for a Ticket pool that claims up to w calls at a time instead of
// ticketWidth, for a benchmark that compares widths.
func WithTicketWidth(cfg Config, w int) Config {
	cfg.test.ticketWidth = w
	return cfg
}

// StealAlways makes a stealing pool publish every call on its shared ring, also when the
// ring is empty and a lane idle (which then takes the call on its own ring): for a test of
// what happens to calls on the shared ring.
func StealAlways(p *Pool) {
	if p.shared == nil {
		panic("StealAlways: not a pool with a shared submit ring")
	}
	p.shared.always.Store(true)
}

// StealAwake reports whether the lane with consumer id c of the pool's shared ring is awake
// (running, polling or rung) as the host sees it; false too when no lane has that id.
func StealAwake(p *Pool, c int) bool {
	for i := range p.laneCount() {
		if l := p.slots[i].cur.Load(); l != nil && l.cid == c {
			a, _ := l.wake.Awake()
			return a
		}
	}
	return false
}

// RemoteMissedWakes is how many wakes a remote pool's lane forwarders lost and the link's
// heartbeat caught (remote.Nodes.Missed); 0 for a pool of another runtime.
func RemoteMissedWakes(p *Pool) uint64 {
	if n, ok := p.runtime.(interface{ Missed() uint64 }); ok {
		return n.Missed()
	}
	return 0
}

// StealDegraded reports whether a stealing pool has given its shared ring up (it found the
// mapping written by something other than the protocol, or stuck): its lanes serve their
// own rings only.
func StealDegraded(p *Pool) bool {
	if p.shared == nil {
		return false
	}
	gone, _ := p.shared.Degraded()
	return gone
}

// ReadsOfAnEndedLane kills the current lane idx of p, waits until it has ended (its region
// released: unmapped for a process lane), and then reads its wake state as a caller whose
// spin outlived the lane (slowWake) and a node's Submit to it (polling) do.
func ReadsOfAnEndedLane(p *Pool, idx int) (slowWake, polling bool) {
	l := p.slots[idx].cur.Load()
	l.Kill(lifecycle.Exit{})
	<-l.Ended()
	return l.slowWake(), l.polling()
}

// TaskPace is the running time per call of task t that pool p has learned from its lanes
// (0: none, or the pool keeps no pace): the average, which callers see (pace.ns) only once
// it changes what a spinning lane may hold, so not at all while it stays at or over
// spinnerWork, as it can for a while on a loaded machine after one descheduled call.
func TaskPace[In, Out any](p *Pool, t *Task[In, Out]) time.Duration {
	if p.pace == nil {
		return 0
	}
	return time.Duration(p.pace[t.def.Index()].avg.Load())
}

// SetTaskPace sets the pace pool p's balancer knows for task t.
func SetTaskPace[In, Out any](p *Pool, t *Task[In, Out], d time.Duration) {
	p.pace[t.def.Index()].ns.Store(int64(d))
	p.pace[t.def.Index()].avg.Store(int64(d))
}

// SpinnerFor is how many calls of a task of that pace a spinning lane holds (spinnerFor).
func SpinnerFor(pace time.Duration) int { return int(spinnerFor(int64(pace))) }

// AwaitMoverIdle waits until the watchdog has stopped its moveQueued looks for want of
// calls (Pool.moveIdle), or timeout; it reports whether it has.
func AwaitMoverIdle(p *Pool, timeout time.Duration) bool {
	for end := time.Now().Add(timeout); !p.moveIdle.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// WatchdogLooks is how many times the pool's watchdog has looked at its lanes.
func WatchdogLooks(p *Pool) uint64 { return p.looks.Load() }

// LaneBeat is lane i's heartbeat word (0 and false: no process lane's region is mapped).
func LaneBeat(p *Pool, i int) (uint32, bool) {
	l := p.slots[i].cur.Load()
	if l == nil || l.local != nil {
		return 0, false
	}
	return l.heartbeat()
}

// PackAtAnyPace has the nodes this process serves pack calls whatever their tasks' pace
// (the remote tests' nodes: a race-built lane's quick call can take longer than packBelow).
func PackAtAnyPace() { packBelow = time.Hour }

// RemoteWidestForward is the most calls a remote pool's lane forwarder has sent at once
// (remote.Nodes.Widest); 0 for a pool of another runtime.
func RemoteWidestForward(p *Pool) int64 {
	if n, ok := p.runtime.(interface{ Widest() int64 }); ok {
		return n.Widest()
	}
	return 0
}
