package supervisor

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/knitgo/knit/lifecycle"
)

// Worker is one incarnation of a lane, as its lane actor sees it.
type Worker interface {
	// Ended is closed once the worker has ended, every call it held is settled and its
	// resources are released.
	Ended() <-chan struct{}
	// End is how it ended; valid once Ended is closed.
	End() End
	// Open lets the worker take calls; the lane actor calls it once it has reported the
	// worker ready.
	Open()
	// Stop runs the stop protocol (request, acknowledgement timeout, kill) and returns once
	// the worker has ended; it reports whether the worker acknowledged in time.
	Stop() (acked bool)
	// Retire is a graceful Stop: the worker takes no new call, finishes the ones it holds
	// (or, once hurry is closed, stops at once), then runs the stop protocol. It returns once
	// the worker has ended.
	Retire(hurry <-chan struct{}) (acked bool)
}

// Host is what a tree supervises: the pool.
type Host interface {
	// StartLane starts incarnation inc of a lane and returns once it is ready to serve, or
	// with its startup error (a *lifecycle.Error).
	StartLane(lane, inc int) (Worker, error)
	// Event reports a transition. Events of one tree are reported one at a time, in order.
	Event(Event)
	// Failed reports that the supervisor gave up: no lane is left. It is also called, with
	// an ErrStoppedOutside error, when the pool actor was stopped by someone else than
	// Close: the tree stops every lane and restarts none.
	Failed(err error)
}

// Config configures a tree.
type Config struct {
	Lanes  int
	Policy Policy // defaults applied by Start
	// System is the actor system to run in; nil starts one that Close shuts down.
	System *actor.ActorSystem
	// Parent, if set, is told with a *PoolFailed message when the tree gives up, or with
	// what FailedMessage makes of the pool actor and the error, if set.
	Parent        *actor.PID
	FailedMessage func(pool *actor.PID, err error) any
	Name          string             // the pool actor's name (unique in System)
	Rand          func() float64     // jitter source (default math/rand/v2.Float64)
	Logger        actor.ConfigOption // for an own system: typically actor.WithLoggerFactory
	// Clock is the tree's only source of time: event times, ready times, the restart
	// decision's now, and the backoff timers (default: the time package). Tests pass a fake
	// one so that a crash-loop backoff of a minute takes no time.
	Clock Clock
}

// Clock is a source of time, as package time provides it.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// realClock is package time.
type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// PoolFailed is sent to Config.Parent when no lane is left.
type PoolFailed struct {
	Pool *actor.PID
	Err  error
}

// Tree is a running supervision tree.
type Tree struct {
	cfg    Config
	host   Host
	sys    *actor.ActorSystem
	own    bool
	pid    *actor.PID
	lanes  []*laneInfo // the pool actor's; others read view
	view   atomic.Pointer[[]*laneInfo]
	evMu   sync.Mutex
	booted chan error
	closed sync.Once
	unack  []int
	// hurry is closed when the tree closes: retiring workers stop waiting for their calls.
	hurry chan struct{}
	// stopped is closed once Close has returned.
	stopped chan struct{}
	// work counts the goroutines that outlive a lane actor's message: replacements booting
	// and recycled workers finishing their calls. Close waits for them.
	work sync.WaitGroup
	// outside is set when the pool actor was stopped by someone else than Close
	// (Root.Stop or Poison of its PID): the lane actors stop their workers as they stop.
	outside atomic.Bool
	gone    chan struct{} // closed when it is
	// hurryOnce closes hurry.
	hurryOnce sync.Once
}

func (t *Tree) hurryUp() { t.hurryOnce.Do(func() { close(t.hurry) }) }

// ErrStoppedOutside is the cause of the pool's end when its actor was stopped from outside
// the pool (Root.Stop or Poison of Pool.PID) rather than by Close.
var ErrStoppedOutside = errors.New("supervisor: the pool actor was stopped from outside (not by Close)")

// laneInfo is what outlives a lane's incarnations.
type laneInfo struct {
	idx int
	pid *actor.PID

	mu          sync.Mutex
	state       State
	incarnation int
	restarts    int
	// started is the worker a boot started whose booted message the lane actor may not
	// have taken yet (under mu): if the tree is stopped from outside meanwhile, whoever
	// sees the other's mark stops it.
	started Worker
	outside bool // under mu: the tree was stopped from outside

	gen  atomic.Int64 // bumped by the pool actor at every restart it orders
	boot atomic.Int64 // the generation the pool actor has let boot (its backoff is over)

	recycles int // under mu: planned replacements
	maxInc   int // under mu: the highest incarnation handed out (never reused)
	// retiring is set while a recycled incarnation finishes its calls: the lane is not
	// recycled again before it has ended (it survives lane actor restarts).
	retiring atomic.Bool
	// grown: added by Resize; its first boot is supervised like a restart. added is the
	// reason its first event carries.
	grown bool
	added string
	// removal is Resize's request to retire the lane, under mu: left on the lane as well as
	// sent, because protoactor may hand the message to a lane actor instance that a restart
	// is about to replace; the next instance finds it here.
	removal *retireLane

	// next is the pool actor's decision on an incarnation that is over (restarting or dead),
	// set under mu before it restarts or stops the lane actor, which records the transition:
	// the lane actor is the only writer of the lane's state.
	next decision

	// pool actor only
	mode  mode
	group *group  // the restart it waits for (stopping, waiting)
	hist  History // the input of its next restart decision
}

// decision is a transition the pool actor decided and the lane actor records.
type decision struct {
	to     State
	reason string
	delay  time.Duration
}

// decide hands the lane actor the transition it is to record next.
func (ln *laneInfo) decide(d decision) {
	ln.mu.Lock()
	ln.next = d
	ln.mu.Unlock()
}

// take returns the decision to record, if it is one of to, and clears it.
func (ln *laneInfo) take(to ...State) (decision, bool) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	d := ln.next
	if d.to == 0 || !slices.Contains(to, d.to) { // Booting, the zero State, is never decided
		return decision{}, false
	}
	ln.next = decision{}
	return d, true
}

type mode int

const (
	live     mode = iota // booting or serving
	stopping             // being stopped so that it restarts with a failed lane
	waiting              // ended, waiting for its group's restart
	dead                 // given up, not to be restarted, or closed
	removing             // retiring for Resize: no longer part of any group
	removed              // retired, about to leave the lane list
)

// group is the lanes that restart together after one failure.
type group struct {
	cause   int   // the lane that failed
	to      State // Restarting, or CrashLoopBackoff: what its lanes wait in
	lanes   []int
	pending int // lanes still stopping
	delay   time.Duration
	timer   Timer
}

// siblingReason is why a lane of g other than its cause restarts.
func (g *group) siblingReason() string {
	if g.to == CrashLoopBackoff {
		return fmt.Sprintf("crash-loop backoff with lane %d", g.cause)
	}
	return fmt.Sprintf("restarting with lane %d", g.cause)
}

const deadLetterInterval = 10 * time.Millisecond

// Start spawns the tree and boots every lane, in parallel. It returns once all are ready, or
// with the first startup error (the tree is then closed).
func Start(cfg Config, h Host) (*Tree, error) {
	cfg.Policy = cfg.Policy.WithDefaults()
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	t := &Tree{cfg: cfg, host: h, sys: cfg.System, booted: make(chan error, 1),
		hurry: make(chan struct{}), stopped: make(chan struct{}), gone: make(chan struct{})}
	if t.sys == nil {
		// protoactor starts a goroutine per dead-letter burst that lives for the throttle
		// interval (1 s by default); keep it short so none outlives Close for long.
		opts := []actor.ConfigOption{actor.WithDeadLetterThrottleInterval(deadLetterInterval)}
		if cfg.Logger != nil {
			opts = append(opts, cfg.Logger)
		}
		t.sys, t.own = actor.NewActorSystem(opts...), true
	}
	for i := range cfg.Lanes {
		t.lanes = append(t.lanes, &laneInfo{idx: i, state: New})
	}
	t.publish()
	pa := &poolActor{t: t, booting: cfg.Lanes}
	props := actor.PropsFromProducer(func() actor.Actor { return pa }, actor.WithSupervisor(pa))
	var err error
	if cfg.Name != "" {
		t.pid, err = t.sys.Root.SpawnNamed(props, cfg.Name)
	} else {
		t.pid = t.sys.Root.Spawn(props)
	}
	if err != nil {
		if t.own {
			t.sys.Shutdown()
		}
		return nil, fmt.Errorf("supervisor: spawning the pool actor: %w", err)
	}
	if err := <-t.booted; err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// PID is the pool actor: application actors may watch it.
func (t *Tree) PID() *actor.PID { return t.pid }

// publish makes the pool actor's lane list the one others read.
func (t *Tree) publish() {
	v := slices.Clone(t.lanes)
	t.view.Store(&v)
}

// lane is lane i as others than the pool actor see it (nil: no such lane).
func (t *Tree) lane(i int) *laneInfo {
	v := *t.view.Load()
	if i < 0 || i >= len(v) {
		return nil
	}
	return v[i]
}

// Lanes is how many lanes the tree has, retiring ones included.
func (t *Tree) Lanes() int { return len(*t.view.Load()) }

// Recycles is how many planned replacements lane i has had.
func (t *Tree) Recycles(i int) int {
	ln := t.lane(i)
	if ln == nil {
		return 0
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.recycles
}

// LaneState is a lane's state, incarnation and number of restarts (New for a lane the tree
// does not have, or no longer has).
func (t *Tree) LaneState(i int) (State, int, int) {
	ln := t.lane(i)
	if ln == nil {
		return New, 0, 0
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.state, ln.incarnation, ln.restarts
}

// AllBackingOff reports whether no lane can serve soon: every lane is in crash-loop backoff
// or dead, and at least one is backing off. A pool whose caller chose to fail fast refuses
// calls then instead of letting them wait up to Backoff.CrashLoopMax.
func (t *Tree) AllBackingOff() bool {
	some := false
	for _, ln := range *t.view.Load() {
		ln.mu.Lock()
		s := ln.state
		ln.mu.Unlock()
		switch s {
		case CrashLoopBackoff:
			some = true
		case Dead:
		default:
			return false
		}
	}
	return some
}

// Close stops accepting restarts, stops every lane in reverse start order and then the
// actors. It returns the lanes that did not acknowledge their stop request. Idempotent.
func (t *Tree) Close() (unacked []int) {
	t.closed.Do(func() {
		t.hurryUp()
		if !t.outside.Load() {
			done := make(chan []int, 1)
			t.sys.Root.Send(t.pid, &closeTree{done: done})
			select {
			case t.unack = <-done:
				_ = t.sys.Root.StopFuture(t.pid).Wait()
			case <-t.gone: // stopped from outside meanwhile: its lane actors stop their workers
			}
		}
		t.work.Wait()
		if t.own {
			t.sys.Shutdown()
		}
		close(t.stopped)
	})
	return t.unack
}

// Recycle asks for a planned replacement of incarnation inc of lane i: its next incarnation
// boots while it serves on, takes its place once ready, and then the recycled one finishes
// its calls and stops (Worker.Retire). It does not wait; a request for an incarnation that
// is no longer current, or for a lane that is already being replaced, is dropped (one for a
// lane whose previous recycled incarnation is still finishing waits for it).
func (t *Tree) Recycle(i, inc int, reason string) {
	select {
	case <-t.hurry:
		return
	default:
	}
	t.sys.Root.Send(t.pid, &recycleReq{lane: i, inc: inc, reason: reason})
}

// ErrClosed is Resize's error once Close has begun.
var ErrClosed = errors.New("supervisor: the tree is closing")

// Resize sets the number of lanes to n (at least 1). New lanes get lane actors and boot at
// once (their first boot supervised like a restart); Resize returns once they are spawned,
// not once they are ready. Removed lanes are the highest ones: each takes no new call,
// finishes what it holds (Worker.Retire) and stops; Resize returns once all have stopped
// and left the tree; once hurry is closed (or Close begins), they stop at once instead of
// finishing their calls. Callers serialise Resize; Close may run at any time, and Resize then
// returns ErrClosed.
func (t *Tree) Resize(n int, hurry <-chan struct{}) error {
	if n < 1 {
		return fmt.Errorf("supervisor: cannot resize to %d lanes", n)
	}
	select {
	case <-t.hurry:
		return ErrClosed
	default:
	}
	done, h := make(chan error, 1), make(chan struct{})
	hurried := false
	defer func() {
		if !hurried {
			close(h)
		}
	}()
	t.sys.Root.Send(t.pid, &resizeTree{n: n, done: done, hurry: h})
	closing := t.hurry
	for {
		select {
		case err := <-done:
			return err
		case <-t.stopped: // closed before the pool actor saw the request
			return ErrClosed
		case <-hurry:
		case <-closing:
		}
		if !hurried {
			close(h)
			hurried = true
		}
		hurry, closing = nil, nil
	}
}

// newInc hands out lane ln's next incarnation number: one more than any before it, so that
// no two incarnations of a lane share one (a recycle boots one while another serves).
func (t *Tree) newInc(ln *laneInfo) int {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	ln.maxInc++
	return ln.maxInc
}

// note reports a transition of an incarnation that is not the lane's current one (a
// recycled incarnation finishing, a replacement booting): the lane's state is left alone.
func (t *Tree) note(lane, inc int, from, to State, code lifecycle.Code, reason string) {
	t.evMu.Lock()
	defer t.evMu.Unlock()
	t.host.Event(Event{Lane: lane, Incarnation: inc, From: from, To: to, Code: code, Reason: reason, Time: t.cfg.Clock.Now()})
}

// Failure is what a lane actor escalates to the pool actor when its lane ends on its own.
type Failure struct {
	Lane, Incarnation int
	End               End
	Up                time.Time // when the incarnation became ready; zero if it never did
}

func (f *Failure) Error() string {
	return fmt.Sprintf("lane %d incarnation %d: %v", f.Lane, f.Incarnation, f.End.Err)
}

// messages
type (
	booted struct {
		w   Worker
		err error
	}
	ended    struct{ w Worker }
	stopDone struct{ acked bool }
	stopLane struct{ gen int64 }
	laneUp   struct{ lane int } // a first boot succeeded
	laneDown struct {
		lane int
		err  error
	} // an initial boot failed
	laneStop struct {
		lane  int
		gen   int64
		acked bool
	}
	restartGo struct{ g *group }
	bootLane  struct{} // a restarted lane actor's go-ahead, once its group's backoff is over
	closeTree struct{ done chan []int }

	recycleReq struct { // Tree.Recycle, to the pool actor
		lane, inc int
		reason    string
	}
	recycleLane struct { // to the lane actor
		inc    int
		reason string
	}
	replaced   struct{ r *replacement } // a replacement's boot is over
	retired    struct{}                 // a recycled incarnation has ended
	retireLane struct {                 // Resize removes the lane
		gen    int64
		reason string
		hurry  chan struct{}
	}
	resizeTree struct {
		n     int
		done  chan error
		hurry chan struct{} // closed when retiring lanes are to stop at once
	}
)

// replacement is a recycle's next incarnation, booting while the current one serves. Its
// boot goroutine and the lane actor settle who owns it with claim: the actor takes it
// (1), or whoever comes first refuses it (2) and the goroutine stops it.
type replacement struct {
	inc     int
	w       Worker
	err     error
	claim   atomic.Int32
	decided chan struct{}
}

// laneActor owns one incarnation at a time; protoactor makes a fresh one per restart.
type laneActor struct {
	t       *Tree
	ln      *laneInfo
	gen     int64
	inc     int
	w       Worker
	phase   phase
	stop    bool // the pool asked for a stop
	acked   bool
	ended   bool
	halted  bool      // Stop returned
	booting bool      // StartLane was called
	up      time.Time // when the incarnation became ready

	replacing *replacement  // a recycle's next incarnation, booting
	pending   string        // a recycle asked for while the previous one finished
	retire    string        // Resize removes the lane: why
	hurry     chan struct{} // … and it stops at once when this is closed
}

type phase int

const (
	phaseBooting phase = iota
	phaseUp
	phaseStopping
	phaseDown
)

func (a *laneActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.gen = a.ln.gen.Load()
		if a.gen > 0 { // a restart: it boots once the pool actor lets it, after the backoff
			a.inc = a.t.newInc(a.ln)
			a.ln.mu.Lock()
			r := a.ln.removal
			a.ln.mu.Unlock()
			if r != nil { // Resize removes the lane: the request reached the instance before
				a.retireNow(ctx, r)
				return
			}
			a.mayBoot(ctx)
			return
		}
		if a.ln.grown { // a lane Resize added: its numbers follow any lane it replaces
			a.inc = a.t.newInc(a.ln)
		}
		a.boot(ctx)
	case *bootLane:
		a.mayBoot(ctx)
	case *actor.Restarting: // the pool actor decided to restart the lane
		if d, ok := a.ln.take(Restarting, CrashLoopBackoff); ok {
			a.record(d.to, "", d.reason, d.delay)
		}
	case *actor.Stopping: // given up (dead), the tree is closing, or stopped from outside
		if d, ok := a.ln.take(Dead); ok {
			a.record(Dead, "", d.reason, 0)
		}
		if a.t.outside.Load() {
			a.stopOutside()
		}
	case *booted:
		a.booted(ctx, m)
	case *stopLane:
		if m.gen < a.gen {
			return // meant for an earlier incarnation
		}
		a.stop = true
		switch {
		case a.phase == phaseUp:
			a.beginStop(ctx)
		case a.phase == phaseDown, !a.booting: // nothing runs, or ever will
			a.phase = phaseDown
			a.reportStopped(ctx)
		}
	case *stopDone:
		a.acked, a.halted = m.acked, true
		a.maybeStopped(ctx)
	case *recycleLane:
		a.recycle(ctx, m.inc, m.reason)
	case *replaced:
		a.replaced(ctx, m.r)
	case *retired:
		if r := a.pending; r != "" {
			a.pending = ""
			a.recycle(ctx, a.inc, r)
		}
	case *retireLane:
		if m.gen < a.gen {
			return
		}
		a.retireNow(ctx, m)
	case *ended:
		if m.w != a.w {
			return // a recycled incarnation: its end is reported where it retires
		}
		a.ended = true
		end := a.w.End()
		code, reason := lifecycle.Code(""), ""
		if end.Err != nil {
			code, reason = end.Err.Code, end.Err.Message
		}
		a.record(stateOf(code), code, reason, 0)
		if a.stop {
			a.maybeStopped(ctx)
			return
		}
		a.phase = phaseDown
		escalate(ctx, &Failure{Lane: a.ln.idx, Incarnation: a.inc, End: end, Up: a.up})
	}
}

// record sets the lane's new state and reports it. It is a lane actor method: no one else
// writes a lane's state.
func (a *laneActor) record(to State, code lifecycle.Code, reason string, delay time.Duration) {
	t, ln := a.t, a.ln
	t.evMu.Lock()
	defer t.evMu.Unlock()
	ln.mu.Lock()
	from := ln.state
	ln.state, ln.incarnation = to, a.inc
	switch to {
	case Restarting, CrashLoopBackoff:
		ln.restarts++
	case Recycling:
		ln.recycles++
	}
	ln.mu.Unlock()
	t.host.Event(Event{Lane: ln.idx, Incarnation: a.inc, From: from, To: to, Code: code, Reason: reason, Delay: delay, Time: t.cfg.Clock.Now()})
}

// mayBoot boots a restarted lane actor's incarnation once the pool actor has let it. The
// go-ahead is on the lane, and bootLane only a nudge: protoactor does not order a system
// message (the restart) before a user message sent after it, so the previous instance may
// have taken the nudge.
func (a *laneActor) mayBoot(ctx actor.Context) {
	if !a.booting && !a.stop && a.ln.boot.Load() == a.gen {
		a.boot(ctx)
	}
}

// boot starts the actor's incarnation, in a goroutine so that the mailbox stays free.
func (a *laneActor) boot(ctx actor.Context) {
	a.booting = true
	reason := ""
	if a.gen == 0 {
		reason = a.ln.added
	}
	a.record(Booting, "", reason, 0)
	self, root, host, idx, inc := ctx.Self(), ctx.ActorSystem().Root, a.t.host, a.ln.idx, a.inc
	ln := a.ln
	go func() {
		w, err := host.StartLane(idx, inc)
		ln.mu.Lock()
		if ln.outside { // the lane actor has stopped: nobody takes the message
			ln.mu.Unlock()
			if w != nil {
				w.Stop()
			}
			return
		}
		ln.started = w
		ln.mu.Unlock()
		root.Send(self, &booted{w: w, err: err})
	}()
}

func (a *laneActor) booted(ctx actor.Context, m *booted) {
	if m.err != nil {
		a.phase = phaseDown
		le := asLifecycle(m.err, a.ln.idx)
		a.record(StartupFailed, le.Code, le.Message, 0)
		switch {
		case a.stop:
			a.reportStopped(ctx)
		case a.gen == 0 && !a.ln.grown:
			ctx.Send(ctx.Parent(), &laneDown{lane: a.ln.idx, err: m.err})
		default:
			escalate(ctx, &Failure{Lane: a.ln.idx, Incarnation: a.inc, End: End{Err: le}})
		}
		return
	}
	a.ln.mu.Lock()
	a.ln.started = nil
	a.ln.mu.Unlock()
	a.w, a.phase = m.w, phaseUp
	m.w.Open() // first: whoever reacts to the ready event finds the lane taking calls
	a.record(Ready, "", "", 0)
	a.up = a.t.cfg.Clock.Now()
	if a.gen == 0 && !a.ln.grown { // a first boot: Start waits for every lane's
		ctx.Send(ctx.Parent(), &laneUp{lane: a.ln.idx})
	}
	a.watch(ctx, m.w)
	if a.stop {
		a.beginStop(ctx)
	}
}

// watch tells the actor when w has ended.
func (a *laneActor) watch(ctx actor.Context, w Worker) {
	self, root, t := ctx.Self(), ctx.ActorSystem().Root, a.t
	go func() {
		<-w.Ended()
		if !t.outside.Load() { // else the actor has stopped: nobody takes the message
			root.Send(self, &ended{w: w})
		}
	}()
}

// recycle starts a planned replacement of incarnation inc: the next incarnation boots while
// the current one serves on (see replaced).
func (a *laneActor) recycle(ctx actor.Context, inc int, reason string) {
	if inc != a.inc || a.phase != phaseUp || a.stop || a.replacing != nil {
		return
	}
	if a.ln.retiring.Load() { // the previous recycled incarnation is still finishing
		a.pending = reason
		return
	}
	t, ln := a.t, a.ln
	a.record(Recycling, "", reason, 0)
	r := &replacement{inc: t.newInc(ln), decided: make(chan struct{})}
	a.replacing = r
	t.note(ln.idx, r.inc, Recycling, Booting, "", fmt.Sprintf("replaces incarnation %d", a.inc))
	self, root, host, idx := ctx.Self(), ctx.ActorSystem().Root, t.host, ln.idx
	t.work.Add(1)
	go func() {
		defer t.work.Done()
		r.w, r.err = host.StartLane(idx, r.inc)
		root.Send(self, &replaced{r: r})
		if r.err != nil {
			return
		}
		select {
		case <-r.decided:
		case <-t.hurry:
		}
		if r.claim.CompareAndSwap(0, 2) || r.claim.Load() == 2 {
			r.w.Stop()
			end := r.w.End()
			code, reason := lifecycle.Code(""), ""
			if end.Err != nil {
				code, reason = end.Err.Code, end.Err.Message
			}
			t.note(idx, r.inc, Booting, stateOf(code), code, "replacement not needed: "+reason)
		}
	}()
}

// replaced takes a recycle's replacement: it opens the new incarnation (which takes calls
// from now on) and has the recycled one finish its calls and stop in the background. A
// replacement that did not boot leaves the current incarnation serving; the next trigger
// tries again.
func (a *laneActor) replaced(ctx actor.Context, r *replacement) {
	if a.replacing != r { // from before a restart of this actor
		close(r.decided)
		return
	}
	a.replacing = nil
	t, ln := a.t, a.ln
	if r.err != nil {
		le := asLifecycle(r.err, ln.idx)
		t.note(ln.idx, r.inc, Booting, StartupFailed, le.Code, le.Message)
		a.record(Ready, "", "recycle failed: the replacement did not start; serving on", 0)
		return
	}
	if a.stop || a.phase != phaseUp || !r.claim.CompareAndSwap(0, 1) {
		close(r.decided)
		return
	}
	close(r.decided)
	old, oldInc := a.w, a.inc
	a.w, a.inc = r.w, r.inc
	ln.retiring.Store(true)
	r.w.Open() // first: whoever reacts to the ready event finds the lane taking calls
	a.record(Ready, "", fmt.Sprintf("replaces incarnation %d", oldInc), 0)
	a.up = t.cfg.Clock.Now()
	a.watch(ctx, r.w)
	self, root, idx := ctx.Self(), ctx.ActorSystem().Root, ln.idx
	t.work.Add(1)
	go func() {
		defer t.work.Done()
		t.note(idx, oldInc, Recycling, Stopping, "", fmt.Sprintf("recycled: replaced by incarnation %d; finishing its calls", r.inc))
		old.Retire(t.hurry)
		end := old.End()
		code, reason := lifecycle.Code(""), ""
		if end.Err != nil {
			code, reason = end.Err.Code, end.Err.Message
		}
		t.note(idx, oldInc, Stopping, stateOf(code), code, reason)
		ln.retiring.Store(false)
		select {
		case <-t.hurry:
		default:
			root.Send(self, &retired{})
		}
	}()
}

// retireNow carries out Resize's removal of the lane: a serving worker retires, and the
// actor reports the lane stopped once nothing runs.
func (a *laneActor) retireNow(ctx actor.Context, m *retireLane) {
	if a.retire != "" {
		return // already under way
	}
	a.stop, a.retire, a.hurry = true, m.reason, m.hurry
	switch {
	case a.phase == phaseUp:
		a.beginRetire(ctx)
	case a.phase == phaseDown, !a.booting:
		a.phase = phaseDown
		a.reportStopped(ctx)
	}
}

// beginRetire removes the lane for Resize: its worker finishes its calls and stops.
func (a *laneActor) beginRetire(ctx actor.Context) {
	a.phase = phaseStopping
	a.record(Retiring, "", a.retire, 0)
	self, root, w, hurry := ctx.Self(), ctx.ActorSystem().Root, a.w, a.hurry
	go func() { root.Send(self, &stopDone{acked: w.Retire(hurry)}) }()
}

func (a *laneActor) beginStop(ctx actor.Context) {
	a.phase = phaseStopping
	a.record(Stopping, "", "stop requested", 0)
	self, root, w := ctx.Self(), ctx.ActorSystem().Root, a.w
	go func() { root.Send(self, &stopDone{acked: w.Stop()}) }()
}

// maybeStopped reports a requested stop once the worker has ended and Stop has returned.
func (a *laneActor) maybeStopped(ctx actor.Context) {
	if a.ended && a.halted {
		a.phase = phaseDown
		a.reportStopped(ctx)
	}
}

func (a *laneActor) reportStopped(ctx actor.Context) {
	ctx.Send(ctx.Parent(), &laneStop{lane: a.ln.idx, gen: a.gen, acked: a.acked || !a.halted})
}

func asLifecycle(err error, lane int) *lifecycle.Error {
	var le *lifecycle.Error
	if errors.As(err, &le) {
		return le
	}
	return &lifecycle.Error{Code: lifecycle.CodeStartupFailed, Lane: lane, Message: err.Error(), Cause: err}
}

// poolActor is the lanes' parent and their SupervisorStrategy.
type poolActor struct {
	t       *Tree
	self    *actor.PID // not t.pid: the actor runs before Spawn has returned it
	booting int        // lanes whose first boot has not reported
	bootErr error
	closing bool
	order   []int // lanes still to stop at Close, in order
	waitFor int   // the lane being stopped at Close, or -1
	unacked []int
	done    chan []int
	failed  bool
	// lastGiveUp is why the last lane was given up: the pool's failure names it.
	lastGiveUp string
	// A shrinking Resize: lanes still retiring, and its answer.
	removing int
	resized  chan error
	// lastInc is the last incarnation of each lane index Resize removed: a lane added
	// there later goes on from it, so that no two incarnations of a lane index share a number.
	lastInc map[int]int
}

func (p *poolActor) Receive(ctx actor.Context) {
	t := p.t
	switch m := ctx.Message().(type) {
	case *actor.Stopping:
		// Close stops the actor once its protocol has answered (p.done is nil again); any
		// other stop is an application's Root.Stop or Poison of the pool's actor.
		if !p.closing || p.done != nil {
			if p.done != nil {
				p.done <- p.unacked
				p.done = nil
			}
			t.stoppedOutside()
		}
	case *actor.Started:
		p.self = ctx.Self()
		for _, ln := range t.lanes {
			ln.pid = ctx.Spawn(actor.PropsFromProducer(func() actor.Actor { return &laneActor{t: t, ln: ln} }))
		}
	case *laneUp:
		p.booting--
		p.bootDone()
	case *laneDown:
		t.lanes[m.lane].mode = dead
		if p.bootErr == nil {
			p.bootErr = m.err
		}
		p.booting--
		p.bootDone()
	case *laneStop:
		p.laneStopped(ctx.(actor.Supervisor), m.lane, m.gen, m.acked)
	case *actor.Terminated: // a lane actor given up has stopped, its dead state recorded
		if !p.closing {
			p.checkFailed()
		}
	case *restartGo:
		p.restart(ctx, m.g)
	case *recycleReq:
		if !p.closing && m.lane < len(t.lanes) && t.lanes[m.lane].mode == live {
			ctx.Send(t.lanes[m.lane].pid, &recycleLane{inc: m.inc, reason: m.reason})
		}
	case *resizeTree:
		p.resize(ctx, m)
	case *closeTree:
		if p.resized != nil {
			p.resized <- ErrClosed
			p.resized = nil
		}
		p.closing, p.done, p.waitFor = true, m.done, -1
		for _, ln := range t.lanes {
			if g := ln.group; g != nil && g.timer != nil {
				g.timer.Stop()
			}
		}
		for i := len(t.lanes) - 1; i >= 0; i-- {
			p.order = append(p.order, i)
		}
		p.closeNext()
	}
}

func (p *poolActor) bootDone() {
	if p.booting == 0 {
		p.t.booted <- p.bootErr
	}
}

// closeNext asks the next lane that may still have a worker to stop, or answers Close.
func (p *poolActor) closeNext() {
	for len(p.order) > 0 {
		i := p.order[0]
		p.order = p.order[1:]
		ln := p.t.lanes[i]
		if ln.mode == live || ln.mode == stopping || ln.mode == removing {
			p.waitFor = i
			p.t.sys.Root.Send(ln.pid, &stopLane{gen: ln.gen.Load()})
			return
		}
		ln.mode = dead
	}
	p.waitFor = -1
	if p.done != nil {
		p.done <- p.unacked
		p.done = nil
	}
}

func (p *poolActor) laneStopped(sup actor.Supervisor, lane int, gen int64, acked bool) {
	ln := p.t.lanes[lane]
	switch {
	case gen < ln.gen.Load():
		// a report from before a restart
	case ln.mode == removing && !p.closing:
		p.laneRemoved(ln)
	case p.closing:
		if lane == p.waitFor {
			if !acked {
				p.unacked = append(p.unacked, lane)
			}
			ln.mode = dead
			p.closeNext()
		}
	case ln.mode == stopping:
		p.wait(sup, ln, ln.group.siblingReason())
	}
}

// wait puts a lane of a group whose incarnation is over in waiting: its lane actor is
// restarted now (recording restarting or crash_loop_backoff) and its next instance boots when
// the group's backoff is over. The last one to wait starts the backoff.
func (p *poolActor) wait(sup actor.Supervisor, ln *laneInfo, reason string) {
	g := ln.group
	ln.mode = waiting
	ln.decide(decision{to: g.to, reason: reason, delay: g.delay})
	ln.gen.Add(1)
	sup.RestartChildren(ln.pid)
	if ln.idx != g.cause {
		g.pending--
	}
	p.groupWaits(g)
}

// groupWaits starts a group's backoff once none of its lanes is still stopping.
func (p *poolActor) groupWaits(g *group) {
	if g.pending > 0 {
		return
	}
	self, root := p.self, p.t.sys.Root
	if g.delay <= 0 {
		root.Send(self, &restartGo{g: g})
		return
	}
	g.timer = p.t.cfg.Clock.AfterFunc(g.delay, func() { root.Send(self, &restartGo{g: g}) })
}

// restart boots the next incarnation of a group's lanes, in start order.
func (p *poolActor) restart(ctx actor.Context, g *group) {
	if p.closing {
		return
	}
	for _, i := range g.lanes {
		ln := p.t.lanes[i]
		if ln.mode != waiting || ln.group != g {
			continue
		}
		ln.mode, ln.group = live, nil
		ln.boot.Store(ln.gen.Load())
		ctx.Send(ln.pid, &bootLane{})
	}
}

// HandleFailure implements actor.SupervisorStrategy: a lane ended on its own.
func (p *poolActor) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	f, ok := reason.(*Failure)
	if !ok { // not a lane failure: a bug in a lane actor; give the lane up
		for _, ln := range p.t.lanes {
			if ln.pid.Equal(child) {
				p.giveUp(sup, ln, fmt.Sprintf("lane actor failed: %v", reason))
			}
		}
		return
	}
	if f.Lane >= len(p.t.lanes) {
		sup.StopChildren(child)
		return
	}
	ln := p.t.lanes[f.Lane]
	switch {
	case p.closing:
		ln.mode = dead
		if f.Lane == p.waitFor {
			p.closeNext()
		}
		return
	case ln.mode == removing: // it ended on its own before it saw Resize's request
		sup.StopChildren(child)
		p.laneRemoved(ln)
		return
	case ln.mode == stopping: // it ended on its own while its group stopped it
		p.wait(sup, ln, ln.group.siblingReason())
		return
	}
	up := make([]bool, len(p.t.lanes))
	for i, o := range p.t.lanes {
		up[i] = o.mode == live
	}
	d, hist := Decide(p.t.cfg.Policy, ln.hist, *f, p.t.cfg.Clock.Now(), up, p.t.cfg.Rand())
	ln.hist = hist
	if d.To == Dead {
		p.giveUp(sup, ln, d.Reason)
		return
	}
	// Carry the decision out: stop the siblings it takes along, then wait for the backoff.
	g := &group{cause: f.Lane, to: d.To, lanes: d.Group, delay: d.Delay}
	for _, i := range d.Group {
		if o := p.t.lanes[i]; o != ln {
			o.mode, o.group = stopping, g
			g.pending++
			p.t.sys.Root.Send(o.pid, &stopLane{gen: o.gen.Load()})
		}
	}
	ln.group = g
	p.wait(sup, ln, d.Reason)
}

// giveUp stops a lane's actor, which records it dead; once it has stopped, checkFailed
// sees whether any lane is left.
func (p *poolActor) giveUp(sup actor.Supervisor, ln *laneInfo, reason string) {
	ln.mode = dead
	p.lastGiveUp = reason
	ln.decide(decision{to: Dead, reason: reason})
	sup.StopChildren(ln.pid)
}

// checkFailed fails the pool when every lane is dead.
func (p *poolActor) checkFailed() {
	for _, o := range p.t.lanes {
		if o.mode != dead {
			return
		}
	}
	if p.failed {
		return
	}
	p.failed = true
	err := &lifecycle.Error{Code: lifecycle.CodePoolUnavailable, Lane: -1, Message: "the supervisor gave up every lane: " + p.lastGiveUp}
	p.t.host.Failed(err)
	p.t.evMu.Lock()
	p.t.host.Event(Event{Lane: -1, From: Ready, To: Failed, Code: err.Code, Reason: err.Message, Time: p.t.cfg.Clock.Now()})
	p.t.evMu.Unlock()
	if parent := p.t.cfg.Parent; parent != nil {
		var msg any = &PoolFailed{Pool: p.self, Err: err}
		if f := p.t.cfg.FailedMessage; f != nil {
			msg = f(p.self, err)
		}
		p.t.sys.Root.Send(parent, msg)
	}
}

// escalate reports a lane failure to the pool actor, through protoactor's supervision.
func escalate(ctx actor.Context, f *Failure) {
	ctx.(actor.Supervisor).EscalateFailure(f, nil)
}

// resize grows or shrinks the lane list (Tree.Resize).
func (p *poolActor) resize(ctx actor.Context, m *resizeTree) {
	t := p.t
	switch {
	case p.closing:
		m.done <- ErrClosed
		return
	case p.resized != nil:
		m.done <- errors.New("supervisor: a Resize is already running")
		return
	}
	cur := len(t.lanes)
	if m.n > cur {
		// New lanes start after every other: RestForOne takes them along with any lane
		// below them, as lane order is start order.
		for i := cur; i < m.n; i++ {
			ln := &laneInfo{idx: i, state: New, grown: true, added: fmt.Sprintf("added: pool resized to %d lanes", m.n), maxInc: -1}
			if last, ok := p.lastInc[i]; ok {
				ln.maxInc = last
			}
			t.lanes = append(t.lanes, ln)
			ln.pid = ctx.Spawn(actor.PropsFromProducer(func() actor.Actor { return &laneActor{t: t, ln: ln} }))
		}
		t.publish()
		m.done <- nil
		return
	}
	if m.n == cur {
		m.done <- nil
		return
	}
	reason := fmt.Sprintf("pool resized to %d lanes", m.n)
	p.resized = m.done
	for i := cur - 1; i >= m.n; i-- {
		ln := t.lanes[i]
		switch ln.mode {
		case dead, removed, removing:
			ln.mode = removed
			continue
		case stopping: // its group restarts without it
			ln.group.pending--
			p.groupWaits(ln.group)
		}
		ln.mode, ln.group = removing, nil
		p.removing++
		r := &retireLane{gen: ln.gen.Load(), reason: reason, hurry: m.hurry}
		ln.mu.Lock()
		ln.removal = r
		ln.mu.Unlock()
		ctx.Send(ln.pid, r)
	}
	p.shrunk()
}

// laneRemoved notes that a retiring lane has stopped.
func (p *poolActor) laneRemoved(ln *laneInfo) {
	ln.mode = removed
	p.removing--
	p.shrunk()
}

// shrunk drops the removed lanes off the end of the list once none is still retiring, and
// answers Resize.
func (p *poolActor) shrunk() {
	t := p.t
	if p.removing > 0 || p.resized == nil {
		return
	}
	n := len(t.lanes)
	for n > 0 && t.lanes[n-1].mode == removed {
		n--
	}
	if p.lastInc == nil {
		p.lastInc = map[int]int{}
	}
	for _, ln := range t.lanes[n:] {
		t.sys.Root.Stop(ln.pid)
		ln.mu.Lock()
		from, inc := ln.state, ln.incarnation
		p.lastInc[ln.idx] = ln.maxInc
		ln.state = Removed
		ln.mu.Unlock()
		t.evMu.Lock()
		t.host.Event(Event{Lane: ln.idx, Incarnation: inc, From: from, To: Removed, Reason: "lane removed", Time: t.cfg.Clock.Now()})
		t.evMu.Unlock()
	}
	t.lanes = t.lanes[:n:n]
	t.publish()
	p.resized <- nil
	p.resized = nil
	p.checkFailed()
}

// stoppedOutside begins the end of a tree whose pool actor was stopped by someone else than
// Close: nothing restarts from now on, calls are refused (the host is told, as when every
// lane is given up), retiring lanes stop waiting for their calls, and each lane actor stops
// its worker as it stops (stopOutside). It runs in the pool actor, before its children
// stop.
func (t *Tree) stoppedOutside() {
	t.outside.Store(true)
	close(t.gone)
	t.hurryUp()
	t.host.Failed(&lifecycle.Error{Code: lifecycle.CodePoolClosed, Lane: -1, Message: "the pool's supervisor actor was stopped from outside the pool", Cause: ErrStoppedOutside})
}

// stopOutside stops the lane's worker, and one a boot has started and not handed over,
// when the tree was stopped from outside: its calls settle as at Close, and a process
// lane's process ends.
func (a *laneActor) stopOutside() {
	ln := a.ln
	ln.mu.Lock()
	ln.outside = true
	pending := ln.started
	ln.started = nil
	ln.mu.Unlock()
	for _, w := range []Worker{a.w, pending} {
		if w == nil || (w == a.w && a.phase != phaseUp && a.phase != phaseStopping) {
			continue
		}
		a.t.work.Add(1)
		go func() {
			defer a.t.work.Done()
			w.Stop()
		}()
	}
	a.record(Closed, lifecycle.CodeThreadClosed, "the pool's supervisor actor was stopped from outside the pool", 0)
}
