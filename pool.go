package knit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// Pool runs tasks on lanes. Make one with NewPool; it is safe for concurrent use.
type Pool struct {
	cfg      Config
	root     *zap.Logger // knit's root logger
	log      *zap.Logger // namespace lifecycle
	laneLog  *zap.Logger // namespace lane: starts, stop protocol, signals, reaping
	fastLog  *zap.Logger // namespace fastpath: regions and what breaks their protocol
	codecLog *zap.Logger // namespace codec: codecs chosen, payloads that do not decode
	// laneDebug is the KNIT_DEBUG value process lanes get: the environment's with knit's
	// own logger; with Config.Logger, every namespace if it takes Debug entries, else none.
	laneDebug string
	id        uint64
	epoch     time.Time
	slots     []laneSlot   // maxLanes of them; [0, size) are the pool's lanes (resize.go)
	size      atomic.Int32 // lanes in use, retiring ones included
	tree      *supervisor.Tree
	defs      []actors.Def // the pool's tasks
	byIndex   []actors.Def // registry index → task, nil for tasks not in the pool
	rr        atomic.Uint32

	futures  atomic.Int64 // futures someone blocks on (Wait after its spin, Done): reapers must drain for them
	spinning atomic.Bool  // a caller (help) or a reaper (linger) polls for results, draining for everyone
	// lingering is set while the spinner is a reaper; handover asks it to let a caller spin.
	lingering, handover atomic.Bool
	spinMisses          atomic.Int32     // spins in a row that ran out of budget: at coldAfter, callers park at once
	cold                fastpath.Backoff // a host spinner was descheduled: callers and reapers park at once for a while
	// spinLanes is how many lanes, the lowest first, spin before they park (LaneSpin); the
	// others park at once (Pool.laneSpin).
	spinLanes int
	// pace is, by registry index, how long a call of each task runs on a lane (notePace):
	// the balancer's measure of a quick task. Only a process pool whose lanes from
	// spinLanes on park at once keeps it, and LeastLoaded gives its spinning lanes the calls
	// of quick tasks first (spinner).
	pace     []pace
	reaped   bool // process lanes: results wait on return rings for a drainer
	local    bool // goroutine lanes of a pool with no shared ring (actors.LocalLane)
	closing  atomic.Bool
	requeued atomic.Int64  // calls that lost their lane and look for another
	drained  chan struct{} // closed when closing and nothing is in flight
	drainMu  sync.Once

	changeMu sync.Mutex
	changed  chan struct{}         // closed and replaced when a lane comes up or the pool fails
	failed   atomic.Pointer[Error] // set when the supervisor gave up every lane

	spares lifecycle.Spares // process lanes started ahead for restarts
	// adaptiveSpares: ProcessConfig.Spares was left at its default, so the stock grows with
	// restarts that find no spare (lifecycle.Spares.Max).
	adaptiveSpares bool
	up             atomic.Bool // the first boot is over: starts may take spares (resize.go)

	resizeMu sync.Mutex // serialises Resize

	stopWatch chan struct{} // closed by Close once the lanes are stopped
	// moveIdle is set by the watchdog when, at a look of moveQueued, no process lane held or
	// ran a call: it stops those looks, and the first call a lane accepts after that sends on
	// moveWake (wakeMover). The watchdog sets it before it reads the lanes' inflight counts,
	// and lane.Accept reads it after counting its call (both sequentially consistent), so
	// either the look sees the call or the lane sees the flag. moveWake is nil when the pool
	// does not move calls (MoveQueuedAfter < 0, goroutine lanes).
	moveIdle  atomic.Bool
	moveWake  chan struct{}
	looks     atomic.Uint64 // the watchdog's ticks so far (tests wait for them)
	watchDone chan struct{} // closed when the watchdog has returned (nil: none runs)

	events  chan Event
	evMu    sync.Mutex // guards sends on events against its closing
	evDone  bool
	dropped atomic.Uint64

	closeOnce sync.Once
	closeDone chan struct{}
	closeErr  error

	eventLog eventRing // the last lifecycle events (RecentEvents)
	obs      *monitor  // latency windows, lane totals, metric instruments (nil: none)
	// Events() buffers from its first call (evWanted); before it, recent holds the last
	// transitions for it to deliver first (under evMu).
	evWanted atomic.Bool
	recent   []Event

	limits     poolLimits            // process lanes: their limits and cgroups (limits.go)
	hostLimits *lifecycle.HostLimits // process lanes: the host's own rlimits, kept (watchdog)

	shared *shared // a stealing pool's shared submit ring (nil: private lanes)
	// group is a stealing pool of goroutine lanes' LocalLanes (StealLocal; nil: none).
	group *actors.LocalGroup

	procs   *lifecycle.Launcher // process lanes: how their processes start (lane_process.go)
	runtime lifecycle.Runtime   // where the lanes' incarnations run
	caps    lifecycle.Caps      // what they can do (runtime.go)
	memory  string              // what their regions are made of, for the fastpath log
}

var poolIDs atomic.Uint64

// NewPool starts a pool serving tasks: its supervision tree boots every lane, in parallel,
// and NewPool returns once all are ready, or with the first startup error.
func NewPool(cfg Config, tasks ...Definition) (*Pool, error) {
	p, err := newPool(cfg, tasks...)
	if err != nil {
		return nil, errorOf(err)
	}
	return p, nil
}

// newPool starts a pool. With cfg.test.unsupervised, its lanes run with no supervision
// tree (so that benchmarks can show what the tree costs the call path: nothing, as it is
// never on it).
func newPool(cfg Config, tasks ...Definition) (*Pool, error) {
	if lifecycle.IsLane() {
		return nil, &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: "NewPool called inside a knit lane process: lanes never start pools (call knit.Main first in main)"}
	}
	if err := checkTasks(tasks); err != nil {
		return nil, err
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rt := runtimes[cfg.Runtime]
	adaptiveSpares := cfg.Process.Spares == 0
	spinLanes := maxLanes // LaneSpin set: as many as asked
	if cfg.LaneSpin == 0 {
		spinLanes = runtime.GOMAXPROCS(0) - 1
	}
	keepsPace := cfg.LaneSpin == 0 && cfg.Runtime == Process && spinLanes > 0 // before the defaults set LaneSpin
	cfg = cfg.withDefaults(rt.caps)
	p := &Pool{cfg: cfg, caps: rt.caps, adaptiveSpares: adaptiveSpares, spinLanes: spinLanes,
		id: poolIDs.Add(1), epoch: time.Now(),
		drained: make(chan struct{}), closeDone: make(chan struct{}), changed: make(chan struct{}),
		slots: make([]laneSlot, maxLanes)}
	p.size.Store(int32(cfg.Lanes))
	debug := logging.DebugFromEnv()
	p.root = logging.New(cfg.Logger, debug).With(zap.String("pool", p.Name()))
	switch {
	case cfg.Logger == nil:
		p.laneDebug = debug.String()
	case cfg.Logger.Core().Enabled(zapcore.DebugLevel):
		p.laneDebug = "*"
	}
	p.log = p.root.Named(logging.Lifecycle)
	p.laneLog, p.fastLog = p.root.Named(logging.Lane), p.root.Named(logging.Fastpath)
	p.codecLog = p.root.Named(logging.Codec)
	p.reaped = p.caps.Remote
	p.byIndex = make([]actors.Def, actors.Count())
	if keepsPace {
		p.pace = make([]pace, len(p.byIndex))
	}
	serve := make([]actors.Def, 0, 2*len(tasks))
	for _, t := range tasks {
		d := t.actorsDef()
		serve = append(serve, d)
		if t, ok := d.(interface{ Twin() actors.Def }); ok && p.caps.Remote {
			if tw := t.Twin(); tw != nil {
				serve = append(serve, tw) // Map's chunks (actors.TwinSuffix)
				if p.pace != nil {
					p.pace[tw.Index()].per = twinChunk // a pace per element
				}
			}
		}
	}
	for _, d := range serve {
		if p.byIndex[d.Index()] == nil {
			p.byIndex[d.Index()] = d
			p.defs = append(p.defs, d)
			if ce := logging.Debug(p.codecLog, "task codecs"); ce != nil {
				in, out := d.Codecs()
				ce.Write(zap.String("task", d.Name()), zap.Uint32("index", d.Index()),
					zap.String("in", in), zap.String("out", out))
			}
		}
	}
	if err := checkPortable(p.caps, p.defs); err != nil {
		return nil, err
	}
	if err := checkSandbox(cfg, p.caps, p.log); err != nil {
		return nil, err
	}
	if err := checkSteal(cfg, p.caps); err != nil {
		return nil, err
	}
	shared, err := newShared(p)
	if err != nil {
		return nil, err
	}
	p.shared = shared
	p.local = !p.caps.Remote && shared == nil
	if mode, _ := stealMode(cfg, p.caps); mode == StealLocal {
		// A balancer that gives calls to an idle lane first leaves a parked lane nothing to
		// steal for; the others may queue calls on a busy lane while one is idle.
		idleFirst := cfg.Balancer == LeastLoaded || cfg.Balancer == FirstIdle || cfg.Balancer == FirstIdleOrRandom
		p.group = actors.NewLocalGroup(!idleFirst)
	}
	started := false
	defer func() {
		if !started && shared != nil {
			shared.release()
		}
	}()
	obs, err := newMonitor(p)
	if err != nil {
		return nil, err
	}
	p.obs = obs
	if p.runtime, err = rt.open(p); err != nil {
		return nil, err
	}
	if cfg.node { // a node's pool for one host: lanes start as the host opens them (node.go)
		return p, p.startNode()
	}
	if cfg.test.unsupervised {
		for i := range cfg.Lanes {
			w, err := host{p}.StartLane(i, 0)
			if err != nil {
				p.stopLanes()
				_ = p.closeLimits()
				p.closeRuntime()
				return nil, err
			}
			w.Open()
		}
		if err := p.startObserving(); err != nil {
			p.stopLanes()
			_ = p.closeLimits()
			p.closeRuntime()
			return nil, err
		}
		started = true
		return p, nil
	}
	slogger := logging.Slog(p.root)
	tree, err := supervisor.Start(supervisor.Config{
		Lanes: cfg.Lanes, Policy: cfg.Restart.policy(), System: cfg.ActorSystem, Parent: cfg.Parent,
		FailedMessage: func(pool *actor.PID, err error) any { return &PoolFailed{Pool: pool, Err: errorOf(err)} },
		Name:          p.actorName(),
		Logger:        actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slogger }),
	}, host{p})
	if err != nil {
		p.closing.Store(true)
		p.closeEvents()
		_ = p.closeLimits()
		p.closeRuntime()
		return nil, err
	}
	p.tree = tree
	p.up.Store(true)
	if p.caps.Confined {
		p.spares.Refill()
	}
	// A stealing pool of goroutine lanes runs the watchdog too, for its shared-ring backstop
	// (it rings parked lanes while calls wait unclaimed; the per-lane checks are for lanes
	// that can freeze without ending).
	if p.caps.Watched && (cfg.Liveness > 0 || cfg.Process.MaxLaneMemory > 0 || cfg.MoveQueuedAfter > 0) || p.shared != nil {
		p.stopWatch, p.watchDone = make(chan struct{}), make(chan struct{})
		if p.caps.Watched && cfg.MoveQueuedAfter > 0 {
			p.moveWake = make(chan struct{}, 1)
		}
		go p.watchdog(p.stopWatch, p.watchDone)
	}
	if err := p.startObserving(); err != nil {
		_ = p.Close(context.Background())
		return nil, err
	}
	p.log.Debug("pool started", zap.Int("lanes", cfg.Lanes), zap.Stringer("runtime", cfg.Runtime))
	started = true
	return p, nil
}

// laneSpin is the spin budget of lane idx (LaneSpin). By default a spinning lane must have a
// core to itself, and the host's callers need one: of a pool's lanes, GOMAXPROCS-1 spin (the
// lowest, which LeastLoaded fills first), and the others park at once. More spinners than
// cores take turns by scheduler slices, and a call to a spinner whose turn it is not waits
// for one (milliseconds), as its peer, told it is awake, does not ring it.
func (p *Pool) laneSpin(idx int) time.Duration {
	if idx >= p.spinLanes {
		return -1
	}
	return p.cfg.LaneSpin
}

// laneSpinOne is lane idx's spin budget when its calls come one at a time (Config.spinOne):
// as for LaneSpin's default, only the lowest GOMAXPROCS−1 lanes spin.
func (p *Pool) laneSpinOne(idx int) time.Duration {
	if idx >= runtime.GOMAXPROCS(0)-1 {
		return 0
	}
	return p.cfg.spinOne
}

// PID is the pool's supervisor actor, for application actors that watch it.
func (p *Pool) PID() *actor.PID { return p.tree.PID() }

// Events delivers every lifecycle transition, in order, until the pool is closed: first the
// last ones before its first call (up to 64), then every one. Events that find the channel
// full are dropped and counted in Stats.DroppedEvents (Config.OnEvent drops none). Until
// Events is first called, no channel is filled: a program that only uses OnEvent drops
// nothing.
func (p *Pool) Events() <-chan Event { return p.subscribe() }

// host is the pool as the supervision tree sees it.
type host struct{ p *Pool }

// StartLane implements supervisor.Host.
func (h host) StartLane(idx, inc int) (supervisor.Worker, error) {
	p := h.p
	l := newLane(p, idx, inc)
	if err := l.start(); err != nil {
		return nil, err
	}
	if err := l.AwaitReady(); err != nil {
		return nil, err
	}
	return l, nil
}

// Event implements supervisor.Host.
func (h host) Event(se supervisor.Event) {
	p, e := h.p, eventOf(se)
	if ce := p.log.Check(eventLevel(e), eventMessage(e)); ce != nil {
		fields := []zap.Field{zap.Int("lane", e.Lane), zap.Int("incarnation", e.Incarnation), zap.Stringer("from", e.From)}
		if e.Code != "" {
			fields = append(fields, zap.String("code", string(e.Code)))
		}
		if e.Reason != "" {
			fields = append(fields, zap.String("reason", e.Reason))
		}
		if e.To == StateRestarting || e.To == StateCrashLoopBackoff {
			fields = append(fields, zap.Duration("backoff", e.Delay))
		}
		ce.Write(fields...)
	}
	if e.To == StateCrashLoopBackoff || e.To == StateReady {
		p.signal() // calls that fail fast stop waiting; Resize waits for the supervisor's ready
	}
	p.eventLog.add(e)
	p.obs.event(e)
	p.buffer(e) // before OnEvent: what OnEvent has seen, a first Events call delivers
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(e)
	}
}

// buffer sends e to the Events channel once it has been asked for, and remembers it for a
// first call until then.
func (p *Pool) buffer(e Event) {
	p.evMu.Lock()
	defer p.evMu.Unlock()
	if p.evDone {
		return
	}
	if !p.evWanted.Load() {
		p.remember(e)
		return
	}
	select {
	case p.events <- e:
	default:
		p.dropped.Add(1)
	}
}

func eventMessage(e Event) string {
	if e.Lane < 0 {
		return "pool " + e.To.String()
	}
	return "lane " + e.To.String()
}

// eventLevel logs the routine transitions of a first start and of Close at Debug, and
// everything a supervisor has to do something about above it.
func eventLevel(e Event) zapcore.Level {
	switch e.To {
	case StateCrashed, StateExited, StateStartupFailed:
		return zapcore.WarnLevel
	case StateDead, StateFailed, StateCrashLoopBackoff:
		return zapcore.ErrorLevel
	case StateRestarting, StateRecycling, StateRetiring, StateRemoved:
		return zapcore.InfoLevel
	case StateBooting, StateReady:
		if e.Incarnation > 0 {
			return zapcore.InfoLevel
		}
	}
	return zapcore.DebugLevel
}

// Failed implements supervisor.Host.
func (h host) Failed(err error) {
	var e *Error
	if le := (*lifecycle.Error)(nil); errors.As(err, &le) {
		e = fromLifecycle(le)
	} else {
		e = &Error{Code: CodePoolUnavailable, Lane: -1, Cause: err}
	}
	h.p.failed.Store(e)
	if e.Code == CodePoolClosed { // stopped from outside: closed to calls from now on
		h.p.closing.Store(true)
		h.p.wakeReapers()
	}
	if h.p.shared != nil { // no lane will claim what is on the shared ring
		h.p.shared.close(e)
	}
	h.p.signal()
}

// signal wakes calls waiting for a lane.
func (p *Pool) signal() {
	p.changeMu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.changeMu.Unlock()
}

func (p *Pool) changes() <-chan struct{} {
	p.changeMu.Lock()
	defer p.changeMu.Unlock()
	return p.changed
}

func (p *Pool) closeEvents() {
	p.evMu.Lock()
	defer p.evMu.Unlock()
	if !p.evDone {
		p.evDone = true
		if p.events != nil {
			close(p.events)
		}
	}
}

// pick chooses a ready lane for a call.
func (p *Pool) pick(d actors.Def) *lane {
	n := p.laneCount()
	switch p.cfg.Balancer {
	case LeastLoaded:
		return p.leastLoaded(d)
	case FirstIdle, FirstIdleOrRandom:
		if l := p.idleLane(); l != nil {
			return l
		}
	}
	start := 0
	if p.cfg.Balancer == Random || p.cfg.Balancer == FirstIdleOrRandom {
		start = rand.N(n)
	} else {
		start = int(p.rr.Add(1)) % n
	}
	var long *lane // a lane held up by a long call: the last choice (moveQueued)
	for k := range n {
		if l := p.slots[(start+k)%n].cur.Load(); l != nil && l.State() == lifecycle.LaneReady {
			if l.long.Load() == 0 {
				return l
			}
			long = laterLong(long, l)
		}
	}
	return long
}

// idleLane is the lowest ready lane that holds no call of its own (nil: none).
func (p *Pool) idleLane() *lane {
	for i := range p.laneCount() {
		if l := p.slots[i].cur.Load(); l != nil && l.inflight.Load() == 0 && l.State() == lifecycle.LaneReady {
			return l
		}
	}
	return nil
}

// leastLoaded is the first idle lane, else the lane holding the fewest calls (the lower one
// of equals: under a steady load the lanes take turns anyway). A call of task d (nil: not
// known) may go to a spinning lane first (spinner).
func (p *Pool) leastLoaded(d actors.Def) *lane {
	if d != nil && int(d.Index()) < len(p.pace) { // pace is nil where no lane parks at once
		t := &p.pace[d.Index()]
		if l := p.spinner(spinnerFor(t.ns.Load()) / max(t.per, 1)); l != nil {
			return l
		}
	}
	var best, long *lane
	bestLoad := int32(0)
	for i := range p.laneCount() {
		l := p.slots[i].cur.Load()
		if l == nil || l.State() != lifecycle.LaneReady {
			continue
		}
		if l.long.Load() != 0 { // held up by a long call: the last choice (moveQueued)
			long = laterLong(long, l)
			continue
		}
		load := l.inflight.Load()
		if load == 0 {
			return l
		}
		if best == nil || load < bestLoad {
			best, bestLoad = l, load
		}
	}
	return cmp.Or(best, long)
}

// spinnerShare is how many calls of a tiny task a spinning lane of a process pool holds
// at most before LeastLoaded gives calls to a lane that parks. A lane that parks after each
// batch costs the host a futex wake per batch it is given, which took 2 lanes with a window
// of 8 calls from 1.0 M calls/s to 0.18 M, and 8 lanes with a window of 1024 from 2.4 M to
// 0.18 M (docs/benchmarks.md, "Small windows and many process lanes").
const spinnerShare = 32 * fastpath.Slots

// tinyPace is the running time under which a task is tiny: its spinning lane runs its
// calls faster than a caller submits them, so the caller, not the lane, sets the pace, and a
// call queued on the lane waits no longer than it would on another lane.
const tinyPace = time.Microsecond

// spinnerWork bounds what a spinning lane holds of a task that is not tiny, by its pace:
// about what a wake-up costs a parked lane on a loaded machine. Calls slower than that are
// spread by queue depth, as are those of a task whose pace is not known yet: a call queued
// behind a slow one waits for it.
const spinnerWork = 40 * time.Microsecond

// spinnerFor is how many calls of a task that runs pace nanoseconds a spinning lane may
// hold (0: none; the pace is not known, or the task is slower than spinnerWork).
func spinnerFor(pace int64) int32 {
	switch {
	case pace <= 0 || pace >= int64(spinnerWork):
		return 0
	case pace < int64(tinyPace):
		return spinnerShare
	}
	return int32(int64(spinnerWork) / pace)
}

// spinner is the spinning lane holding the fewest calls (the lowest of equals), if it holds
// fewer than share (spinnerFor); nil otherwise (LeastLoaded then spreads the call by queue
// depth).
func (p *Pool) spinner(share int32) *lane {
	var best *lane
	bestLoad := share
	for i := range min(p.spinLanes, p.laneCount()) {
		l := p.slots[i].cur.Load()
		if l == nil || l.State() != lifecycle.LaneReady || l.long.Load() != 0 {
			continue
		}
		if load := l.inflight.Load(); load < bestLoad {
			best, bestLoad = l, load
		}
	}
	return best
}

// pace is a task's running time per call on its lanes, in nanoseconds: avg, what the
// lanes report, averaged so that it rises fast and falls slowly (notePace), which drainers
// update; and ns, what callers read (0: none yet), stored only when it changes what a
// spinning lane may hold by over an eighth (spinnerFor), so that a steady pace costs the
// callers no cache misses.
type pace struct {
	avg atomic.Int64
	_   [56]byte
	ns  atomic.Int64
	per int32 // elements per call: twinChunk for a Map's chunks (actors.TwinSuffix), else 0
	_   [52]byte
}

// notePace adds a call of task index that ran for ran nanoseconds, as its lane reports
// (a hostile lane can only mislead the balancer), to the task's pace. A longer call moves
// the average half way to it, a shorter one a 64th of the way: a task whose calls now and
// then take far longer than the rest (one in 50 sleeps a millisecond) stays slow, as the
// calls queued behind such a call wait for it.
func (p *Pool) notePace(index uint32, ran uint64) {
	if int(index) >= len(p.pace) || ran == 0 {
		return
	}
	t := &p.pace[index]
	v := int64(min(ran, uint64(time.Second)))
	if t.per > 1 {
		v = max(v/int64(t.per), 1)
	}
	switch old := t.avg.Load(); {
	case old == 0:
	case v > old:
		v = old + (v-old)/2
	default:
		v = old - (old-v)/64
	}
	t.avg.Store(v)
	if was, is := spinnerFor(t.ns.Load()), spinnerFor(v); is != was && (was == 0 || is == 0 || max(is-was, was-is) > was/8) {
		t.ns.Store(v)
	}
}

// laneByKey is the lane incarnation a record names, if it is the current one or a recycled
// one still finishing its calls.
func (p *Pool) laneByKey(key int32) *lane {
	if key < 0 || int(key)%maxLanes >= p.laneCount() {
		return nil
	}
	s := &p.slots[int(key)%maxLanes]
	if l := s.cur.Load(); l != nil && l.key == key {
		return l
	}
	if l := s.old.Load(); l != nil && l.key == key {
		return l
	}
	return nil
}

// home is where a dispatched call waits for its result: a lane, or a stealing pool's
// shared ring. A caller that blocks on the result tells it, so that results are drained.
type home interface {
	needReaper()
	doneWaiting()
	drained() bool // results wait for a drainer (process lanes)
	crowded()      // wakes the reapers if more calls wait than a return ring holds
}

// dispatch hands a call to a lane, or to the shared ring of a stealing pool, and returns
// where it went. With no lane ready (they are restarting) it waits within ctx for one.
func (p *Pool) dispatch(ctx context.Context, c actors.Call) (home, error) {
	if p.shared != nil {
		return p.dispatchShared(ctx, c)
	}
	for {
		if p.closing.Load() {
			return nil, p.closedError()
		}
		l := p.pick(c.Def)
		if l == nil {
			if e := p.failed.Load(); e != nil {
				return nil, &Error{Code: e.Code, Lane: -1, Task: c.Def.Name(), Message: e.Message, Cause: e.Cause}
			}
			changed := p.changes()
			if p.closing.Load() {
				// Close may have begun (and stopped every lane) since the check above: its
				// signal came before this changed, so nothing else would wake us.
				return nil, p.closedError()
			}
			if l = p.pick(c.Def); l == nil {
				if p.cfg.FailFast && p.tree != nil && p.tree.AllBackingOff() {
					return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Task: c.Def.Name(),
						Message: "every lane is in crash-loop backoff (Config.FailFast)"}
				}
				select {
				case <-changed:
					continue
				case <-ctx.Done():
					return nil, ctxError(ctx, c.Def)
				}
			}
		}
		err := l.submit(c)
		if err == nil {
			return l, nil
		}
		if err == errLaneGone {
			continue
		}
		if err := p.full(ctx, c, err, l.Idx); err != nil {
			return nil, err
		}
	}
}

// full handles a submit that found a backlog full (lane -1: the shared ring's): with
// BlockWhenFull it waits for room and returns nil (try again), else OVERLOADED.
func (p *Pool) full(ctx context.Context, c actors.Call, err error, lane int) error {
	full, isFull := err.(*actors.BacklogFull)
	switch {
	case isFull && p.cfg.BlockWhenFull:
		select {
		case <-full.Space:
			return nil
		case <-ctx.Done():
			return ctxError(ctx, c.Def)
		}
	default:
		which := "lane"
		if lane < 0 {
			which = "shared"
		}
		return &Error{Code: CodeOverloaded, Lane: lane, Task: c.Def.Name(),
			Message: fmt.Sprintf("%s backlog of %d calls is full", which, p.cfg.Backlog)}
	}
}

// dispatchShared publishes a call on the shared ring, from which the first idle lane takes
// it. A call may wait there while every lane restarts, but not in a pool that has failed.
//
// When the shared ring holds nothing (no call waits there and no lane holds one), a lane
// with nothing of its own is idle: the call goes straight to that lane's own ring, the
// lowest first, as LeastLoaded would send it. A lone call then costs no claim handshake
// and no journal, and a fast call still never waits behind a slow one, as the idle lane
// runs nothing else. Under load the shared ring takes every call, and idle lanes steal.
func (p *Pool) dispatchShared(ctx context.Context, c actors.Call) (home, error) {
	s := p.shared
	for {
		if p.closing.Load() {
			return nil, p.closedError()
		}
		if e := p.failed.Load(); e != nil {
			return nil, &Error{Code: e.Code, Lane: -1, Task: c.Def.Name(), Message: e.Message, Cause: e.Cause}
		}
		if p.cfg.FailFast && p.tree != nil && p.tree.AllBackingOff() {
			return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Task: c.Def.Name(),
				Message: "every lane is in crash-loop backoff (Config.FailFast)"}
		}
		if s.inflight.Load() == 0 && !s.always.Load() {
			if l := p.idleLane(); l != nil {
				if err := l.submit(c); err == nil {
					return l, nil
				}
				// The lane went away or stopped taking calls: the shared ring decides.
			}
		}
		err := s.submit(c)
		if err == nil {
			return s, nil
		}
		if err == errClosed {
			return nil, p.closedError()
		}
		if err := p.full(ctx, c, err, -1); err != nil {
			return nil, err
		}
	}
}

// requeue runs a call that lost its lane on another lane — one that never started there, or
// an Idempotent one — waiting within the call's context for a lane if they are all
// restarting.
func (p *Pool) requeue(r actors.Retry) bool {
	if p.closing.Load() {
		return false
	}
	p.requeued.Add(1) // the call is the pool's while it looks for a lane
	c := actors.Call{Def: r.Def, ID: r.ID, Gen: r.Gen, Lane: r.Lane, Abort: r.Abort, Seq: r.Seq, Payload: r.Payload, Local: r.Local, Done: r.Ctx.Done()}
	if d, ok := r.Ctx.Deadline(); ok && p.caps.Remote {
		c.Deadline = d.UnixNano()
	}
	go func() {
		if r.Ctx.Err() != nil { // its caller gave up: running it again would be for nobody
			r.Fail(ctxError(r.Ctx, r.Def))
		} else if _, err := p.dispatch(r.Ctx, c); err != nil {
			r.Fail(err)
		}
		p.requeued.Add(-1)
		p.callDone()
	}()
	return true
}

var errClosed = &Error{Code: CodePoolClosed, Lane: -1, Message: "pool is closed"}

// closedError is why a closed pool refuses a call: Close, or its end (Stats.Failure).
func (p *Pool) closedError() error {
	if e := p.failed.Load(); e != nil && e.Code == CodePoolClosed {
		return e
	}
	return errClosed
}

// ctxError is the error of a call whose caller's context ended.
func ctxError(ctx context.Context, d actors.Def) error {
	err := ctx.Err()
	code := CodeCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = CodeTimeout
	}
	return &Error{Code: code, Lane: -1, Task: d.Name(), Cause: err}
}

// callDone follows a settled call: while closing, the last one opens Close's drain wait.
// (Calls are counted per lane, where the balancer needs them anyway: a pool-wide count
// would be one more cache line that every call of every lane bounces.)
func (p *Pool) callDone() {
	if p.closing.Load() && p.idle() {
		p.drainMu.Do(func() { close(p.drained) })
	}
}

// idle reports whether no call is in flight: on a lane, in a backlog or looking for a lane.
func (p *Pool) idle() bool {
	if p.requeued.Load() != 0 || p.shared != nil && p.shared.inflight.Load() != 0 {
		return false
	}
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil && l.inflight.Load() != 0 {
				return false
			}
		}
	}
	return true
}

func (p *Pool) wakeReapers() {
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil {
				l.wakeReaper()
			}
		}
	}
}

// Close stops taking calls (they fail with ErrPoolClosed), lets calls in flight finish
// within ctx, then has the supervisor stop the lanes in reverse start order (no restarts
// from then on). Calls still held when ctx ends or when a lane is stopped settle with
// THREAD_CLOSED. A process lane that does not acknowledge its stop request within
// Config.StopAckTimeout is sent SIGTERM, then SIGKILL after KillGrace, and logged at Warn.
// Close returns nil once every call has settled and every lane has ended; it returns an
// error only for what it could not end: goroutine lanes that did not acknowledge (a
// goroutine cannot be killed; it is abandoned and may still run). Close is idempotent and
// safe to call from many goroutines; every call returns the same error.
func (p *Pool) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		defer close(p.closeDone)
		p.closing.Store(true)
		p.signal()
		p.wakeReapers()
		if p.idle() {
			p.drainMu.Do(func() { close(p.drained) })
		}
		select {
		case <-p.drained:
		case <-ctx.Done():
		}
		var unacked []int
		if p.tree != nil {
			unacked = p.tree.Close()
		} else {
			unacked = p.stopLanes()
		}
		if p.watchDone != nil {
			close(p.stopWatch)
			<-p.watchDone
		}
		p.closeRuntime()
		if p.shared != nil {
			p.shared.close(&Error{Code: CodeThreadClosed, Lane: -1, Message: "pool closed"})
			p.shared.release()
		}
		p.spares.Close()
		limitsErr := p.closeLimits()
		p.stopObserving()
		p.closeEvents()
		if len(unacked) > 0 {
			// A process lane that did not acknowledge in time was killed: it has ended, and
			// its calls settled, so Close succeeded (its closed event's reason says how it
			// ended). A goroutine lane cannot be killed: abandoned, it may still run.
			if p.caps.Remote {
				p.log.Warn("lanes did not acknowledge their stop request in time and were killed",
					zap.Ints("lanes", unacked), zap.Duration("stop_ack_timeout", p.cfg.StopAckTimeout))
			} else {
				p.closeErr = &Error{Code: CodeThreadClosed, Lane: -1,
					Message: fmt.Sprintf("lanes %v did not acknowledge their stop request and were abandoned: their goroutines may still run", unacked)}
			}
		}
		if p.closeErr == nil && limitsErr != nil {
			p.closeErr = limitsErr
		}
	})
	<-p.closeDone
	return p.closeErr
}

// stopLanes stops the lanes of an unsupervised pool in reverse order.
func (p *Pool) stopLanes() (unacked []int) {
	for i := p.laneCount() - 1; i >= 0; i-- {
		if l := p.slots[i].cur.Load(); l != nil && !l.Stop() {
			unacked = append(unacked, i)
		}
	}
	return unacked
}
