package actors

import (
	"context"
	"sync"
	"sync/atomic"
)

// Future is the result of a call started with Go. It settles once; Wait and Done may be
// used from many goroutines.
//
// A Future is one allocation: Wait blocks on a mutex inside it, locked until the call
// settles, and the channel Done returns is made only for a caller that asks for it.
type Future[Out any] struct {
	// The words that hold pointers first: the allocator writes the object's pointer bitmap
	// only as far as the last of them.
	help   Helper // the pool: drains results for a waiter
	err    error
	done   chan struct{} // made by the first Done, closed when the call settles
	stop   func() bool
	cancel context.CancelFunc
	out    Out
	// gate is locked from InitFuture until the call settles: Wait locks it (and unlocks it
	// at once) to wait. A mutex's lock costs a submitter one CAS; a WaitGroup's Add cost it
	// sixty-odd instructions (docs/benchmarks.md).
	gate    sync.Mutex
	mu      sync.Mutex // orders the context hook's registration before its use; guards done
	settled atomic.Bool
	// hooked is set once Done has been called or a context hook attached: settle then takes
	// mu to close Done's channel and stop the hook. A future with neither settles without it.
	hooked  atomic.Bool
	closed  bool // under mu: done is closed
	watched bool // under mu: Done registered f with help.Block until it settles
}

// Helper is what a pool does for a goroutine about to wait for a call's result.
type Helper interface {
	// Help polls for the result of the call p reports pending, draining results itself,
	// for as long as spinning pays; it returns when p settles or it stops spinning.
	Help(p Pender)
	// Block registers a goroutine that will block until a call settles, so that results
	// are drained for it without its help; Unblock lets go of one registration.
	Block()
	Unblock()
	// Poll settles the results waiting to be drained, if any, without blocking.
	Poll()
}

// Pender reports whether a call is still unsettled.
type Pender interface{ Pending() bool }

// NewFuture returns an unsettled Future.
func NewFuture[Out any]() *Future[Out] { return InitFuture(&Future[Out]{}) }

// InitFuture makes f, a zero Future (one embedded in a caller's own type, so that the pair
// is one allocation), unsettled, and returns it.
func InitFuture[Out any](f *Future[Out]) *Future[Out] {
	f.gate.Lock()
	return f
}

// Wait blocks until the call settles and returns its result.
func (f *Future[Out]) Wait() (Out, error) {
	if f.help != nil && !f.settled.Load() {
		f.help.Help((*settledFlag)(&f.settled))
		if !f.settled.Load() {
			// The spin did not catch the result: from now on the pool drains for us.
			f.help.Block()
			f.wait()
			f.help.Unblock()
			return f.out, f.err
		}
	}
	f.wait()
	return f.out, f.err
}

// wait blocks until the call has settled.
func (f *Future[Out]) wait() {
	f.gate.Lock()
	//lint:ignore SA2001 the empty critical section is the wait
	f.gate.Unlock()
}

// Done is closed when the call has settled.
func (f *Future[Out]) Done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
		f.hooked.Store(true) // a full barrier before the load of settled: see settle
		switch {
		case f.settled.Load(): // settle may not have seen hooked: close it here
			close(f.done)
			f.closed = true
		case f.help != nil:
			// Whoever selects on the channel waits without helping: the pool drains for
			// it until the call settles (settle lets go of the registration).
			f.help.Block()
			f.watched = true
		}
	}
	return f.done
}

// Pending reports whether the call is still unsettled. It drains the results waiting for
// the pool first, so that polling Pending sees a result as soon as it is there.
func (f *Future[Out]) Pending() bool {
	if f.settled.Load() {
		return false
	}
	if f.help != nil {
		f.help.Poll()
	}
	return !f.settled.Load()
}

// settledFlag is a Future's settled flag as the Pender Help polls: Help drains by itself.
type settledFlag atomic.Bool

func (s *settledFlag) Pending() bool { return !(*atomic.Bool)(s).Load() }

// settle hands f its result and releases its waiters; it reports whether it stopped the
// context hook (which then never runs). The result is written before settled turns true,
// and settled before the gate lets Wait return (so Pending is false once Wait has
// returned). settled turns true before settle looks at hooked, and Done sets hooked before
// it looks at settled: one of the two sees the other, and mu with closed keeps the channel
// from being closed twice. A future with no hook and no Done channel takes no lock.
func (f *Future[Out]) settle(out Out, err error) (stopped bool) {
	f.out, f.err = out, err
	f.settled.Store(true)
	if f.hooked.Load() {
		f.mu.Lock()
		if f.done != nil && !f.closed {
			close(f.done)
			f.closed = true
		}
		if f.watched {
			f.help.Unblock()
		}
		stopped = f.stop != nil && f.stop()
		f.mu.Unlock()
	}
	f.gate.Unlock()
	return stopped
}

// FailFuture settles f, whose call never started, with err. It is a function, not a method:
// settling belongs to knit, and a method would be one users of knit.Future could call.
func FailFuture[Out any](f *Future[Out], err error) *Future[Out] {
	var zero Out
	f.settle(zero, err)
	return f
}

// Attach makes r settle f. cancel, if not nil, is called when the call settles. expire, if
// not nil, is run (holding its own reference to r) when ctx ends first. help is the pool.
func (r *Record[In, Out]) Attach(f *Future[Out], ctx context.Context, cancel context.CancelFunc, expire func(), help Helper) {
	r.fut = f
	f.cancel, f.help = cancel, help
	if expire == nil {
		return
	}
	r.refs.Add(1)
	f.hooked.Store(true)
	f.mu.Lock()
	f.stop = context.AfterFunc(ctx, func() {
		expire()
		r.table.Release(r)
	})
	f.mu.Unlock()
}

// settleFuture hands the result to the future and lets go of the caller's reference (and
// the context hook's, if the hook will never run).
func (r *Record[In, Out]) settleFuture() {
	f := r.fut
	// Stop the hook before cancelling: cancel ends the context the hook waits on (a task's
	// Timeout), which would start the hook on a call that has already settled.
	stopped := f.settle(r.Out, r.Err)
	if f.cancel != nil {
		f.cancel()
	}
	if stopped {
		r.table.Release(r)
	}
	r.table.Release(r)
}
