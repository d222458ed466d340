package knit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/knitgo/knit/actors"
)

// mapWindow is how many of a Map's calls are in flight at once: enough to keep every lane's
// 32 slots and some backlog busy, few enough to leave a task's records (4096) to other
// callers.
const mapWindow = 1024

// Map runs the task once per element of in, across the pool's lanes, and returns the
// results in input order. It returns when every call has settled. The error is nil when
// all succeeded; otherwise it is a *MapError listing every failed element, by index, with
// its *Error — errors.Is(err, ErrWorkerCrashed) and the other sentinels match when any
// element failed so — and the results of the elements that succeeded are in the slice
// all the same (the others hold Out's zero value, or a TimeoutDefault).
//
// Each element is a call of its own: the task's Timeout, HardTimeout and Idempotent apply
// to it, and a lane's death settles each call it held by the rules Call follows. When ctx
// ends, the elements not started yet fail with its error (TIMEOUT or CANCELED) and those
// in flight settle as a Call's would. An error that concerns the whole Map (a nil or
// closed pool, a task the pool does not serve, a nil or ended context) is returned as an
// *Error, with a nil slice.
func (t *Task[In, Out]) Map(ctx context.Context, p *Pool, in []In) ([]Out, error) {
	if _, cancel, err := t.prepare(ctx, p); err != nil {
		t.rejected(p, err)
		return nil, err
	} else if cancel != nil {
		cancel() // each element gets a timeout of its own
	}
	out := make([]Out, len(in))
	var failed []ElementError
	fail := func(i int, err error) {
		failed = append(failed, ElementError{Index: i, Err: asError(errorOf(err), t.def.Name())})
	}
	calls := make([]mapCall[In, Out], min(len(in), mapWindow))
	head, n := 0, 0 // the oldest call in flight, and how many are
	wait := func() {
		c := &calls[head]
		v, err := t.await(c)
		out[c.i] = v
		if err != nil {
			fail(c.i, err)
		}
		*c = mapCall[In, Out]{}
		head = (head + 1) % len(calls)
		n--
	}
	for i := range in {
		if n == len(calls) {
			wait()
		}
		c := &calls[(head+n)%len(calls)]
		if err := t.start(ctx, p, i, in[i], c); err != nil {
			fail(i, err)
			continue
		}
		n++
	}
	for n > 0 {
		wait()
	}
	if len(failed) > 0 {
		return out, &MapError{Task: t.def.Name(), Calls: len(in), Failed: failed}
	}
	return out, nil
}

// mapCall is one of a Map's calls in flight.
type mapCall[In, Out any] struct {
	i      int
	p      *Pool
	r      *actors.Record[In, Out]
	home   home // nil: a goroutine lane's own queue, which settles it
	ctx    context.Context
	cancel context.CancelFunc
}

// start dispatches element i as a call, as Call would, without waiting for it. A call that
// cannot start is settled here and its error returned.
func (t *Task[In, Out]) start(ctx context.Context, p *Pool, i int, in In, c *mapCall[In, Out]) error {
	if ctx.Err() != nil {
		err := ctxError(ctx, t.def)
		t.rejected(p, err)
		return err
	}
	cctx, cancel := ctx, context.CancelFunc(nil)
	if d := t.def.Options().CallTimeout(); d > 0 {
		cause := errTaskTimeout
		if d == t.def.Options().HardTimeout {
			cause = errHardTimeout
		}
		cctx, cancel = context.WithTimeoutCause(ctx, d, cause)
	}
	r, err := t.def.Records.Alloc()
	if err != nil {
		if cancel != nil {
			cancel()
		}
		err = &Error{Code: CodeOverloaded, Lane: -1, Task: t.def.Name(), Cause: err}
		t.rejected(p, err)
		return err
	}
	r.Start(cctx, in, p.id)
	observe(p, r, t.def.Index())
	if ht := t.def.Options().HardTimeout; ht > 0 {
		r.Hard = time.Now().Add(ht)
	}
	*c = mapCall[In, Out]{i: i, p: p, r: r, ctx: cctx, cancel: cancel}
	var h home
	if p.local {
		if l := p.pick(); l != nil && !p.closing.Load() && l.submitLocal(&r.Lane, r) == nil {
			return nil
		}
		_, err = p.dispatch(cctx, actors.Call{Def: t.def, Lane: &r.Lane, Local: r, Done: cctx.Done()})
	} else {
		var call actors.Call
		if call, err = t.newCall(cctx, p, r); err == nil {
			h, err = p.dispatch(cctx, call)
		}
	}
	if err != nil {
		_, err = t.failure(cctx, err)
		t.abandon(r, err)
		if cancel != nil {
			cancel()
		}
		return err
	}
	c.home = h
	if h != nil {
		h.crowded()
	}
	return nil
}

// await waits for a started call to settle, as Call waits, and releases its record.
func (t *Task[In, Out]) await(c *mapCall[In, Out]) (Out, error) {
	p, r, l := c.p, c.r, c.home
	if r.Pending() && (l != nil || p.cfg.CallerSpin > 0) {
		p.help(r)
	}
	blocking := l != nil && l.drained() && r.Pending()
	if blocking {
		l.needReaper()
	}
	if done := c.ctx.Done(); done != nil && r.Pending() {
		select {
		case <-r.Done():
		case <-done:
			t.expire(c.ctx, p, r)
			<-r.Done()
		}
	} else {
		<-r.Done()
	}
	if blocking {
		l.doneWaiting()
	}
	if c.cancel != nil {
		c.cancel()
	}
	v, err := r.Out, r.Err
	t.def.Records.Release(r)
	return v, err
}

// asError is err as an element's *Error.
func asError(err error, task string) *Error {
	var ke *Error
	if errors.As(err, &ke) {
		return ke
	}
	return &Error{Code: CodeTaskError, Lane: -1, Task: task, Cause: err}
}

// ElementError is one failed element of a Map: its index in the input and its error.
type ElementError struct {
	Index int
	Err   *Error
}

// MapError is the error of a Map some of whose elements failed: each of them, in index
// order. errors.Is and errors.As see every element's *Error (Unwrap), so
// errors.Is(err, ErrWorkerCrashed) reports whether any element failed so.
type MapError struct {
	Task   string
	Calls  int            // the elements Map was given
	Failed []ElementError // the ones that failed, in index order
}

func (e *MapError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "knit: %d of %d calls of task %q failed", len(e.Failed), e.Calls, e.Task)
	codes := map[Code]int{}
	var order []Code
	for _, f := range e.Failed {
		if codes[f.Err.Code] == 0 {
			order = append(order, f.Err.Code)
		}
		codes[f.Err.Code]++
	}
	for i, c := range order {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%d %s", sep, codes[c], c)
	}
	if len(e.Failed) > 0 {
		fmt.Fprintf(&b, "; first, element %d: %v", e.Failed[0].Index, e.Failed[0].Err)
	}
	return b.String()
}

// Unwrap returns every failed element's *Error.
func (e *MapError) Unwrap() []error {
	out := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		out[i] = f.Err
	}
	return out
}
