package knit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/knitgo/knit/actors"
)

// mapWindow is how many of a Map's calls are in flight at once: enough to keep every lane's
// 32 slots and some backlog busy, few enough to leave a task's records (4096) to other
// callers.
const mapWindow = 1024

// mapChunk is how many of a Map's calls move together: they take their records together,
// go to one lane in one push (one CAS on a goroutine lane, one publication of the ring on a
// process lane, and one wake-up of the lane), and the Map waits for them together (one
// wake-up when the last settles). 32 fills a process lane's request ring.
const mapChunk = 32

// Map runs the task once per element of in, across the pool's lanes, and returns the
// results in input order. It returns when every call has settled. The error is nil when
// all succeeded; otherwise it is a *MapError listing every failed element, by index, with
// its *Error — errors.Is(err, ErrWorkerCrashed) and the other sentinels match when any
// element failed so — and the results of the elements that succeeded are in the slice
// all the same (the others hold Out's zero value, or a TimeoutDefault).
//
// Each element is a call of its own: the task's Timeout, HardTimeout and Idempotent apply
// to it, and a lane's death settles each call it held by the rules Call follows (on process
// and remote lanes with the one difference a chunk makes, below). When ctx
// ends, the elements not started yet fail with its error (TIMEOUT or CANCELED) and those
// in flight settle as a Call's would. An error that concerns the whole Map (a nil or
// closed pool, a task the pool does not serve, a nil or ended context) is returned as an
// *Error, with a nil slice.
//
// On goroutine lanes the calls move in chunks of up to 32 elements, up to 1024 elements in
// flight: a chunk's calls take their records together, go to one lane in one push and one
// wake-up, and Map waits for the chunk as one.
//
// On process and remote lanes a chunk of up to 128 elements is one call (of the task's
// twin, named with the suffix " (Map chunk)", which Stats and metrics count as a task of its
// own): the lane runs the elements one after the other and sends all their results back at
// once. Each element still fails or succeeds alone, with its own *Error; an element the
// lane did not start runs again by itself. What changes is what a lane's death costs: the
// chunk's results return together, so when a lane dies running a chunk, the elements of it
// that had started (finished or not) fail with WORKER_CRASHED, as the call the lane was
// running would, and the rest run elsewhere; with Idempotent they all run again. (When a
// remote lane's node is lost, the elements that had started are not known, and the whole
// chunk fails or, with Idempotent, runs again.) A
// result that would take a chunk's answer over Payload.MaxCall fails PAYLOAD_TOO_LARGE, or
// runs again by itself with Idempotent; a lane starts no element once its chunk's answer
// holds half the limit. An element's *Error names the lane that ran its chunk, and
// MaxCallsPerLane counts each element as a call.
//
// A task with a Timeout or HardTimeout gives each element a context of its own, and its
// elements go one by one.
func (t *Task[In, Out]) Map(ctx context.Context, p *Pool, in []In) ([]Out, error) {
	if _, cancel, err := t.prepare(ctx, p); err != nil {
		t.rejected(p, err)
		return nil, err
	} else if cancel != nil {
		cancel() // each element gets a timeout of its own
	}
	out := make([]Out, len(in))
	f := failures{task: t.def.Name()}
	switch {
	case t.def.Options().CallTimeout() > 0:
		t.mapEach(ctx, p, in, out, &f, nil)
	case len(in) == 0:
	case p.caps.Remote:
		t.mapTwins(ctx, p, in, out, &f)
	default:
		t.mapChunks(ctx, p, in, out, &f)
	}
	if len(f.list) > 0 {
		slices.SortFunc(f.list, func(a, b ElementError) int { return a.Index - b.Index })
		return out, &MapError{Task: t.def.Name(), Calls: len(in), Failed: f.list}
	}
	return out, nil
}

// failures collects a Map's failed elements.
type failures struct {
	task string
	list []ElementError
}

func (f *failures) add(i int, err error) {
	f.list = append(f.list, ElementError{Index: i, Err: asError(errorOf(err), f.task)})
}

// mapEach runs a Map whose elements each have a context of their own (a task timeout), one
// call at a time, up to mapWindow in flight: the elements of in, or those only lists.
func (t *Task[In, Out]) mapEach(ctx context.Context, p *Pool, in []In, out []Out, f *failures, only []int) {
	count := len(in)
	if only != nil {
		count = len(only)
	}
	calls := make([]mapCall[In, Out], min(count, mapWindow))
	head, n := 0, 0 // the oldest call in flight, and how many are
	wait := func() {
		c := &calls[head]
		v, err := t.await(c)
		out[c.i] = v
		if err != nil {
			f.add(c.i, err)
		}
		*c = mapCall[In, Out]{}
		head = (head + 1) % len(calls)
		n--
	}
	for j := range count {
		i := j
		if only != nil {
			i = only[j]
		}
		if n == len(calls) {
			wait()
		}
		c := &calls[(head+n)%len(calls)]
		if err := t.start(ctx, p, i, in[i], c); err != nil {
			f.add(i, err)
			continue
		}
		n++
	}
	for n > 0 {
		wait()
	}
}

// twinCaller is a task's twin as Map calls it: a *Task[[]In, []byte], made by Define (where
// its instantiation cannot recur).
type twinCaller[In any] interface {
	start(ctx context.Context, p *Pool, i int, in []In, c *mapCall[[]In, []byte]) error
	awaitBegan(c *mapCall[[]In, []byte]) ([]byte, chunkEnd, error)
}

// chunkEnd is what Map learns of a twin's call beyond its result: the index of the lane
// that answered it (-1: none did), and, if its lane died running it, how many of its
// elements had started (-1: not known).
type chunkEnd struct{ lane, began int }

// twinChunk is how many elements of a Map one call of the task's twin carries to a lane in
// another process (actors.TwinSuffix): 8 such calls make a Map's window.
const twinChunk = mapWindow / 8

// mapTwins runs a Map on lanes in other processes: each chunk of twinChunk elements is one
// call of the task's twin, which runs them one after the other on the lane and answers with
// all their outcomes; up to mapWindow elements are in flight. The elements a chunk did not
// run (its call could not start, or the lane left them: actors.Stale) run by themselves
// afterwards.
func (t *Task[In, Out]) mapTwins(ctx context.Context, p *Pool, in []In, out []Out, f *failures) {
	tw := t.twin()
	calls := make([]mapCall[[]In, []byte], min((len(in)+twinChunk-1)/twinChunk, mapWindow/twinChunk))
	var alone []int
	head, n, next := 0, 0, 0
	for next < len(in) || n > 0 {
		if next < len(in) && n < len(calls) {
			k := min(twinChunk, len(in)-next)
			if err := tw.start(ctx, p, next, in[next:next+k], &calls[(head+n)%len(calls)]); err != nil {
				for i := range k { // each gets its own error, or runs
					alone = append(alone, next+i)
				}
			} else {
				n++
			}
			next += k
			continue
		}
		c := &calls[head]
		first, k := c.i, len(c.r.In)
		raw, end, err := tw.awaitBegan(c)
		t.chunkDone(first, k, raw, end, err, out, f, &alone)
		*c = mapCall[[]In, []byte]{}
		head = (head + 1) % len(calls)
		n--
	}
	if len(alone) > 0 {
		t.mapEach(ctx, p, in, out, f, alone)
	}
}

// chunkDone takes the outcome of a twin's call for elements first to first+k-1 into out and
// f: each element's result (raw), or the call's error. Elements the lane did not run go to
// alone. When the chunk's lane died running it, the elements that had started (end.began,
// -1 where not known: all) fail with its error, as calls the lane was running would, or run
// again by themselves if the task is Idempotent; the others run by themselves. Any other
// error (a lane that answered what cannot be decoded, too) fails every element: they may
// have run.
func (t *Task[In, Out]) chunkDone(first, k int, raw []byte, end chunkEnd, err error, out []Out, f *failures, alone *[]int) {
	if err != nil {
		e := *asError(err, t.def.Name())
		e.Task = t.def.Name()
		failed := k
		if e.Code == CodeWorkerCrashed && e.Started { // the lane died running the chunk
			switch {
			case t.def.Options().Idempotent:
				failed = 0
			case end.began >= 0:
				failed = min(end.began, k)
			}
		}
		for i := range k {
			if i < failed {
				f.list = append(f.list, ElementError{Index: first + i, Err: &e})
			} else {
				*alone = append(*alone, first+i)
			}
		}
		return
	}
	n, entries := actors.ChunkResults(raw)
	if n != k {
		err := brokeProtocol(end.lane, t.def, fmt.Errorf("a chunk of %d elements answered with %d", k, n))
		for i := range k {
			f.list = append(f.list, ElementError{Index: first + i, Err: err})
		}
		return
	}
	i := first
	for e, err := range entries {
		if err != nil { // checked when the result settled (chunkOut.Decode): not seen
			for ; i < first+k; i++ {
				f.list = append(f.list, ElementError{Index: i, Err: brokeProtocol(end.lane, t.def, err)})
			}
			return
		}
		if err := t.element(e, &out[i], end.lane); err != nil {
			f.list = append(f.list, ElementError{Index: i, Err: err})
		} else if e.Outcome == actors.Stale {
			*alone = append(*alone, i)
		}
		i++
	}
}

// element decodes one entry of a chunk's result, which lane answered, into v, or returns
// its error.
func (t *Task[In, Out]) element(e actors.ChunkEntry, v *Out, lane int) *Error {
	switch e.Outcome {
	case actors.OK:
		var err error
		if *v, err = t.def.OutCdc.Decode(e.Payload()); err != nil {
			return brokeProtocol(lane, t.def, err)
		}
		return nil
	case actors.Stale:
		return nil
	}
	we, err := actors.DecodeWireError(e.Payload())
	if err != nil {
		return brokeProtocol(lane, t.def, err)
	}
	if err := wrapOutcome(lane, t.def, e.Outcome, we); err != nil {
		return asError(err, t.def.Name())
	}
	return brokeProtocol(lane, t.def, fmt.Errorf("element outcome %v", e.Outcome))
}

// chunk is a chunk of a Map's calls in flight: elements first to first+len(recs)-1.
type chunk[In, Out any] struct {
	b     actors.Batch
	first int
	recs  []*actors.Record[In, Out] // nil where the element did not start (it failed); in own
	own   [mapChunk]*actors.Record[In, Out]
}

// mapChunks runs a Map whose elements share its context in chunks (mapChunk), up to
// mapWindow elements in flight.
func (t *Task[In, Out]) mapChunks(ctx context.Context, p *Pool, in []In, out []Out, f *failures) {
	per := min(len(in), mapChunk)
	chunks := make([]chunk[In, Out], min((len(in)+per-1)/per, mapWindow/mapChunk))
	m := mapper[In, Out]{t: t, p: p, ctx: ctx, failed: f, done: actors.NewBatchDone()}
	for i := range chunks {
		chunks[i].recs = chunks[i].own[:0:per]
	}
	head, n, next := 0, 0, 0
	for next < len(in) || n > 0 {
		if next < len(in) && n < len(chunks) {
			c := &chunks[(head+n)%len(chunks)]
			k := min(per, len(in)-next)
			m.start(c, next, in[next:next+k])
			next += k
			n++
			continue
		}
		m.finish(&chunks[head], out)
		head = (head + 1) % len(chunks)
		n--
	}
	for i := range chunks { // the records kept for reuse
		for _, r := range chunks[i].recs[:cap(chunks[i].recs)] {
			if r != nil {
				t.def.Records.Release(r)
			}
		}
	}
}

// mapper is a Map's state that its chunks share.
type mapper[In, Out any] struct {
	t      *Task[In, Out]
	p      *Pool
	ctx    context.Context
	failed *failures
	done   chan struct{}                     // the chunks' completion (actors.Batch)
	local  [mapChunk]actors.LocalCall        // a chunk's calls, for a goroutine lane's push
	calls  [mapChunk]actors.Call             // a chunk's calls, for a process lane's ring
	recs   [mapChunk]*actors.Record[In, Out] // their records
}

func (m *mapper[In, Out]) fail(i int, err error) { m.failed.add(i, err) }

// start starts the calls of chunk c, for elements first, first+1, … (in): it takes their
// records (the chunk's last ones again, where their calls have let go of them), starts them
// as calls of c's batch and submits them to one lane together. An element that cannot start
// fails at once.
func (m *mapper[In, Out]) start(c *chunk[In, Out], first int, in []In) {
	t, p := m.t, m.p
	recs := c.recs[:len(in)]
	c.first, c.recs = first, recs
	if err := m.ctx.Err(); err != nil {
		err = ctxError(m.ctx, t.def)
		for i := range in {
			t.rejected(p, err)
			m.fail(first+i, err)
			if r := recs[i]; r != nil {
				t.def.Records.Release(r)
				recs[i] = nil
			}
		}
		c.b.Reset(0, m.done)
		return
	}
	// Records: the chunk's previous ones where only the Map holds them, new ones for the rest.
	need := 0
	for i, r := range recs {
		if r != nil && !t.def.Records.Reuse(r) {
			t.def.Records.Release(r)
			recs[i] = nil
		}
		if recs[i] == nil {
			recs[need], recs[i] = recs[i], recs[need] // the holes first
			need++
		}
	}
	got, err := t.def.Records.AllocN(recs[:need])
	if err != nil {
		err = &Error{Code: CodeOverloaded, Lane: -1, Task: t.def.Name(), Cause: err}
	}
	// Holes were moved to the front: the records that start are recs[:got] and recs[need:];
	// the order of records in a chunk is free, the element of each is its place.
	c.b.Reset(len(in)-(need-got), m.done)
	for i := range in {
		if i >= got && i < need {
			t.rejected(p, err)
			m.fail(first+i, err)
			continue
		}
		r := recs[i]
		r.StartIn(m.ctx, in[i], p.id, &c.b)
		observe(p, r, t.def.Index())
	}
	if p.local {
		m.submitLocal(c, got, need)
	} else {
		m.submitRing(c, got, need)
	}
}

// skip reports whether element i of a chunk whose holes are recs[got:need] did not start.
func skip(i, got, need int) bool { return i >= got && i < need }

// submitLocal submits a chunk's started calls to a goroutine lane in one push; those it
// cannot push there go one by one, as Call's would.
func (m *mapper[In, Out]) submitLocal(c *chunk[In, Out], got, need int) {
	p := m.p
	batch := m.local[:0]
	for i, r := range c.recs {
		if !skip(i, got, need) {
			batch = append(batch, r)
		}
	}
	if l := p.pick(nil); l != nil && !p.closing.Load() {
		pushed, err := l.submitLocalBatch(batch)
		if pushed {
			clear(batch)
			return
		}
		if err == nil { // the lane ended meanwhile: what its end did not take goes again
			for _, c := range batch {
				if actors.TakeBack(c, l.key) {
					l.unhold()
					m.dispatchOne(c.(*actors.Record[In, Out]))
				}
			}
			clear(batch)
			return
		}
	}
	for _, r := range batch {
		m.dispatchOne(r.(*actors.Record[In, Out]))
	}
	clear(batch)
}

// submitRing submits a chunk's started calls to a process lane (or a stealing pool's lanes)
// with one publication of its ring; those it cannot take there go one by one.
func (m *mapper[In, Out]) submitRing(c *chunk[In, Out], got, need int) {
	t, p := m.t, m.p
	calls, recs := m.calls[:0], m.recs[:0]
	for i, r := range c.recs {
		if skip(i, got, need) {
			continue
		}
		call, err := t.newCall(m.ctx, p, r)
		if err != nil {
			m.failOne(r, err)
			continue
		}
		calls, recs = append(calls, call), append(recs, r)
	}
	taken := 0
	if l := p.pick(nil); l != nil && p.shared == nil && !p.closing.Load() && l.ring != nil {
		taken, _ = l.ring.SubmitBatch(calls)
		if taken > 0 {
			l.crowded()
		}
	}
	for i := taken; i < len(calls); i++ {
		m.dispatchCall(calls[i], recs[i])
	}
	clear(calls)
	clear(recs)
}

// dispatchOne submits a started call of a goroutine lane's chunk by itself.
func (m *mapper[In, Out]) dispatchOne(r *actors.Record[In, Out]) {
	m.dispatchCall(actors.Call{Def: m.t.def, Lane: &r.Lane, Local: r, Done: m.ctx.Done()}, r)
}

// dispatchCall submits a started call by itself, as Call does; one that finds no lane
// settles with the error.
func (m *mapper[In, Out]) dispatchCall(call actors.Call, r *actors.Record[In, Out]) {
	h, err := m.p.dispatch(m.ctx, call)
	if err != nil {
		_, err = m.t.failure(m.ctx, err)
		r.Fail(err)
		m.t.def.Records.Release(r) // the dispatch reference: the Map keeps its own
		return
	}
	h.crowded()
}

// failOne settles a started call that could not be submitted (its input did not encode).
func (m *mapper[In, Out]) failOne(r *actors.Record[In, Out], err error) {
	r.Fail(err)
	m.t.def.Records.Release(r) // the dispatch reference
}

// finish waits for chunk c's calls, as Call waits for one, and collects their results.
func (m *mapper[In, Out]) finish(c *chunk[In, Out], out []Out) {
	t, p, b := m.t, m.p, &c.b
	if b.Pending() && p.reaped {
		p.help(b) // a process lane's results wait to be drained: drain while spinning pays
	}
	if b.Pending() {
		if p.reaped {
			p.block() // every reaper drains until the chunk has settled
		}
		if done := m.ctx.Done(); done != nil {
		wait:
			for b.Pending() {
				select {
				case <-b.Wake():
				case <-done:
					for _, r := range c.recs {
						if r != nil && r.Pending() && r.Ctx() != nil {
							t.expire(m.ctx, p, r)
						}
					}
					b.Wait()
					break wait
				}
			}
		} else {
			b.Wait()
		}
		if p.reaped {
			p.unblock()
		}
	}
	for i, r := range c.recs {
		if r == nil {
			continue
		}
		out[c.first+i] = r.Out
		if r.Err != nil {
			m.fail(c.first+i, r.Err)
		}
	}
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
		if l := p.pick(nil); l != nil && !p.closing.Load() && l.submitLocal(&r.Lane, r) == nil {
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
	v, _, err := t.awaitBegan(c)
	return v, err
}

// awaitBegan is await for a twin's call: it also reports which lane answered it and how
// many of the chunk's elements had started if its lane died running it (chunkEnd).
func (t *Task[In, Out]) awaitBegan(c *mapCall[In, Out]) (Out, chunkEnd, error) {
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
	v, err, end := r.Out, r.Err, chunkEnd{lane: -1, began: -1}
	if b, ok := r.Began(); ok {
		end.began = b
	}
	if key, ok := r.Answered(); ok {
		end.lane = int(key) % maxLanes
	}
	t.def.Records.Release(r)
	return v, end, err
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
