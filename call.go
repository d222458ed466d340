package knit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
)

// Future is the pending result of a call started with Task.Go. It settles once, whatever
// happens to the lane that runs the call; its methods may be used from many goroutines.
// Settling it belongs to knit: a Future has no method that could.
type Future[Out any] struct{ f actors.Future[Out] }

// Wait blocks until the call settles and returns its result or its *Error.
func (f *Future[Out]) Wait() (Out, error) {
	out, err := f.f.Wait()
	if err != nil {
		err = errorOf(err)
	}
	return out, err
}

// Done returns a channel closed when the call has settled, for select; Wait then returns
// at once.
func (f *Future[Out]) Done() <-chan struct{} { return f.f.Done() }

// Pending reports whether the call is still unsettled, without blocking. It drains results
// waiting for the pool first, so that polling it sees a result as soon as it is there.
func (f *Future[Out]) Pending() bool { return f.f.Pending() }

// errTaskTimeout and errHardTimeout are the cancellation causes of a task's own Timeout
// and HardTimeout.
var (
	errTaskTimeout = errors.New("knit: task timeout")
	errHardTimeout = errors.New("knit: task hard timeout")
)

// Call runs the task on one of the pool's lanes and waits for its result. Cancelling ctx
// settles the call at once with an error wrapping ctx.Err() and cancels the task's context.
func (t *Task[In, Out]) Call(ctx context.Context, p *Pool, in In) (Out, error) {
	stamp.S(stamp.CallStart)
	var zero Out
	ctx, cancel, err := t.prepare(ctx, p)
	if err != nil {
		t.rejected(p, err)
		return zero, err
	}
	if cancel != nil {
		defer cancel()
	}
	r, err := t.def.Records.Alloc()
	if err != nil {
		err = &Error{Code: CodeOverloaded, Lane: -1, Task: t.def.Name(), Cause: err}
		t.rejected(p, err)
		return zero, err
	}
	r.Start(ctx, in, p.id)
	observe(p, r, t.def.Index())
	if ht := t.def.Options().HardTimeout; ht > 0 {
		r.Hard = time.Now().Add(ht)
	}
	if p.local {
		return t.callLocal(ctx, p, r)
	}
	c, err := t.newCall(ctx, p, r)
	if err != nil {
		t.abandon(r, err)
		return zero, err
	}
	l, err := p.dispatch(ctx, c)
	if err != nil {
		out, err := t.failure(ctx, err)
		t.abandon(r, err)
		return out, err
	}
	if r.Pending() {
		ln, _ := l.(*lane)
		p.helpOn(r, ln)
	}
	if done := ctx.Done(); done != nil && r.Pending() {
		l.needReaper()
		select {
		case <-r.Done():
		case <-done:
			t.expire(ctx, p, r)
			<-r.Done()
		}
		l.doneWaiting()
	} else if l.drained() && r.Pending() {
		if ln, ok := l.(*lane); !ok || !ln.waitDirect(r, &r.Lane) {
			l.needReaper()
			<-r.Done()
			l.doneWaiting()
		} else {
			<-r.Done()
		}
	} else {
		<-r.Done() // a goroutine lane settles the call itself: no reaper, no defer
	}
	out, err := r.Out, r.Err
	t.def.Records.Release(r)
	if err != nil {
		err = errorOf(err)
	}
	stamp.S(stamp.CallEnd)
	return out, err
}

// callLocal is the rest of Call on goroutine lanes of a pool with no shared ring
// (actors.LocalLane): the record goes to a lane as it is, and the lane settles it.
func (t *Task[In, Out]) callLocal(ctx context.Context, p *Pool, r *actors.Record[In, Out]) (Out, error) {
	done := ctx.Done()
	// The balancer's lane first; dispatch for everything else (no lane ready, a full lane,
	// a closing pool).
	l := p.pick(nil)
	if l == nil || p.closing.Load() || l.submitLocal(&r.Lane, r) != nil {
		l = nil
		if _, err := p.dispatch(ctx, actors.Call{Def: t.def, Lane: &r.Lane, Local: r, Done: done}); err != nil {
			out, err := t.failure(ctx, err)
			t.abandon(r, err)
			return out, err
		}
	}
	if p.cfg.CallerSpin > 0 && r.Pending() {
		p.help(r)
	}
	// Yield only for a call that is next or nearly so: behind more, it is not answered
	// within a few yields, and with many callers every yield goes through the scheduler's
	// global run queue and its lock (44 % of the CPU with 1024 goroutines calling).
	if l == nil || l.inflight.Load() <= callerYields {
		for i := 0; i < callerYields && r.Pending(); i++ { // as help does for a future (inline)
			runtime.Gosched()
		}
	}
	if done != nil {
		select {
		case <-r.Done():
		case <-done:
			t.expire(ctx, p, r)
			<-r.Done()
		}
	} else {
		<-r.Done()
	}
	out, err := r.Out, r.Err
	t.def.Records.Release(r)
	if err != nil {
		err = errorOf(err)
	}
	return out, err
}

// Go starts the task on one of the pool's lanes and returns its Future at once.
func (t *Task[In, Out]) Go(ctx context.Context, p *Pool, in In) *Future[Out] {
	fut := new(Future[Out]) // the actors.Future inside it: one allocation
	f := actors.InitFuture(&fut.f)
	ctx, cancel, err := t.prepare(ctx, p)
	if err != nil {
		t.rejected(p, err)
		actors.FailFuture(f, err)
		return fut
	}
	r, err := t.def.Records.Alloc()
	if err != nil {
		if cancel != nil {
			cancel()
		}
		err = &Error{Code: CodeOverloaded, Lane: -1, Task: t.def.Name(), Cause: err}
		t.rejected(p, err)
		actors.FailFuture(f, err)
		return fut
	}
	r.Start(ctx, in, p.id)
	observe(p, r, t.def.Index())
	if ht := t.def.Options().HardTimeout; ht > 0 {
		r.Hard = time.Now().Add(ht)
	}
	var c actors.Call
	if !p.local {
		if c, err = t.newCall(ctx, p, r); err != nil {
			t.abandon(r, err)
			if cancel != nil {
				cancel()
			}
			actors.FailFuture(f, err)
			return fut
		}
	}
	var expire func()
	if ctx.Done() != nil {
		expire = func() { t.expire(ctx, p, r) }
	}
	// No reaper is woken for the future: its owner drains its result when it waits (help),
	// and registers for a reaper only if it blocks (Block), or asks for Done. A reaper is
	// woken only when the lane holds more calls than its return ring has slots: its results
	// then must be drained for the lane to go on.
	r.Attach(f, ctx, cancel, expire, helper{p})
	if p.local {
		// A goroutine lane takes the record as it is, as callLocal gives it: no Call is
		// built, and dispatch only when the balancer's lane does not take it.
		if l := p.pick(nil); l != nil && !p.closing.Load() && l.submitLocal(&r.Lane, r) == nil {
			return fut
		}
		c = actors.Call{Def: t.def, Lane: &r.Lane, Local: r, Done: ctx.Done()}
	}
	l, err := p.dispatch(ctx, c)
	if err != nil {
		_, err = t.failure(ctx, err)
		r.Fail(err)
		t.def.Records.Release(r) // the dispatch reference; the future let go of its own
		return fut
	}
	l.crowded()
	return fut
}

// prepare checks the pool and the context, and applies the task's Timeout.
func (t *Task[In, Out]) prepare(ctx context.Context, p *Pool) (context.Context, context.CancelFunc, error) {
	switch {
	case t == nil || t.def == nil:
		return ctx, nil, &Error{Code: CodeInvalidArgument, Lane: -1, Message: "nil task (tasks come from knit.Define)"}
	case p == nil:
		return ctx, nil, &Error{Code: CodeInvalidArgument, Lane: -1, Task: t.def.Name(), Message: "nil pool"}
	case ctx == nil:
		return ctx, nil, &Error{Code: CodeInvalidArgument, Lane: -1, Task: t.def.Name(), Message: "nil context"}
	case p.closing.Load():
		return ctx, nil, &Error{Code: CodePoolClosed, Lane: -1, Task: t.def.Name(), Message: "pool is closed"}
	case int(t.def.Index()) >= len(p.byIndex) || p.byIndex[t.def.Index()] == nil:
		return ctx, nil, &Error{Code: CodeUnknownTask, Lane: -1, Task: t.def.Name(), Message: "task is not served by this pool (give it to NewPool)"}
	}
	if ctx.Err() != nil {
		return ctx, nil, ctxError(ctx, t.def)
	}
	o := t.def.Options()
	if d := o.CallTimeout(); d > 0 {
		cause := errTaskTimeout
		if d == o.HardTimeout {
			cause = errHardTimeout
		}
		ctx, cancel := context.WithTimeoutCause(ctx, d, cause)
		return ctx, cancel, nil
	}
	return ctx, nil, nil
}

// helper is the pool as a Future sees it (actors.Helper), kept off Pool's method set so that
// nothing a user holds can drain or count for the pool.
type helper struct{ p *Pool }

func (h helper) Help(c actors.Pender) { h.p.help(c) }
func (h helper) Block()               { h.p.block() }
func (h helper) Unblock()             { h.p.unblock() }
func (h helper) Poll()                { h.p.poll() }

// help polls for a call's result for as long as spinning pays,
// draining every process lane's results itself, so that a quick result costs no wake-up on
// either side. One caller spins at a time; the others park, and the spinner settles their
// calls too. A spin that runs out of budget makes the following callers park at once,
// except one in probeEvery, which spins to see whether results come back quickly again.
func (p *Pool) help(c actors.Pender) { p.helpOn(c, nil) }

// helpOn is help for a call on lane l (nil: unknown). A spin that runs out while l is
// asleep, or was woken for the call (its wake-up took longer than the budget), counts as no
// miss: the lane's pace is not the reason.
func (p *Pool) helpOn(c actors.Pender, l *lane) {
	budget := p.cfg.CallerSpin
	if budget <= 0 && p.local {
		// A goroutine lane settles the call itself: the caller yields to it a few times
		// before it parks, which a quick call answers without a park and a ready (the lane,
		// yielding too, finds the next call: actors.LocalLane's spun).
		for i := 0; i < callerYields && c.Pending(); i++ {
			runtime.Gosched()
		}
		return
	}
	if budget <= 0 || p.spinMisses.Load() >= coldAfter && rand.Uint32()%probeEvery != 0 {
		return
	}
	now := fastpath.Now()
	if p.cold.Cold(now) {
		return // a spinner of this pool was descheduled lately: park at once
	}
	if (p.spinning.Load() || !p.spinning.CompareAndSwap(false, true)) && !p.takeOver() {
		return // another caller drains for everyone
	}
	start, last := now, now
	for i := 1; c.Pending(); i++ {
		if p.reaped {
			p.drainAll()
			if !c.Pending() {
				break
			}
		}
		spin.Pause()
		if i%64 != 0 {
			continue
		}
		t := fastpath.Now()
		if t-last > fastpath.Descheduled {
			// The caller lost its core while it spun: other threads want the cores, and
			// the lane (told that a caller drains) may be waiting for one too. Park.
			p.cold.Descheduled(t)
			break
		}
		if t-start > budget {
			if l == nil || !l.slowWake() {
				p.spinMisses.Add(1)
			}
			break
		}
		runtime.Gosched() // the process's own goroutines; never the core (fastpath.Spinner)
		last = fastpath.Now()
	}
	if !c.Pending() && p.spinMisses.Load() != 0 {
		p.spinMisses.Store(0)
	}
	p.spinning.Store(false)
	// Reapers stand aside while a caller spins: wake them if anything is left for them.
	if p.futures.Load() > 0 || p.closing.Load() {
		p.kickReapers()
		return
	}
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil && l.needsReaper() {
				l.kickReaper()
			}
		}
	}
}

// block: a goroutine is about to block on a future until it
// settles (its Wait's spin ran out, or it asked for Done). From then until Unblock every
// reaper drains, whichever lane the call is on now or runs on after a restart. p.futures
// counts these futures (not every unsettled one: a future nobody blocks on costs no
// reaper a wake-up).
func (p *Pool) block() {
	if p.reaped && p.futures.Add(1) == 1 {
		p.kickReapers()
	}
}

// unblock undoes block.
func (p *Pool) unblock() {
	if p.reaped {
		p.futures.Add(-1)
	}
}

// poll settles every result waiting on a return ring.
func (p *Pool) poll() {
	if p.reaped {
		p.drainAll()
	}
}

// takeOver asks a lingering reaper for the spinner token: a caller that waits for a result
// had better drain itself than be woken by the reaper that settles it. It reports whether
// it got the token (not when another caller holds it: callers never hand over). One caller
// asks at a time; the others park at once rather than spin for a token only one can get.
func (p *Pool) takeOver() bool {
	if !p.lingering.Load() || p.handover.Load() || !p.handover.CompareAndSwap(false, true) {
		return false
	}
	defer p.handover.Store(false)
	for i := 1; i <= 256; i++ {
		if p.spinning.CompareAndSwap(false, true) {
			return true
		}
		if !p.lingering.Load() {
			// The reaper let go (or is letting go) and a caller may have taken the token:
			// one last try rather than spin for it.
			return p.spinning.CompareAndSwap(false, true)
		}
		spin.Pause()
		if i%64 == 0 {
			runtime.Gosched()
		}
	}
	return false
}

// callerYields is how many times a caller of a goroutine lane yields for its result before
// it parks (docs/benchmarks.md: 2 took a sequential Call from 430 to 373 ns).
const callerYields = 2

// coldAfter is how many spins in a row must run out before callers park at once.
const coldAfter = 3

// probeEvery: while spinning does not pay, one caller in probeEvery spins anyway.
const probeEvery = 16

// kickReapers wakes every lane's reaper that idles for want of work.
func (p *Pool) kickReapers() {
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil {
				l.kickReaper()
			}
		}
	}
}

// drainAll settles the results waiting on every process lane's return ring and reports
// how many there were.
func (p *Pool) drainAll() (settled int) {
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil && l.reaper {
				settled += l.drain()
			}
		}
	}
	return settled
}

// newCall describes a started record for dispatch; process pools encode the input now,
// refusing a value over the per-call maximum before anything is published.
func (t *Task[In, Out]) newCall(ctx context.Context, p *Pool, r *actors.Record[In, Out]) (actors.Call, error) {
	c := actors.Call{Def: t.def, ID: r.ID, Gen: r.Gen.Load(), Lane: &r.Lane, Abort: &r.Abort, Seq: &r.Seq, Done: ctx.Done()}
	if !p.caps.Remote {
		c.Local = r
		return c, nil
	}
	var err error
	r.Enc = r.Enc[:0]
	if prop := p.cfg.Propagator; prop != nil {
		r.Enc = actors.AppendCarried(r.Enc, func(add func(k, v string)) { prop.Inject(ctx, setCarrier(add)) })
	}
	// A value over the limit is refused before it is encoded where its size is known
	// cheaply (bytes, strings, proto, what a CBOR value's strings and slices hold).
	if r.Enc, err = t.def.AppendInput(r.Enc, r.In, p.cfg.Payload.MaxCall-len(r.Enc)); err != nil {
		if tl := (*actors.TooLargeError)(nil); errors.As(err, &tl) {
			return c, &Error{Code: CodePayloadTooLarge, Lane: -1, Task: t.def.Name(), Message: "input: " + tl.Error()}
		}
		return c, &Error{Code: CodeUnsupportedType, Lane: -1, Task: t.def.Name(), Message: "encoding the input", Cause: err}
	}
	c.Payload = r.Enc
	if d, ok := ctx.Deadline(); ok {
		c.Deadline = d.UnixNano() // the task on the lane sees its caller's deadline
	}
	return c, nil
}

// setCarrier is a propagation.TextMapCarrier that only takes what Inject sets.
type setCarrier func(key, value string)

func (c setCarrier) Set(key, value string) { c(key, value) }
func (setCarrier) Get(string) string       { return "" }
func (setCarrier) Keys() []string          { return nil }

// expire settles a call whose context ended before its result came, and asks a process
// lane to interrupt it.
func (t *Task[In, Out]) expire(ctx context.Context, p *Pool, r *actors.Record[In, Out]) {
	// The result may be waiting on its lane's return ring, undrained: it counts.
	key := r.Lane.Load()
	if l := p.laneByKey(key); l != nil && l.reaper {
		l.drain()
	} else if key == sharedKey && p.reaped {
		p.drainAll() // any lane may have answered a call from the shared ring
	}
	if !r.Pending() {
		return
	}
	cause := context.Cause(ctx)
	if isTimeout(cause) && t.def.Options().HasDefault {
		r.Resolve(t.def.TimeoutValue())
	} else {
		_, err := t.failure(ctx, ctx.Err())
		r.Fail(err)
	}
	if r.Lane.Load() == sharedKey {
		t.expireShared(p, r, cause)
		return
	}
	l := p.laneByKey(r.Lane.Load())
	if l == nil || !l.reaper {
		return
	}
	// The task is asked to stop (its context), and a call the lane has not started is
	// skipped; one with a hard timeout gets its lane killed if it runs on past it.
	l.raiseAbort(r.Abort.Load(), t.def.Index(), r.ID)
	if !r.Hard.IsZero() {
		key, gen := r.Lane.Load(), r.Gen.Load()
		t.watchHard(r, func() (*lane, hardState) {
			l := p.laneByKey(key)
			if l == nil {
				return nil, hardGone // its lane has ended: its calls are settled
			}
			l.drain()
			if r.Gen.Load() != gen || r.Lane.Load() != key {
				return nil, hardGone // its result came: the lane has let go of it
			}
			word, ok := l.running()
			switch seq := r.Seq.Load(); {
			case !ok:
				return nil, hardGone
			case seq == 0 || fastpath.Started(word) < seq:
				return l, hardQueued
			case fastpath.Started(word) > seq || !fastpath.Busy(word):
				return nil, hardGone // it has finished; its result is on the way
			}
			return l, hardRunning
		})
	}
}

// hardState is where a call watched for its hard timeout is.
type hardState int

const (
	hardGone    hardState = iota // settled, finished, or its lane has ended
	hardQueued                   // held, not started
	hardRunning                  // running on the lane returned with it
)

// watchHard kills the lane that holds call r once the call has run there for its task's
// HardTimeout, measured from when the lane started it (its since word, Region.Since) —
// never from when it was queued: a call that waits behind a stuck one is not its lane's
// fault, and times out as a call. It looks first at r.Hard (queued + HardTimeout, the
// earliest the call can have overrun), then again while where says the call is held and
// not started, or has run for less than HardTimeout. A lane that lies in its since word
// gains at most one HardTimeout: the earliest start it has shown is kept.
func (t *Task[In, Out]) watchHard(r *actors.Record[In, Out], where func() (*lane, hardState)) {
	hard := t.def.Options().HardTimeout
	var seen time.Time // the earliest start the lane has shown for the call
	var look func()
	look = func() {
		l, state := where()
		switch state {
		case hardGone:
			return
		case hardQueued:
			time.AfterFunc(hard, look)
			return
		}
		since, ok := l.since()
		if !ok {
			return
		}
		now := time.Now()
		if since.After(now) {
			since = now
		}
		if seen.IsZero() || since.Before(seen) {
			seen = since
		}
		if wait := seen.Add(hard).Sub(now); wait > 0 {
			time.AfterFunc(wait, look)
			return
		}
		l.Kill(lifecycle.Exit{HardTimeout: fmt.Sprintf("task %q overran %v", t.def.Name(), hard)})
	}
	time.AfterFunc(time.Until(r.Hard), look)
}

// expireShared asks the process lane running an expired call from the shared ring to
// interrupt it, or kills it at the hard timeout, as expire does for a lane's own calls. The
// lane is the one whose claim journal shows the call started; a call not started yet keeps
// its raised abort bit, which the lane that claims it sees before it runs it.
func (t *Task[In, Out]) expireShared(p *Pool, r *actors.Record[In, Out], cause error) {
	s := p.shared
	if s == nil || !p.reaped {
		return
	}
	s.raiseAbort(r.Abort.Load(), t.def.Index(), r.ID)
	if r.Hard.IsZero() {
		return
	}
	// The lane whose claim journal shows the call started runs it; while none does, it is
	// on the ring (or a lane's claim, not started).
	gen := r.Gen.Load()
	t.watchHard(r, func() (*lane, hardState) {
		p.drainAll()
		if r.Gen.Load() != gen || r.Lane.Load() != sharedKey {
			return nil, hardGone
		}
		if l := s.holder(r.Seq.Load()); l != nil && l.reaper {
			return l, hardRunning
		}
		return nil, hardQueued
	})
}

func isTimeout(cause error) bool { return cause == errTaskTimeout || cause == errHardTimeout }

// failure maps an error met before or while waiting, applying the task's timeout rules.
func (t *Task[In, Out]) failure(ctx context.Context, err error) (Out, error) {
	if isTimeout(context.Cause(ctx)) {
		o := t.def.Options()
		if o.HasDefault {
			return t.def.TimeoutValue(), nil
		}
		return t.def.TimeoutValue(), &Error{Code: CodeTimeout, Lane: -1, Task: t.def.Name(),
			Message: fmt.Sprintf("no result within %v", o.CallTimeout()), Cause: context.DeadlineExceeded}
	}
	var zero Out
	var ke coded
	if errors.As(err, &ke) {
		return zero, errorOf(err)
	}
	return zero, ctxError(ctx, t.def)
}

// abandon drops both references of a record whose call was never dispatched, which failed
// with err.
func (t *Task[In, Out]) abandon(r *actors.Record[In, Out], err error) {
	r.Fail(err)
	<-r.Done()
	t.def.Records.Release(r)
	t.def.Records.Release(r)
}

// rejected counts, in the pool's metrics, a call refused before it had a record.
func (t *Task[In, Out]) rejected(p *Pool, err error) {
	if p != nil && t != nil && t.def != nil {
		p.obs.rejected(t.def.Index(), err)
	}
}
