package remote

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/latency"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
)

// An incarnation is one start of a remote lane, as its host sees it: a region in the host's
// heap and the forwarder goroutine (run) at its far end, which is the only consumer of its
// request ring and the only producer of its return ring, as a lane's executor is.
//
// Flow control is the lane's own: the forwarder keeps at most Window calls on the node or
// waiting for a return slot, with at most an arena's worth of inputs; the calls beyond wait
// in the request ring and the lane's backlog, as they do for any lane.
type incarnation struct {
	n        *Nodes
	k        *link
	idx, inc int
	session  Session

	region   *fastpath.Region
	laneBell *fastpath.ChanBell
	doneBell *fastpath.ChanBell
	dirBell  fastpath.Bell // its direct completion's: a channel (results are published here)
	wake     *fastpath.Wake
	req      *fastpath.Consumer
	ret      *fastpath.Producer
	stats    fastpath.Stats
	aborts   fastpath.Bitmap
	launch   lifecycle.Launch
	ready    chan struct{}
	readyNow atomic.Bool

	// The inbox: what the endpoint's actor, the link and the pool hand the forwarder.
	mu      sync.Mutex
	frames  []Frame // Ready, Failed and Ended frames of this incarnation, in order
	lostWhy string  // the node was lost
	killWhy string  // end now: the host gave up on the lane (startup timeout, SIGKILL step)
	hardWhy string  // kill on the node: a hard timeout; the end comes with the node's report
	term    bool    // the stop protocol's SIGTERM step: kill on the node
	posted  atomic.Bool
	kicked  chan struct{} // closed by kill: a connection attempt gives up
	kickOne sync.Once

	// Under mu too: the calls on the node, and the results. The endpoint's actor publishes
	// results as their frames come (the return ring's one producer, with finish); the
	// forwarder sends calls.
	out       [2 * Window]sent // by sequence number mod 2×Window: the calls on the node
	nOut      int              // calls sent and not published
	bytesOut  int              // their inputs' bytes
	byteBound bool             // the next call does not fit in the window's bytes (fits)
	pending   []Result         // received, waiting for a return slot
	brokeWhy  string           // a result broke the protocol: the forwarder ends the lane
	starved   bool             // the forwarder waits for room in its window
	full      bool             // results wait for room on the return ring: see hasRoom
	fullAt    uint32           // the return ring's consumer word when it was full
	over      bool             // the incarnation has ended: results are not published

	// The forwarder's own state.
	lastSent  uint64
	ready2    bool // the node reported ready
	stopSent  bool
	killSent  bool
	acked     bool
	abortSeen atomic.Uint32 // the region's abort counter when the forwarder last looked
	abortFlag atomic.Bool   // the link saw the abort counter move
	inferred  atomic.Bool   // at its end: what had started was inferred (Inferred)

	// The link's own (checkStalled): whether its last look found the forwarder parked
	// with calls it could send, and the request ring's consumer word then.
	stall   bool
	stallAt uint32
}

// sent is a call the forwarder has sent and not had the result of.
type sent struct {
	seq           uint64
	fn, id, gen   uint32
	abort         uint32 // the slot's abort field: bit+1, 0 for none
	size          int    // the input's bytes
	live, cancels bool
}

func (c *incarnation) Region() *fastpath.Region  { return c.region }
func (c *incarnation) LaneBell() fastpath.Bell   { return c.laneBell }
func (c *incarnation) DoneBell() fastpath.Bell   { return c.doneBell }
func (c *incarnation) DirectBell() fastpath.Bell { return c.dirBell }
func (c *incarnation) Remote() bool              { return true }
func (c *incarnation) Ready() <-chan struct{}    { return c.ready }
func (c *incarnation) Poll()                     {}
func (c *incarnation) PID() int                  { return 0 }
func (c *incarnation) Close()                    {}

// Inferred reports whether what the lane had started when it ended was inferred by the host
// (its node was lost), not reported by its node: then any call sent may have been running.
func (c *incarnation) Inferred() bool { return c.inferred.Load() }

// Node is the address of the node the incarnation runs on.
func (c *incarnation) Node() string { return c.k.addr }

func (c *incarnation) isReady() bool { return c.readyNow.Load() }

// Start implements lifecycle.Incarnation: the forwarder connects to the node, opens the
// lane there and serves it.
func (c *incarnation) Start(l lifecycle.Launch) error {
	c.launch = l
	go c.run()
	return nil
}

// AwaitReady implements lifecycle.Incarnation.
func (c *incarnation) AwaitReady(ended <-chan struct{}) bool {
	t := time.NewTimer(c.n.cfg.StartupTimeout)
	defer t.Stop()
	select {
	case <-c.ready:
		return true
	case <-ended:
	case <-t.C:
		c.Kill(lifecycle.Exit{Startup: c.n.cfg.StartupTimeout})
		<-ended
	}
	return false
}

// Signal implements lifecycle.Incarnation: the stop protocol's SIGTERM has the node kill
// the lane; its SIGKILL gives up on the node and ends the lane here at once.
func (c *incarnation) Signal() func(sig syscall.Signal) {
	return func(sig syscall.Signal) {
		if sig == syscall.SIGKILL {
			c.Kill(lifecycle.Exit{Stopping: true})
			return
		}
		c.mu.Lock()
		c.term = true
		c.mu.Unlock()
		c.notify()
	}
}

// Kill implements lifecycle.Incarnation. A hard timeout is the node's to carry out: the
// lane ends when the node reports how (its calls' fates depend on what had started). Every
// other kill ends the lane here at once, and the node is told to kill it.
func (c *incarnation) Kill(why lifecycle.Exit) bool {
	c.mu.Lock()
	switch {
	case why.HardTimeout != "":
		if c.hardWhy == "" {
			c.hardWhy = why.HardTimeout
		}
	case why.Startup > 0:
		c.killWhy = fmt.Sprintf("not ready within the startup timeout of %v", why.Startup)
	case why.Unresponsive != "":
		c.killWhy = "unresponsive: " + why.Unresponsive
	case why.Corrupt != nil:
		c.killWhy = "corrupt ring: " + why.Corrupt.Error()
	default:
		c.killWhy = "killed by the host"
	}
	c.mu.Unlock()
	c.kickOne.Do(func() { close(c.kicked) })
	c.notify()
	return true
}

// post hands the forwarder a frame of its incarnation.
func (c *incarnation) post(f Frame) {
	c.mu.Lock()
	c.frames = append(c.frames, f)
	c.mu.Unlock()
	c.notify()
}

// lost tells the forwarder the node is lost.
func (c *incarnation) lost(why string) {
	c.mu.Lock()
	if c.lostWhy == "" {
		c.lostWhy = why
	}
	c.mu.Unlock()
	c.kickOne.Do(func() { close(c.kicked) })
	c.notify()
}

// checkAborts wakes the forwarder if a call's abort bit was raised since it last looked
// (the link's heartbeat calls it: an abort raised while the lane sleeps rings nothing).
func (c *incarnation) checkAborts() {
	if c.region.AbortWake().Load() != c.abortSeen.Load() {
		c.abortFlag.Store(true)
		c.notify()
	}
}

// checkStalled is the backstop of the forwarder's doorbell, as the pool's watchdog is a
// process lane's (ringStalled): the link's heartbeat calls it every Liveness/4. Calls the
// forwarder has room to send, unread in the request ring at two looks in a row while the
// forwarder stays parked and reads nothing of the ring in between, mean a wake was lost:
// the forwarder is rung, and the miss is counted (Nodes.Missed) and logged. The protocol
// loses no wake (work and results share the starved mark under mu); this keeps a bug in it
// from stranding calls for ever.
func (c *incarnation) checkStalled() {
	req := c.region.Requests()
	awake, _ := c.wake.Awake()
	if !c.readyNow.Load() || awake || c.posted.Load() || !req.Unread() {
		c.stall = false
		return
	}
	c.mu.Lock()
	room := c.sendable()
	c.mu.Unlock()
	if room <= 0 { // parked on purpose: results ring it once room frees
		c.stall = false
		return
	}
	consumed := req.Consumed()
	if c.stall && consumed == c.stallAt {
		c.stall = false
		c.n.missed.Add(1)
		c.n.log.Warn("a remote lane's forwarder slept through calls it could send: woken by the heartbeat (a lost wake: please report)",
			zap.Int("lane", c.idx), zap.Int("incarnation", c.inc), zap.String("node", c.k.addr))
		c.notify()
		return
	}
	c.stall, c.stallAt = true, consumed
}

// signalDone rings whoever sleeps on the return ring: the pool's reaper on the completion
// doorbell, or a caller alone on the lane on the direct one (Ring.Direct), as an executor
// does after publishing results.
func (c *incarnation) signalDone() {
	c.region.Returns().Completion().Signal(c.doneBell)
	c.region.Returns().Direct().Signal(c.dirBell)
}

func (c *incarnation) notify() {
	c.posted.Store(true)
	c.wake.Force(c.laneBell)
}

// work reports whether the forwarder has something to do (Park's ready).
func (c *incarnation) work() bool {
	if c.posted.Load() || c.abortFlag.Load() {
		return true
	}
	if !c.ready2 {
		return false
	}
	calls := c.req.Poll() != 0
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.sendable()
	if calls && room <= 0 {
		// The forwarder parks with calls waiting and no room in its window: it is starved,
		// and the endpoint's actor must ring it once results free room (results). Without
		// the mark, a window filled to the last slot by a forward that sent every call it
		// saw would park here unmarked, and results would free room without ringing: the
		// pool rang while the forwarder was awake, so no ring was left for it.
		c.starved = true
	}
	if calls && room > 0 || len(c.pending) > 0 && c.hasRoom() {
		return true
	}
	// A stop request waits for the last call on the node; results ring for it (results).
	return !c.acked && c.nOut == 0 && c.region.Stop().Load() == fastpath.StopRequested
}

// Window is how many calls a remote lane keeps on its node at most (sent, and not yet
// published on its return ring): a round trip over the network takes far longer than a
// local lane's, so the window is wider than a ring's 32 slots. Their inputs together take
// at most the lane's arena (Layout.Arena), as they would on a local lane's ring; one call
// is always let through.
const Window = 256

// room is how many more calls the forwarder may send: a window's worth are on the node or
// wait for a return slot at most. (Results published and not drained yet do not count:
// the window bounds what the node holds, the return ring what the pool has not drained. A
// result that finds the return ring full waits in pending, and the forwarder parks until
// the pool's drain rings it: hasRoom.) Called with mu held.
func (c *incarnation) room() int { return Window - c.nOut }

// sendable is how many calls the forwarder sends now: its room, except that once the window
// has filled it waits until half of it is free again, or nothing is left on the node (a
// window refilled a call at a time would cost a frame a call). Called with mu held.
func (c *incarnation) sendable() int {
	room := c.room()
	if c.byteBound {
		return 0
	}
	if c.starved && (room < Window/2 || c.bytesOut > c.region.Layout().Arena/2) && c.nOut > len(c.pending) {
		return 0
	}
	return room
}

// fits reports whether a call of n input bytes may go now: its bytes fit in the window's
// budget, or nothing is on the node. Called with mu held.
func (c *incarnation) fits(n int) bool {
	return c.nOut == 0 || c.bytesOut+n <= c.region.Layout().Arena
}

// end is how the incarnation ended: its error, and what had started on the node.
type end struct {
	err     *lifecycle.Error
	normal  bool
	started uint64
	busy    bool
	chunk   uint64 // the chunk word of the busy call, if a Map chunk (fastpath.ChunkWord); 0: none
	// reported: the node said how the lane ended and which call it was running; else the
	// host inferred it (every call sent may have been running).
	reported bool
}

// run is the forwarder.
func (c *incarnation) run() {
	e := c.serve()
	c.finish(e)
}

func (c *incarnation) fail(code lifecycle.Code, format string, args ...any) *end {
	c.mu.Lock()
	busy := c.nOut > 0
	c.mu.Unlock()
	return &end{err: &lifecycle.Error{Code: code, Lane: c.idx, Message: fmt.Sprintf(format, args...)},
		started: c.lastSent, busy: busy}
}

// serve connects, opens the lane on its node and forwards until the incarnation ends.
func (c *incarnation) serve() *end {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-c.kicked
		cancel()
	}()
	defer c.kickOne.Do(func() { close(c.kicked) })
	s, err := c.k.connect(ctx)
	if err == nil && !c.k.add(c, s) {
		err = fmt.Errorf("%s", c.k.reason())
	}
	if err != nil {
		c.mu.Lock()
		why := c.killWhy
		c.mu.Unlock()
		if why != "" {
			return c.fail(lifecycle.CodeStartupFailed, "%s (connecting to node %s)", why, c.k.addr)
		}
		return c.fail(lifecycle.CodeStartupFailed, "node %s unreachable: %v", c.k.addr, err)
	}
	c.session = s
	c.n.register(c)
	cfg := &c.n.cfg
	open := &Open{Reply: c.k.reply, ReplyActor: c.n.ep.Name(), Liveness: cfg.Liveness, Lanes: uint32(max(cfg.Lanes, c.idx+1)), Flags: cfg.Flags,
		Inline: uint32(cfg.Layout.Inline), Arena: uint32(cfg.Layout.Arena), MaxCall: uint32(cfg.MaxCall),
		Tasks: cfg.Tasks}
	c.send(AppendOpen(c.header(KindOpen), open))
	c.launch.Debug("lane opened on its node", zap.String("node", c.k.addr))
	for {
		c.wake.Park(c.laneBell, c.work, c.parkTimeout())
		if c.gather() {
			// Let the callers the last results woke submit first: their calls then leave
			// in one frame. (A goroutine readied by a submitter's ring runs before the
			// submitter's peers: woken by the first caller, the forwarder sent a frame a
			// call for as long as the window had room, docs/remote.md.)
			runtime.Gosched()
		}
		if e := c.step(); e != nil {
			return e
		}
	}
}

// gather reports whether the forwarder, woken, should let other goroutines run before it
// forwards: a few calls wait, and calls are out on the node, whose results wake their
// callers, who are about to submit more. A lone caller's call (nothing out) goes at once,
// and so does a ring half full or more, or a window with no room.
func (c *incarnation) gather() bool {
	if n := bits.OnesCount32(c.req.Poll()); n == 0 || n >= fastpath.Slots/2 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nOut > 0 && c.sendable() > 0
}

// hasRoom reports whether results waiting for room on the return ring may find some now:
// the pool has retired slots since the ring was found full. Before it reports no, it marks
// the ring (Producer.WantRoom), so that the pool's next drain rings the forwarder (the
// lane's Room hook), as it rings a process lane parked for room; without the mark the
// forwarder could only poll, and a forwarder that polls takes the core the pool drains on.
// Called with mu held.
func (c *incarnation) hasRoom() bool {
	if !c.full || c.ret.Retired() != c.fullAt {
		return true
	}
	c.ret.WantRoom() // a full barrier: the reload below sees a retire the mark missed
	return c.ret.Retired() != c.fullAt
}

// parkTimeout: results that wait for room sleep at most roomSafety; the pool's drain rings
// the forwarder once it frees some (hasRoom).
func (c *incarnation) parkTimeout() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) > 0 {
		return roomSafety
	}
	return 0
}

// roomSafety bounds a park for room on the return ring: the drain's ring is what wakes it.
const roomSafety = 100 * time.Millisecond

func (c *incarnation) header(k Kind) []byte {
	return AppendHeader(make([]byte, 0, 256), k, c.session, uint32(c.idx), uint32(c.inc))
}

func (c *incarnation) send(frame []byte) { c.n.ep.Send(c.k.addr, AgentName, frame) }

// step does what the inbox and the rings ask; it returns the incarnation's end once it has
// one.
func (c *incarnation) step() *end {
	stamp.S(stamp.ForwarderWoke)
	c.posted.Store(false)
	c.mu.Lock()
	frames := c.frames
	c.frames = nil
	lostWhy, killWhy, hardWhy, term := c.lostWhy, c.killWhy, c.hardWhy, c.term
	c.mu.Unlock()
	for _, f := range frames {
		if e := c.onFrame(f, hardWhy); e != nil {
			return e
		}
	}
	c.mu.Lock()
	brokeWhy, published := c.brokeWhy, 0
	if len(c.pending) > 0 {
		published = c.publishLocked()
	}
	c.mu.Unlock()
	if published > 0 {
		c.signalDone()
	}
	switch {
	case brokeWhy != "":
		return c.broke(brokeWhy)
	case lostWhy != "" && !c.ready2:
		return c.fail(lifecycle.CodeStartupFailed, "%s", lostWhy)
	case lostWhy != "":
		return c.fail(lifecycle.CodeNodeLost, "%s", lostWhy)
	case killWhy != "":
		c.killOnNode(killWhy)
		if !c.ready2 {
			return c.fail(lifecycle.CodeStartupFailed, "%s (node %s)", killWhy, c.k.addr)
		}
		return c.fail(lifecycle.CodeWorkerCrashed, "%s (node %s)", killWhy, c.k.addr)
	case hardWhy != "":
		c.killOnNode("hard timeout: " + hardWhy)
	case term:
		c.killOnNode("stop not acknowledged in time")
	}
	if !c.ready2 {
		return nil
	}
	if c.forward() && c.launch.Refill != nil {
		c.launch.Refill() // its calls are forwarded at the next step: the ring has them
	}
	if c.abortFlag.Swap(false) || c.region.AbortWake().Load() != c.abortSeen.Load() {
		c.cancelAborted()
	}
	c.stopIfAsked()
	return nil
}

func (c *incarnation) killOnNode(why string) {
	if !c.killSent {
		c.killSent = true
		c.send(AppendStop(c.header(KindStop), true, why))
	}
}

// onFrame handles one frame from the node.
func (c *incarnation) onFrame(f Frame, hardWhy string) *end {
	switch f.Kind {
	case KindReady:
		if _, err := f.Ready(); err != nil || c.ready2 {
			return c.broke("a ready report that does not decode, or a second one")
		}
		c.ready2 = true
		c.readyNow.Store(true)
		c.k.established(c.session)
		close(c.ready)
		c.signalDone() // the reaper sleeps on it until ready
	case KindFailed:
		code, msg, err := f.Failed()
		if err != nil {
			return c.broke("a failure report that does not decode")
		}
		c.k.established(c.session)
		if c.ready2 {
			return c.broke("a failure report after ready")
		}
		_ = code // whatever the node says, a lane that did not start failed its start
		return c.fail(lifecycle.CodeStartupFailed, "node %s: %s", c.k.addr, msg)
	case KindEnded:
		r, err := f.Ended()
		if err != nil {
			return c.broke("an end report that does not decode: " + err.Error())
		}
		return c.ended(r, hardWhy)
	}
	return nil
}

// results takes a Results frame, on the endpoint's actor goroutine: each result is checked,
// published on the return ring and settled there (Launch.Drain), a ring at a time. Results
// the ring has no room for (another goroutine is draining it) wait for the forwarder, which
// publishes them once that drain rings it (hasRoom). A result that breaks the protocol ends
// the lane (through the forwarder).
func (c *incarnation) results(f Frame) {
	c.mu.Lock()
	if c.over || c.brokeWhy != "" {
		c.mu.Unlock()
		return
	}
	it := f.Items()
	for it.More() {
		r := it.Result()
		if it.Err() != nil {
			break
		}
		if why := c.check(r); why != "" {
			c.brokeWhy = why
			break
		}
		c.pending = append(c.pending, r)
	}
	if err := it.Err(); err != nil && c.brokeWhy == "" {
		c.brokeWhy = "results that do not decode: " + err.Error()
	}
	// Settled here, a frame's results cost no hand-off to the pool's reaper, and a frame
	// larger than the ring (32; a frame holds up to a window) is not relayed 32 results at a
	// time by the reaper and the forwarder. What is left on the ring (another goroutine was
	// draining it) is the reaper's: left rings it.
	published := c.publishLocked()
	left := published > 0
	for left && c.brokeWhy == "" && c.launch.Drain != nil {
		c.mu.Unlock()
		drained := c.launch.Drain()
		c.mu.Lock()
		if drained == 0 || c.over {
			break
		}
		n := c.publishLocked()
		published, left = published+n, n > 0
	}
	// A forwarder waiting for room in its window is rung once half the window is free, or
	// nothing is left on the node: rung for every result, it would send a frame a call.
	room := c.starved && published > 0 && c.sendable() > 0
	// A stop request waits for the window to empty (stopIfAsked): the last result rings.
	stop := published > 0 && c.nOut == 0 && c.region.Stop().Load() == fastpath.StopRequested
	wake := c.brokeWhy != "" || len(c.pending) > 0 || room || stop
	c.mu.Unlock()
	if left {
		c.region.Returns().Completion().Signal(c.doneBell)
	}
	if published > 0 {
		// A caller alone on the lane waits on the direct doorbell for its result, drained
		// or not: it looks at its call when it wakes.
		c.region.Returns().Direct().Signal(c.dirBell)
		stamp.S(stamp.HostPublished)
	}
	if wake {
		c.notify()
	}
}

// check vets a result: it must answer a call the lane holds, once, with a known outcome and
// a payload the return ring can hold. Called with mu held.
func (c *incarnation) check(r Result) string {
	s := &c.out[r.Seq%uint64(len(c.out))]
	switch {
	case !s.live || s.seq != r.Seq:
		return fmt.Sprintf("a result for call %d, which it does not hold", r.Seq)
	case r.Outcome > uint32(actors.BadOutput) || actors.Outcome(r.Outcome) == actors.Stale:
		return fmt.Sprintf("outcome %d", r.Outcome)
	case len(r.Payload) > c.region.Layout().Arena:
		return fmt.Sprintf("a result of %d bytes", len(r.Payload))
	}
	s.live = false // answered: a second result for it breaks the protocol
	return ""
}

// broke ends a lane whose node broke the protocol.
func (c *incarnation) broke(what string) *end {
	c.killOnNode("protocol violation")
	return c.fail(lifecycle.CodeWorkerCrashed, "node %s broke the protocol: %s", c.k.addr, what)
}

// ended is the lane's end as its node reports it.
func (c *incarnation) ended(r Ended, hardWhy string) *end {
	e := &end{err: &lifecycle.Error{Lane: c.idx}, normal: r.Normal, started: min(r.Started, c.lastSent), busy: r.Busy, reported: true}
	if r.Busy && r.Began >= 0 && r.Started <= c.lastSent {
		e.chunk = fastpath.ChunkWord(r.Started, r.Began)
	}
	code := lifecycle.Code(r.Code)
	switch code {
	case lifecycle.CodeThreadClosed, lifecycle.CodeWorkerCrashed, lifecycle.CodeWorkerExited, lifecycle.CodeWorkerUnresponsive,
		lifecycle.CodeWorkerOutOfMemory, lifecycle.CodeWorkerCPULimit, lifecycle.CodeNodeLost:
	default:
		code = lifecycle.CodeWorkerCrashed // a code no lane ends with
	}
	msg := fmt.Sprintf("on node %s: %s", c.k.addr, r.Message)
	switch {
	case c.region.Stop().Load() != fastpath.StopRunning:
		code, msg, e.normal = lifecycle.CodeThreadClosed, fmt.Sprintf("lane stopped (on node %s)", c.k.addr), false
	case hardWhy != "":
		code, msg, e.normal = lifecycle.CodeWorkerCrashed, fmt.Sprintf("killed by the host: hard timeout: %s (on node %s)", hardWhy, c.k.addr), false
	}
	e.err.Code, e.err.Message = code, msg
	if e.normal && code != lifecycle.CodeWorkerExited {
		e.normal = false
	}
	if len(r.Stack) > 0 || len(r.Tail) > 0 {
		rep := &lifecycle.LaneReport{Stack: r.Stack, Tail: r.Tail}
		if len(r.Stack) > 0 {
			rep.Failure, rep.Stack = r.Stack[0], r.Stack[1:]
		}
		e.err.Cause = rep
	}
	return e
}

// publishLocked writes the results received into the return ring, as many as it has room
// for, oldest first, and returns how many; the caller rings the pool. Called with mu held:
// the endpoint's actor and the forwarder's finish take turns as the ring's producer.
func (c *incarnation) publishLocked() int {
	n := 0
	c.full = false
	for _, r := range c.pending {
		seen := c.ret.Retired() // any retire from here on makes room (hasRoom)
		i, ok := c.ret.Reserve()
		if !ok {
			c.full, c.fullAt = true, seen
			break
		}
		buf, err := c.ret.Put(i, len(r.Payload))
		if err != nil { // the arena is full for now (check bounded the size)
			c.ret.Release(i)
			c.full, c.fullAt = true, seen
			break
		}
		copy(buf, r.Payload)
		sl := &c.out[r.Seq%uint64(len(c.out))]
		s := c.ret.Slot(i)
		s.SetFn(sl.fn)
		s.SetCall(sl.id, sl.gen)
		s.SetAbort(sl.abort)
		s.SetFlags(r.Outcome)
		s.SetSeq(r.Ran)
		c.ret.Stage(i)
		// The lane's counters, as an executor keeps them (Stats, recycling).
		if actors.Outcome(r.Outcome) == actors.OK {
			c.stats.Completed.Add(1)
		} else {
			c.stats.Failed.Add(1)
		}
		c.bytesOut -= sl.size
		*sl = sent{}
		c.nOut--
		n++
	}
	if n > 0 {
		c.byteBound = false
		c.pending = append(c.pending[:0], c.pending[n:]...)
		c.ret.Flush()
	}
	return n
}

// forward sends the calls waiting in the request ring, as many as the window allows, in
// frames of up to FrameTarget bytes. It reports whether it freed request slots.
func (c *incarnation) forward() bool {
	pending := c.req.Poll()
	if pending == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.sendable()
	if room <= 0 {
		c.starved = true // the endpoint's actor rings once results free room
		return false
	}
	frame := c.header(KindCalls)
	items := 0
	var mask uint32
	var cancels []byte // calls whose callers gave up before they were sent
	now := time.Now().UnixNano()
	freed, sentNow := false, int64(0)
	// Next, not Slots: a slot left for later must stay the next one, or calls would leave
	// out of order.
	for m := pending; ; {
		if m == 0 || room <= 0 {
			c.req.Retire(mask)
			freed = freed || mask != 0
			// Calls left waiting for room: the endpoint's actor rings once results free enough.
			// Nor with the window full: a refill's calls would go past it.
			if c.starved = mask != pending; c.starved || room <= 0 || c.byteBound || c.launch.Refill == nil || items == 0 {
				break
			}
			// The ring was emptied into the frame: calls waiting in the lane's backlog go in
			// the same frame (a ring holds 32; the node packs a frame's calls into chunks).
			c.mu.Unlock()
			c.launch.Refill()
			c.mu.Lock()
			if pending, mask = c.req.Poll(), 0; pending == 0 {
				break
			}
			m = pending
		}
		i := c.req.Next(m)
		m &^= 1 << i
		s := c.req.Slot(i)
		p, err := c.req.Payload(i)
		if err != nil {
			// The pool wrote this slot: a payload outside the layout is knit's bug. The call
			// goes with none, and fails to decode on the node.
			p = nil
		}
		if !c.fits(len(p)) {
			c.byteBound = true // until results free bytes (publishLocked)
			m = 0
			continue
		}
		seq := s.Seq()
		call := Call{Seq: seq, Fn: s.Fn(), NoCancel: s.Abort() == 0, Payload: p}
		if dl := s.Deadline(); dl != 0 {
			if call.Timeout = time.Duration(dl - now); call.Timeout <= 0 {
				call.Timeout = -1
			}
		}
		frame = AppendCall(frame, &call)
		sl := &c.out[seq%uint64(len(c.out))]
		*sl = sent{seq: seq, fn: call.Fn, id: s.Call(), gen: s.Gen(), abort: s.Abort(), size: len(p), live: true}
		if sl.abort != 0 && c.aborts.Test(int(sl.abort)-1) {
			sl.cancels = true
			if cancels == nil {
				cancels = c.header(KindCancel)
			}
			cancels = AppendCancel(cancels, seq)
		}
		c.lastSent = seq
		c.nOut++
		c.bytesOut += len(p)
		mask |= 1 << i
		room--
		items++
		sentNow++
		if len(frame) >= FrameTarget {
			c.send(frame)
			frame, items = c.header(KindCalls), 0
		}
	}
	for w := c.n.widest.Load(); sentNow > w && !c.n.widest.CompareAndSwap(w, sentNow); w = c.n.widest.Load() {
	}
	if items > 0 {
		stamp.S(stamp.CallsSending)
		c.send(frame)
		stamp.S(stamp.CallsSent)
	}
	if cancels != nil {
		c.send(cancels)
	}
	return freed
}

// cancelAborted sends the node the calls whose abort bits the pool raised (their callers
// gave up), once each.
func (c *incarnation) cancelAborted() {
	c.abortSeen.Store(c.region.AbortWake().Load()) // before the bits: a later raise moves it again
	c.mu.Lock()
	defer c.mu.Unlock()
	var frame []byte
	for i := range c.out {
		s := &c.out[i]
		if !s.live || s.cancels || s.abort == 0 || !c.aborts.Test(int(s.abort)-1) {
			continue
		}
		s.cancels = true
		if frame == nil {
			frame = c.header(KindCancel)
		}
		frame = AppendCancel(frame, s.seq)
	}
	if frame != nil {
		c.send(frame)
	}
}

// stopIfAsked carries out a stop request once the lane holds no call: it acknowledges (the
// lane takes nothing more) and asks the node to stop the lane; the lane ends when the node
// reports it has.
func (c *incarnation) stopIfAsked() {
	if c.acked || c.region.Stop().Load() != fastpath.StopRequested || c.req.Poll() != 0 {
		return
	}
	c.mu.Lock()
	nOut := c.nOut
	c.mu.Unlock()
	if nOut > 0 {
		return
	}
	c.acked = true
	c.region.Stop().Store(fastpath.StopAcknowledged)
	c.doneBell.Wake(c.region.Returns().Completion().Word()) // the pool may wait for the ack on it
	if !c.stopSent {
		c.stopSent = true
		c.send(AppendStop(c.header(KindStop), false, "stop requested"))
	}
}

// endPatience bounds how long an ending lane waits for return slots for the results it
// has received: results it cannot publish leave their calls in doubt, as lost ones are.
const endPatience = 5 * time.Second

// finish publishes what it can of the results received, and ends the incarnation.
func (c *incarnation) finish(e *end) {
	since := latency.Now()
	c.mu.Lock()
	for c.ready2 && len(c.pending) > 0 && latency.Now()-since < endPatience {
		if c.publishLocked() > 0 {
			c.signalDone()
		}
		if len(c.pending) > 0 {
			c.mu.Unlock()
			c.doneBell.Wake(c.region.Returns().Completion().Word())
			time.Sleep(time.Millisecond) // waiting for the pool to drain: nobody rings
			c.mu.Lock()
		}
	}
	c.over = true
	c.mu.Unlock()
	if c.launch.Stopping() && e.err.Code != lifecycle.CodeStartupFailed && e.err.Code != lifecycle.CodeThreadClosed {
		// Asked to stop: however it ended, it was stopped (what lifecycle.Classify says
		// of a process lane killed after a stop request).
		e.err = &lifecycle.Error{Code: lifecycle.CodeThreadClosed, Lane: c.idx, Message: "lane stopped (" + e.err.Message + ")"}
		e.normal = false
	}
	c.region.Running().Store(fastpath.RunningWord(e.started, e.busy))
	c.region.Chunk().Store(e.chunk) // what the node's lane process left, as a process lane's own
	c.inferred.Store(!e.reported)
	if c.session != (Session{}) {
		c.n.forget(c)
	}
	c.launch.Debug("lane ended on its node", zap.String("node", c.k.addr), zap.String("code", string(e.err.Code)))
	c.launch.End(e.err, e.normal)
}
