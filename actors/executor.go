package actors

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/latency"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/steal"
)

// Executor is the consumer side of a lane: it takes every pending call from the request
// ring in one pass, retires those slots at once, runs the calls in order and publishes each
// result on the return ring.
type Executor struct {
	Region *fastpath.Region
	Lane   fastpath.Bell // the bell the lane parks on (rung for calls and stop requests)
	Done   fastpath.Bell // the completion doorbell the host may sleep on (nil: never rung)
	// Host, if set on an in-process (Local) lane, is the host end of the lane's rings: the
	// lane settles each result through it right after the call ran (HostRing.SettleLocal),
	// without publishing it on the return ring. The lane goroutine hands the result to its
	// caller itself, which keeps a call on one core and needs no wake-up of a third
	// goroutine. It is called directly, not through a function value: a closure and the
	// owner's wrapper were two calls more on every call's path.
	Host *HostRing
	// Corrupt is told when a result Host settles breaks the protocol: the lane must die.
	Corrupt func(error)
	// Woke, if set, is called each time the lane wakes from a park for calls (not a park for
	// room): a process lane's heartbeat, paused while the lane slept, beats again.
	Woke func()

	Spin time.Duration // spin budget before parking
	// SpinOne, if positive, is the spin budget once OneAtATime batches in a row held a
	// single call each: a node's lane whose host calls it one call at a time polls for the
	// next for as long as a network round trip, which its wake-up from a park would
	// otherwise lengthen.
	SpinOne time.Duration
	Park    time.Duration // safety-net timeout of a park (0: none)
	// Local runs calls by reference on their records (goroutine lanes); otherwise payloads
	// are decoded and results encoded (process lanes).
	Local bool
	// Tasks maps a slot's function index to its task.
	Tasks []Def
	// MaxCall bounds an encoded result; a larger one fails its call with
	// PAYLOAD_TOO_LARGE (process lanes; 0: the arena size).
	MaxCall int
	// Context, if set, gives an encoded call its context from its abort bit (-1: none), its
	// caller's deadline (Unix nanoseconds, 0: none) and its carried context fields (see
	// AppendCarried), and a function to call when the call ends.
	Context func(abortBit int, deadline int64, carried []byte) (context.Context, func())
	// Carried: every encoded input opens with carried context fields.
	Carried bool
	// Panic makes a task panic end Run with the *PanicError (PanicCrashesLane).
	Panic bool
	// Timed makes the lane time each call and report it in its result slot's sequence field
	// (nanoseconds), which the host's metrics split from the time the call waited.
	Timed bool
	// Steal, if set, is the lane's side of the pool's shared submit ring: when the lane's
	// own ring is empty it claims batches there (work stealing) and answers them on its own
	// return ring, marked SharedResult.
	//
	// A process lane (not Local) runs nothing it claimed there until the host grants it:
	// it sends the host a claim notice on its return ring (ClaimNotice) and waits for the
	// answer (the host bumps the region's open word by 2); the host forwards each call it
	// grants to the lane's own ring, marked SharedResult, where it runs as one of the lane's
	// own calls. Every lane maps the shared ring writable: what one lane writes there must
	// never make another run a call twice, and only the host, which grants each call once,
	// can see to that (docs/stealing.md, "A lane that writes the shared ring").
	Steal *steal.Consumer

	scratch []byte
	ret     *fastpath.Producer
	stats   fastpath.Stats
	running *atomic.Uint64 // the region's running word
	gate    fastpath.Gate  // the region's gate word (process lanes)
	last    uint64         // the sequence number of the last call of its own ring it started
	chunk   *atomic.Uint64 // the region's chunk word (process lanes)
	mark    func(int)      // markChunk
	// ranChunk says the last call run was a chunk (SpinOne counts it as many calls).
	ranChunk bool
	// chunkSeq is the sequence number of the call it runs, 0 for one claimed from the shared ring.
	chunkSeq uint64
	busy     bool // the running word says busy
	claimed  int  // calls of the shared ring claimed and not run yet (grants: not yet noticed)
	// Grants (a process lane): notices sent, and whether the last one awaits its answer.
	sent     uint32
	awaiting bool
	notice   []byte
	sbatch   [fastpath.Slots]work
	sinputs  [fastpath.Slots][]byte
	// done and direct are the return ring's completion doorbells, signalled after each result;
	// rang is set when a signal woke the host (its next call comes after a wake-up).
	done, direct fastpath.Completion
	rang         bool
	// backoff is the lane's spinners' (for calls and for room): a spinner descheduled while
	// it spins makes both park at once for a while.
	backoff fastpath.Backoff
	// waitRoom's state, kept here so that parking allocates nothing.
	wake      *fastpath.Wake // the region's lane doorbell
	roomSpin  fastpath.Spinner
	roomReady func() bool
	roomOf    *fastpath.Producer
	roomSeen  uint32
}

// contendedPark is how long a stealing lane sleeps at most while calls wait behind a
// peer's claim handshake that has outlasted its retries (steal.Consumer.Contended): it looks
// again at this pace until the peer lets go, and the host rings it as usual.
const contendedPark = time.Millisecond

// SharedResult marks a result slot's flags: the call came from the shared submit ring.
const SharedResult uint32 = 1 << 31

type work struct {
	fn, id, gen, abort uint32
	flags              uint32 // SharedResult: a call of the shared ring the host forwarded
	seq                uint64 // the host's sequence number of the call on this lane
	deadline           int64  // the caller's deadline, Unix nanoseconds (0: none)
}

// Run serves calls until the host requests a stop, which it acknowledges after finishing
// the calls it has taken. An error means the request ring broke the protocol: the lane
// must die.
func (e *Executor) Run() error {
	req := e.Region.Requests().Consumer()
	e.ret, e.stats = e.Region.Returns().Producer(), e.Region.Stats()
	wake, done, stop := e.Region.LaneWake(), e.Region.Returns().Completion(), e.Region.Stop()
	e.wake, e.done, e.direct = wake, done, e.Region.Returns().Direct()
	open := e.Region.Open()
	// A stealing lane has work when it has claimed some: it claims while it looks for work,
	// and also once more after it has marked itself parked, so that a call the host
	// published before it saw the lane parked is either claimed here or by a peer. A lane
	// that keeps losing claims to its peers runs out of spin and parks, as an idle private
	// lane does, and the host rings it when more calls wait than awake lanes can take.
	// Its running word says busy from before each claim until its batch has run, so the
	// host never counts on a lane that holds claimed calls (docs/stealing.md, "Waking
	// lanes").
	var claimErr error
	retry := false
	grants := e.Steal != nil && !e.Local
	ready := func() bool {
		if req.Poll() != 0 || stop.Load() != fastpath.StopRunning {
			return true
		}
		if e.Steal == nil {
			return false
		}
		o := open.Load()
		if o == 0 {
			e.awaiting = false // closed: no notice is answered from now on
			return false
		}
		if e.awaiting {
			if o>>1 != e.sent&(1<<31-1) {
				return false // the host has not answered the notice yet
			}
			// Answered: the calls granted, if any, were forwarded before the answer.
			e.awaiting = false
			if req.Poll() != 0 {
				return true
			}
			e.running.Store(fastpath.RunningWord(e.last, false))
			e.busy = false
		}
		if e.claimed == 0 && claimErr == nil && e.Steal.Pending() {
			// Busy before the claim, idle again only if it took nothing: the host counts
			// an awake lane that is not busy as one that will claim what it publishes, and
			// a lane that has claimed claims nothing more until its batch ends (issue 13:
			// counted between its claim and its first call, it left a call waiting).
			e.running.Store(fastpath.RunningWord(e.last, true))
			if grants {
				e.claimed, claimErr = e.claimOnly()
			} else {
				e.claimed, claimErr = e.claim()
			}
			retry, e.busy = false, true
			if e.claimed == 0 && claimErr == nil {
				e.running.Store(fastpath.RunningWord(e.last, false))
				e.busy = false
				// Calls still wait although the claim took none (a peer's handshake held
				// them, or its claim took half): look again rather than park, or they could
				// wait for a lane the host counted on. A lane that lost them all to a
				// peer sees none and keeps its spin budget running out. (Loaded after
				// the store of idle: a host that read busy before it counted another lane.)
				// A peer that holds them through many retries is descheduled, stopped or
				// dead: the lane then parks, for contendedPark at most (steal.Contended).
				retry = e.Steal.Pending() && !e.Steal.Contended()
			}
		}
		return e.claimed > 0 || claimErr != nil || retry
	}
	// A process lane has no other goroutine to let run while it spins.
	spin := fastpath.Spinner{Budget: e.Spin, OS: !e.Local, Backoff: &e.backoff}
	e.roomSpin = fastpath.Spinner{Budget: e.Spin, OS: true, Backoff: &e.backoff}
	var batch [fastpath.Slots]work
	var inputs [fastpath.Slots][]byte
	wake.SetAwake()
	running := e.Region.Running()
	e.running, e.gate = running, e.Region.Gate()
	e.chunk, e.mark = e.Region.Chunk(), e.markChunk
	ones := 0 // batches of a single call in a row (SpinOne)
	for {
		spin.Budget = e.Spin
		if ones >= OneAtATime && e.SpinOne > 0 {
			spin.Budget = e.SpinOne
		}
		// Between batches the lane looks for work (a stealing host rings none): idle, unless
		// it still holds claimed calls (its own ring's calls ran first), or waits for the
		// host's answer to its claim notice.
		if e.busy && e.claimed == 0 && !e.awaiting {
			running.Store(fastpath.RunningWord(e.last, false))
			e.busy = false
		}
		if e.rang { // the host was asleep: a spin that runs out waiting for it is excused
			spin.PeerAsleep()
			e.rang = false
		}
		if !spin.Until(ready) {
			timeout := e.Park
			if e.Steal != nil && e.Steal.Contended() {
				timeout = contendedPark
			}
			if spin.Budget <= 0 {
				wake.Park(e.Lane, ready, timeout)
			} else {
				parked := time.Now()
				wake.Park(e.Lane, ready, timeout)
				spin.Parked(time.Since(parked))
			}
			if e.Woke != nil {
				e.Woke()
			}
		}
		stamp.S(stamp.LaneTook)
		if grants && e.claimed > 0 { // the notice first: the host grants while the lane runs
			e.sendNotice()
		}
		pending := req.Poll()
		if pending == 0 && e.claimed > 0 { // finished before a stop is acknowledged
			if err := e.runClaimed(); err != nil {
				return err
			}
			continue
		}
		if pending == 0 {
			if s := stop.Load(); s == fastpath.StopRequested || s == fastpath.StopAbandoned {
				stop.Store(fastpath.StopAcknowledged)
				if e.Done != nil {
					e.Done.Wake(done.Word()) // the host may be waiting for the ack on this bell
				}
				return nil
			}
			if claimErr != nil {
				return claimErr
			}
			if retry { // let the peer that holds the calls' handshake go on
				retry = false
				e.yield()
			}
			continue
		}
		n := 0
		var err error
		for i := range req.Slots(pending) { // Take's loop, inlined on the hot path
			s := req.Slot(i)
			// Field by field: a composite literal is built aside and copied.
			w := &batch[n]
			w.fn, w.id, w.gen, w.abort, w.seq, w.deadline = s.Fn(), s.Call(), s.Gen(), s.Abort(), s.Seq(), s.Deadline()
			w.flags = s.Flags() & SharedResult
			if !e.Local {
				var p []byte
				if p, err = req.Payload(i); err != nil {
					break
				}
				inputs[n] = append(inputs[n][:0], p...)
			}
			n++
		}
		req.Retire(pending)
		if err != nil {
			return err
		}
		for k := range n {
			if err := e.run(batch[k], inputs[k], false); err != nil {
				return err
			}
		}
		// A chunk (a Map's, or calls a node packed) is many calls: a lane fed a chunk at a
		// time is fed windows, and a spin after each would take the core its feeder needs.
		if n == 1 && !e.ranChunk {
			ones++
		} else {
			ones = 0
		}
		stamp.S(stamp.LaneRan)
		e.flushLocal()
	}
}

// OneAtATime is how many batches of a single call in a row show a lane that its caller
// calls one call at a time (SpinOne): a lane whose calls come in windows sees a single
// call now and then, and must not take a core for it.
const OneAtATime = 3

// flushLocal has an in-process lane move the calls waiting in its backlog (and the shared
// ring's) into the slots its last batch freed, once per batch. Callers that submit while
// slots are free publish themselves; this is for the calls they queued meanwhile.
func (e *Executor) flushLocal() {
	if e.Local && e.Host != nil {
		e.Host.FlushBacklogs()
	}
}

// run runs one call and publishes its result: a call of its own ring (w.flags marks one
// the host forwarded from the shared ring: SharedResult), or one it claimed from the shared
// ring itself (claimed).
func (e *Executor) run(w work, input []byte, claimed bool) error {
	flags := w.flags
	if claimed {
		flags = SharedResult
	}
	if int(w.fn) >= len(e.Tasks) {
		return fmt.Errorf("%w: function index %d of %d", fastpath.ErrCorrupt, w.fn, len(e.Tasks))
	}
	t := e.Tasks[w.fn]
	if t == nil {
		return fmt.Errorf("%w: function index %d is not served", fastpath.ErrCorrupt, w.fn)
	}
	if !e.Local && flags&SharedResult == 0 && !e.gate.Enter(w.seq) {
		// The host took the call back while an earlier one ran long: it runs on another
		// lane. The answer only gives its abort bit back.
		return e.publish(w, nil, Withdrawn, 0, 0)
	}
	// A call with a hard timeout tells the host when it started: the host measures the
	// timeout from then (Region.Since), not from when the call was queued. Stored before
	// the running word, which the host reads first.
	if !e.Local && t.Options().HardTimeout > 0 {
		e.Region.Since().Store(time.Now().UnixNano())
	}
	// One store before each call of the lane's own ring: if the lane dies, the host knows
	// which calls had started and which it may run elsewhere. (A call from the shared ring
	// is journaled there instead.)
	e.chunkSeq = 0 // a claimed call's chunk is not marked: it is journaled on the shared ring
	switch {
	case !claimed:
		e.last, e.chunkSeq = w.seq, w.seq
		e.running.Store(fastpath.RunningWord(w.seq, true))
	case !e.busy:
		e.running.Store(fastpath.RunningWord(e.last, true))
	}
	e.busy = true
	var out []byte
	var o Outcome
	var began time.Duration
	if e.Timed {
		began = latency.Now()
	}
	if e.Local {
		o = t.RunLocal(w.id, w.gen)
	} else {
		var err error
		out, o, err = e.runEncoded(t, input, int(w.abort)-1, w.deadline)
		if err != nil {
			return err
		}
	}
	var ran uint64
	if e.Timed {
		ran = uint64(max(latency.Now()-began, 1))
	}
	if o == Panicked && e.Panic {
		return e.panicOf(t, w.id, out)
	}
	if o == OK {
		e.stats.Completed.Add(1)
	} else {
		e.stats.Failed.Add(1)
	}
	if e.Local && e.Host != nil {
		// In-process: the result is settled here and now, as a drain of the return ring
		// would settle it, without a trip through the ring.
		if err := e.Host.SettleLocal(w.fn, w.id, w.gen, o, flags&SharedResult != 0, ran); err != nil {
			e.Corrupt(err)
		}
		return nil
	}
	return e.publish(w, out, o, flags, ran)
}

// publish answers call w on the return ring: its outcome o, out, flags and how long it ran.
func (e *Executor) publish(w work, out []byte, o Outcome, flags uint32, ran uint64) error {
	ret := e.ret
	j, buf := e.reserve(ret, len(out))
	copy(buf, out)
	rs := ret.Slot(j)
	rs.SetFn(w.fn)
	rs.SetCall(w.id, w.gen)
	rs.SetAbort(w.abort)
	rs.SetFlags(uint32(o) | flags)
	if e.Timed {
		rs.SetSeq(ran)
	}
	// Each result is published as soon as it exists: a result that waited for the rest of
	// its burst would be lost with the lane, and its call with it.
	ret.Publish(j)
	e.signal()
	return nil
}

// claim claims a batch from the shared submit ring and copies it out: the slots are
// released at once.
func (e *Executor) claim() (int, error) {
	c := e.Steal
	n, err := c.Claim()
	if err != nil || n == 0 { // n == 0: lost the race, or a peer holds its claim
		return 0, err
	}
	for k := range n {
		s := c.Slot(k)
		w := &e.sbatch[k] // field by field, as in Run
		w.fn, w.id, w.gen, w.abort, w.seq, w.deadline = s.Fn(), s.Call(), s.Gen(), s.Abort(), c.Call(k).Seq, s.Deadline()
		if !e.Local {
			p, err := c.Payload(k)
			if err != nil {
				return 0, err
			}
			e.sinputs[k] = append(e.sinputs[k][:0], p...)
		}
	}
	c.Release()
	return n, nil
}

// claimOnly claims a batch from the shared submit ring for a lane that runs only what the
// host grants it: it reads no payload (the host forwards each granted call whole), and
// releases the slots at once. The notice follows (sendNotice). A head no claim can move
// (ErrExhausted: something other than a claim wrote it) is nothing to claim: the host's
// audit sees it and gives the ring up.
func (e *Executor) claimOnly() (int, error) {
	c := e.Steal
	n, err := c.Claim()
	if err != nil || n == 0 {
		if err == steal.ErrExhausted {
			err = nil
		}
		return 0, err
	}
	e.notice = e.notice[:0]
	for k := range n {
		call := c.Call(k)
		e.notice = binary.LittleEndian.AppendUint64(e.notice, call.Seq<<6|uint64(call.Slot))
	}
	c.Release()
	return n, nil
}

// sendNotice publishes the claim notice of the batch claimOnly took on the return ring,
// journals the batch as handed over, and waits (busy) for the host's answer.
func (e *Executor) sendNotice() {
	c, n := e.Steal, e.claimed
	j, buf := e.reserve(e.ret, len(e.notice))
	copy(buf, e.notice)
	rs := e.ret.Slot(j)
	rs.SetFn(0)
	rs.SetCall(0, 0)
	rs.SetAbort(0)
	rs.SetFlags(SharedResult | ClaimNotice)
	e.ret.Publish(j)
	e.signal()
	for k := range n {
		c.Finish(k)
	}
	e.claimed = 0
	e.sent++
	e.awaiting = true
}

// runClaimed runs the claimed batch: each call is journaled as started, run, answered on
// the lane's own return ring and journaled as finished. A lane asked to stop finishes its
// batch first, as it does its own ring's calls; an abandoned one starts nothing more (the
// host has settled what it held).
func (e *Executor) runClaimed() error {
	c, n := e.Steal, e.claimed
	e.claimed = 0
	stop := e.Region.Stop()
	for k := range n {
		if stop.Load() == fastpath.StopAbandoned {
			return nil
		}
		c.Start(k)
		if err := e.run(e.sbatch[k], e.sinputs[k], true); err != nil {
			return err
		}
		c.Finish(k)
	}
	e.flushLocal()
	return nil
}

// yield lets other goroutines (a goroutine lane) or processes (a process lane) run.
func (e *Executor) yield() {
	if e.Local {
		runtime.Gosched()
	} else {
		spin.Yield()
	}
}

// signal lets the host know results are waiting on the return ring: it rings the completion
// doorbell if the host sleeps on it.
func (e *Executor) signal() {
	if e.Done != nil { // nil: never rung, even when the host has armed the doorbell
		if e.done.Signal(e.Done) {
			e.rang = true
		}
		if e.direct.Signal(fastpath.FutexBell{}) { // a caller waiting on it alone (Ring.Direct)
			e.rang = true
		}
	}
}

// markChunk stores in the chunk word how many elements of the Map chunk it runs the lane
// has started (actors.TwinSuffix), for the host to read if the lane dies.
func (e *Executor) markChunk(started int) {
	if e.chunkSeq != 0 {
		e.chunk.Store(fastpath.ChunkWord(e.chunkSeq, started))
	}
}

// panicOf recovers the panic of a call that is to crash the lane.
func (e *Executor) panicOf(t Def, id uint32, out []byte) error {
	if e.Local {
		return t.PanicOf(id)
	}
	we, _ := DecodeWireError(out)
	return AsPanic(we)
}

// runEncoded runs a call of a process lane: decode, run under the call's context, encode.
func (e *Executor) runEncoded(t Def, in []byte, abortBit int, deadline int64) ([]byte, Outcome, error) {
	var carried []byte
	if e.Carried {
		var err error
		if carried, in, err = SplitCarried(in); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", fastpath.ErrCorrupt, err)
		}
	}
	ctx, end := context.Background(), func() {}
	if e.Context != nil {
		ctx, end = e.Context(abortBit, deadline, carried)
	}
	limit := e.MaxCall
	if limit <= 0 || limit > e.Region.Layout().Arena {
		limit = e.Region.Layout().Arena
	}
	var out []byte
	var o Outcome
	chunk := false
	if c, ok := t.(Chunker); ok { // a twin runs a Map's chunk
		out, o, chunk = c.RunChunk(ctx, in, e.scratch[:0], limit, e.Panic, e.mark)
	}
	if !chunk {
		out, o = t.RunEncoded(ctx, in, e.scratch[:0])
	}
	e.ranChunk = chunk
	end()
	e.scratch = out[:0]
	if len(out) > limit && o != OK {
		// An error or panic report too long for the limit: cut its text, not the report.
		if we, err := DecodeWireError(out); err == nil {
			out = FitWireError(e.scratch[:0], we, limit)
		}
	}
	if len(out) > limit {
		// The report must fit too: one that did not would be retried in reserve forever.
		msg := fmt.Sprintf("result of %d bytes is over the %d-byte limit", len(out), limit)
		return FitWireError(e.scratch[:0], WireError{Code: CodePayloadTooLarge, Message: msg}, limit), BadOutput, nil
	}
	return out, o, nil
}

// roomSafety is how long a process lane parked for room on its full return ring sleeps at
// most: the host that retires slots rings it (fastpath.Wake.ParkRoom), so this is only a
// safety net.
const roomSafety = 100 * time.Millisecond

// reserve waits for a return slot and room for n bytes. The host drains results
// independently of requests, so waiting here cannot deadlock.
func (e *Executor) reserve(p *fastpath.Producer, n int) (int, []byte) {
	for {
		if i, buf, ok := tryReserve(p, n); ok {
			return i, buf
		}
		// The consumer word as it is now: any retire from here on makes room. (Reserve and
		// Put look once more with it: the host may have retired since they looked.)
		seen := p.Retired()
		if i, buf, ok := tryReserve(p, n); ok {
			return i, buf
		}
		e.waitRoom(p, seen)
	}
}

// waitRoom is one round of reserve's wait, kept out of its loop (the path of every result):
// it lets the host know, spins for room as the lane spins for calls (while spinning pays),
// then marks the ring and parks until the host, retiring slots, rings it. Yielding the CPU
// here instead handed it, on a loaded machine, to whatever else ran, and a lane that
// polled every millisecond moved 32 results a millisecond (docs/benchmarks.md).
func (e *Executor) waitRoom(p *fastpath.Producer, seen uint32) {
	e.signal()
	if e.Local { // its host drains in the same process: let it run
		e.yield()
		return
	}
	e.roomSeen, e.roomOf = seen, p
	if e.roomReady == nil {
		e.roomReady = e.hasRoom // bound once: a method value allocates
	}
	if e.roomSpin.Until(e.roomReady) {
		return
	}
	p.WantRoom()
	e.wake.ParkRoom(e.Lane, e.roomReady, roomSafety)
	p.NoRoomWanted()
}

// tryReserve reserves a return slot with room for n bytes, if there is one.
func tryReserve(p *fastpath.Producer, n int) (int, []byte, bool) {
	i, ok := p.Reserve()
	if !ok {
		return 0, nil, false
	}
	if n == 0 { // a goroutine lane's result: its value is on the call's record
		p.Empty(i)
		return i, nil, true
	}
	buf, err := p.Put(i, n)
	if err != nil {
		p.Release(i)
		return 0, nil, false
	}
	return i, buf, true
}

func (e *Executor) hasRoom() bool { return e.roomOf.Retired() != e.roomSeen }
