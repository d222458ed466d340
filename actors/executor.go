package actors

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/latency"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/steal"
)

// Executor is the consumer side of a lane: it takes every pending call from the request
// ring in one pass, retires those slots at once, runs the calls in order and publishes each
// result on the return ring.
type Executor struct {
	Region *fastpath.Region
	Lane   fastpath.Bell // the bell the lane parks on (rung for calls and stop requests)
	Done   fastpath.Bell // the completion doorbell the host may sleep on (nil: never rung)
	// Drain, if set, settles results in the host right after each publish. In-process
	// lanes use it: the lane goroutine hands the result to its caller itself, which keeps
	// a call on one core and needs no wake-up of a third goroutine.
	Drain func()
	Spin  time.Duration // spin budget before parking
	Park  time.Duration // safety-net timeout of a park (0: none)
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
	Steal *steal.Consumer

	scratch []byte
	ret     *fastpath.Producer
	stats   fastpath.Stats
	last    uint64 // the sequence number of the last call of its own ring it started
	busy    bool   // the running word says busy
}

// SharedResult marks a result slot's flags: the call came from the shared submit ring.
const SharedResult uint32 = 1 << 31

type work struct {
	fn, id, gen, abort uint32
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
	open := e.Region.Open()
	ready := func() bool {
		return req.Poll() != 0 || stop.Load() != fastpath.StopRunning ||
			e.Steal != nil && open.Load() != 0 && e.Steal.Pending()
	}
	// A process lane has nothing else to run while it spins: it yields to other processes.
	spin := fastpath.Spinner{Budget: e.Spin, OS: !e.Local}
	var batch [fastpath.Slots]work
	var inputs [fastpath.Slots][]byte
	wake.SetAwake()
	running := e.Region.Running()
	for {
		if e.busy { // between batches: the lane looks for work (a stealing host rings none)
			running.Store(fastpath.RunningWord(e.last, false))
			e.busy = false
		}
		if !spin.Until(ready) {
			if e.Spin <= 0 {
				wake.Park(e.Lane, ready, e.Park)
			} else {
				parked := time.Now()
				wake.Park(e.Lane, ready, e.Park)
				spin.Parked(time.Since(parked))
			}
		}
		pending := req.Poll()
		if pending == 0 {
			if stop.Load() == fastpath.StopRequested {
				stop.Store(fastpath.StopAcknowledged)
				if e.Done != nil {
					e.Done.Wake(done.Word()) // the host may be waiting for the ack on this bell
				}
				return nil
			}
			if e.Steal != nil && stop.Load() == fastpath.StopRunning && open.Load() != 0 {
				if err := e.steal(batch[:], inputs[:]); err != nil {
					return err
				}
			}
			continue
		}
		n := 0
		for m := pending; m != 0; {
			i := req.Next(m)
			m &^= 1 << i
			s := req.Slot(i)
			batch[n] = work{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort(), seq: s.Seq(), deadline: s.Deadline()}
			if !e.Local {
				p, err := req.Payload(i)
				if err != nil {
					return err
				}
				inputs[n] = append(inputs[n][:0], p...)
			}
			n++
		}
		req.Retire(pending)
		for k := range n {
			if err := e.run(batch[k], inputs[k], 0); err != nil {
				return err
			}
		}
	}
}

// run runs one call and publishes its result; flags marks the result (SharedResult).
func (e *Executor) run(w work, input []byte, flags uint32) error {
	if int(w.fn) >= len(e.Tasks) {
		return fmt.Errorf("%w: function index %d of %d", fastpath.ErrCorrupt, w.fn, len(e.Tasks))
	}
	t := e.Tasks[w.fn]
	if t == nil {
		return fmt.Errorf("%w: function index %d is not served", fastpath.ErrCorrupt, w.fn)
	}
	// One store before each call of the lane's own ring: if the lane dies, the host knows
	// which calls had started and which it may run elsewhere. (A call from the shared ring
	// is journaled there instead.)
	switch {
	case flags&SharedResult == 0:
		e.last = w.seq
		e.Region.Running().Store(fastpath.RunningWord(w.seq, true))
	case !e.busy:
		e.Region.Running().Store(fastpath.RunningWord(e.last, true))
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

// steal claims a batch from the shared submit ring and runs it: the payloads are copied
// and the slots released at once, then each call is journaled as started, run, answered on
// the lane's own return ring and journaled as finished. A lane that was asked to stop
// starts nothing more: the host re-dispatches what it had claimed and not started.
func (e *Executor) steal(batch []work, inputs [][]byte) error {
	c := e.Steal
	n, err := c.Claim()
	if err != nil {
		return err
	}
	if n == 0 { // lost the race for the calls, or a peer holds its claim: let it finish
		if e.Local {
			runtime.Gosched()
		} else {
			spin.Yield()
		}
		return nil
	}
	for k := range n {
		s := c.Slot(k)
		batch[k] = work{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort(), seq: c.Call(k).Seq, deadline: s.Deadline()}
		if !e.Local {
			p, err := c.Payload(k)
			if err != nil {
				return err
			}
			inputs[k] = append(inputs[k][:0], p...)
		}
	}
	c.Release()
	stop := e.Region.Stop()
	for k := range n {
		if stop.Load() != fastpath.StopRunning {
			return nil
		}
		c.Start(k)
		if err := e.run(batch[k], inputs[k], SharedResult); err != nil {
			return err
		}
		if stop.Load() != fastpath.StopRunning {
			// An abandoned lane writes no more to a journal its successor may own; the
			// host settles from the return ring what it answered.
			return nil
		}
		c.Finish(k)
	}
	return nil
}

// signal lets the host know results are waiting: a goroutine lane settles them itself, a
// process lane rings the completion doorbell if the host sleeps on it.
func (e *Executor) signal() {
	switch {
	case e.Drain != nil:
		e.Drain()
	case e.Done != nil: // nil: never rung, even when the host has armed the doorbell
		e.Region.Returns().Completion().Signal(e.Done)
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
	out, o := t.RunEncoded(ctx, in, e.scratch[:0])
	end()
	e.scratch = out[:0]
	limit := e.MaxCall
	if limit <= 0 || limit > e.Region.Layout().Arena {
		limit = e.Region.Layout().Arena
	}
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

// reserve waits for a return slot and room for n bytes. The host drains results
// independently of requests, so waiting here cannot deadlock.
func (e *Executor) reserve(p *fastpath.Producer, n int) (int, []byte) {
	for {
		if i, ok := p.Reserve(); ok {
			buf, err := p.Put(i, n)
			if err == nil {
				return i, buf
			}
			p.Release(i)
		}
		e.signal()
		if e.Local {
			runtime.Gosched()
		} else {
			spin.Yield()
		}
	}
}
