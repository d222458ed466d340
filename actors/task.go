// Package actors holds knit's task actors: typed task definitions, the registry that gives
// each a stable index and fingerprint, the codecs that carry their values across processes,
// the typed reusable call records, the executor that runs calls on the consumer side of a
// lane, and the host end of a lane's rings (HostRing), which publishes calls and settles
// results. It never decides where a call runs or what happens when a lane dies: that is the
// pool's and the supervisor's business. (The name: each task is an actor, a typed behaviour
// with a mailbox, and a lane's rings are that mailbox.)
package actors

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"reflect"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/fastpath"
)

// Options are a task's settings, fixed at definition.
type Options struct {
	Timeout     time.Duration // calls are settled with a timeout error after this long (0: none)
	Default     any           // with HasDefault: resolve with this value instead of the timeout error
	HasDefault  bool
	HardTimeout time.Duration // an overrunning call kills its process lane (lifecycle work)
	Idempotent  bool          // a call lost to a lane crash may run again elsewhere
	Codec       any           // a Codec[In] or Codec[Out] replacing the chosen one
}

// CallTimeout is when a call gives up: the shorter of Timeout and HardTimeout. (A process
// lane whose call overran HardTimeout is killed by the host and restarted by the supervisor.)
func (o *Options) CallTimeout() time.Duration {
	switch {
	case o.HardTimeout > 0 && (o.Timeout == 0 || o.HardTimeout < o.Timeout):
		return o.HardTimeout
	}
	return o.Timeout
}

// Def is the type-erased face of a task that lanes and pools use.
type Def interface {
	Name() string
	Index() uint32
	Fingerprint() uint64
	Options() *Options
	// Codecs names the input and output codecs (see Codec.Name).
	Codecs() (in, out string)
	// RunLocal runs call id of generation gen on its record (in-process lanes: the value is
	// shared by reference, nothing is encoded).
	RunLocal(id, gen uint32) Outcome
	// RunEncoded decodes an input, runs the function and appends the encoded output (or the
	// encoded error) to dst (process lanes).
	RunEncoded(ctx context.Context, in []byte, dst []byte) ([]byte, Outcome)
	// PanicOf returns the *PanicError an in-process call ended with.
	PanicOf(id uint32) error
	// SettleResult settles call id of generation gen from a result slot of lane and drops
	// the lane's reference. local means the lane already left its result on the record;
	// otherwise payload is decoded. An error means the result names no call of owner that
	// lane holds: the lane that wrote it is broken (or hostile), and nothing was settled.
	// ran is how long the call ran on the lane in nanoseconds, as the lane reports it (0:
	// not timed), for the pool's Observer.
	SettleResult(owner uint64, lane int32, id, gen uint32, o Outcome, payload []byte, local bool, ran uint64, w Wrapper) error
	// FailLane settles every call of e.Owner that lane e.Lane holds and reports how many it
	// held: calls that had not started run again elsewhere, whatever their task; calls that
	// had started fail, or run again once if their task is Idempotent (see LaneEnd).
	FailLane(e LaneEnd) int
	// Drop lets go of ring lane's reference to call id of generation gen, which leaves its
	// backlog without running because its caller's context has ended: the caller settles
	// it (or has), as it always does when its context ends. False, and nothing done, when
	// the ring does not hold that call.
	Drop(lane int32, id, gen uint32) bool
	// Withdraw moves the calls of e.Owner that live lane e.Lane holds and provably has not
	// started (published after e.Started, or still in its backlog) to another lane with
	// e.Requeue, and reports how many; the lane's ring has taken them back (HostRing.Withdraw).
	Withdraw(e LaneEnd) int
}

// Wrapper turns a lane's outcome into the error its caller sees.
type Wrapper interface {
	Wrap(t Def, o Outcome, err error) error
}

// Outcome is how a call ended on the lane.
type Outcome uint32

// Outcomes, carried in a result slot's flags.
const (
	OK        Outcome = iota
	Failed            // the task returned an error
	Panicked          // the task panicked
	Stale             // the record was reused: nothing ran
	BadInput          // the input did not decode
	BadOutput         // the output did not encode
	Withdrawn         // the host took the call back before it started (fastpath.Gate): it runs elsewhere
)

var outcomeNames = [...]string{OK: "ok", Failed: "failed", Panicked: "panicked", Stale: "stale",
	BadInput: "bad input", BadOutput: "bad output", Withdrawn: "withdrawn"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint32(o))
}

// PanicError is a panic caught in a task. Its Error is "panic: " and the value, never the
// stack, so that a handler may pass err.Error() on to a client; the stack is in Stack, for
// logs, reached with errors.As.
type PanicError struct {
	// Value is what the task passed to panic; from a process lane, its text (fmt's %v).
	Value any
	// Stack is the panicking goroutine's stack (debug.Stack), from whichever process it ran in.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// AsPanic returns err as a *PanicError: err itself if it is one (in-process lanes), or
// rebuilt from the WireError a process lane sent for a panicking call.
func AsPanic(err error) *PanicError {
	var pe *PanicError
	if errors.As(err, &pe) {
		return pe
	}
	var we WireError
	if errors.As(err, &we) {
		return &PanicError{Value: we.Message, Stack: []byte(we.Stack)}
	}
	if err == nil {
		return &PanicError{Value: "unknown panic"}
	}
	return &PanicError{Value: err.Error()}
}

var registry struct {
	sync.RWMutex
	byName map[string]Def
	list   []Def // nil at the index of a twin not made yet
}

// Lookup returns the task registered under name (a twin's name makes the twin).
func Lookup(name string) (Def, bool) {
	registry.RLock()
	d, ok := registry.byName[name]
	registry.RUnlock()
	if ok {
		return d, true
	}
	base, twin := strings.CutSuffix(name, TwinSuffix)
	if !twin {
		return nil, false
	}
	registry.Lock()
	defer registry.Unlock()
	if t, ok := registry.byName[base].(interface{ twinLocked() Def }); ok {
		if d := t.twinLocked(); d != nil {
			return d, true
		}
	}
	return nil, false
}

// Count returns how many registry indices are taken: every task's index is below it.
func Count() int {
	registry.RLock()
	defer registry.RUnlock()
	return len(registry.list)
}

// Fingerprint identifies a task across processes: its name and the identity of its In and
// Out types (package path and type string).
func Fingerprint(name string, in, out reflect.Type) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s", name, in.PkgPath(), in.String(), out.PkgPath(), out.String())
	return h.Sum64()
}

// Task is a typed task definition.
type Task[In, Out any] struct {
	name    string
	index   uint32
	fp      uint64
	fn      func(context.Context, In) (Out, error)
	opts    Options
	def     Out
	InCodec Codec[In]
	OutCdc  Codec[Out]
	inLimit limiter[In] // InCodec's, once Define (or the twin's maker) has set it
	Records Table[In, Out]
	// twin is the task's twin (Twin), once made; the registry's lock guards it. makeTwin
	// makes it (twinMaker), and chunk runs a twin's chunks (RunChunk): nil for a twin, and
	// nil for a task, respectively.
	twin     Def
	makeTwin func(index uint32) Def
	chunk    func(ctx context.Context, in, dst []byte, limit int, crash bool, mark func(int)) ([]byte, Outcome)
}

// Define registers a task. It panics on a duplicate name, on a type no codec carries, or on
// an option that does not fit the task's types: these are programming errors found at init.
func Define[In, Out any](name string, fn func(context.Context, In) (Out, error), opts Options) *Task[In, Out] {
	if name == "" || fn == nil {
		panic("knit: Define needs a name and a function")
	}
	if strings.HasSuffix(name, TwinSuffix) {
		panic(fmt.Sprintf("knit: task %q: names ending in %q are knit's own", name, TwinSuffix))
	}
	t := &Task[In, Out]{name: name, fn: fn, opts: opts,
		fp: Fingerprint(name, reflect.TypeFor[In](), reflect.TypeFor[Out]())}
	if opts.HasDefault {
		v, ok := opts.Default.(Out)
		if !ok && opts.Default != nil {
			panic(fmt.Sprintf("knit: task %q: TimeoutDefault value is %T, want %v", name, opts.Default, reflect.TypeFor[Out]()))
		}
		t.def = v
	}
	var err error
	switch c := opts.Codec.(type) {
	case nil:
	case Codec[In]:
		t.InCodec = c
	case Codec[Out]:
		t.OutCdc = c
	default:
		panic(fmt.Sprintf("knit: task %q: WithCodec(%T) is neither a Codec[%v] nor a Codec[%v]",
			name, opts.Codec, reflect.TypeFor[In](), reflect.TypeFor[Out]()))
	}
	if t.InCodec == nil {
		if t.InCodec, err = CodecFor[In](); err != nil {
			panic(fmt.Sprintf("knit: task %q input: %v", name, err))
		}
	}
	if t.OutCdc == nil {
		if t.OutCdc, err = CodecFor[Out](); err != nil {
			panic(fmt.Sprintf("knit: task %q output: %v", name, err))
		}
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.byName == nil {
		registry.byName = map[string]Def{}
	}
	if _, dup := registry.byName[name]; dup {
		panic(fmt.Sprintf("knit: task %q is defined twice; task names must be unique", name))
	}
	t.inLimit = limiterOf(t.InCodec)
	t.makeTwin = twinMaker(t)
	register(t)
	// The twin's index is the next one, made when first needed (Twin): a task that no Map
	// on lanes in other processes runs costs no twin.
	registry.list = append(registry.list, nil)
	return t
}

// register gives t the next registry index. registry is locked.
func register[In, Out any](t *Task[In, Out]) {
	t.index = uint32(len(registry.list))
	t.Records.task, t.Records.def = t.index, t
	registry.byName[t.name] = t
	registry.list = append(registry.list, t)
}

// Name implements Def.
func (t *Task[In, Out]) Name() string { return t.name }

// Index implements Def.
func (t *Task[In, Out]) Index() uint32 { return t.index }

// Fingerprint implements Def.
func (t *Task[In, Out]) Fingerprint() uint64 { return t.fp }

// Codecs implements Def.
func (t *Task[In, Out]) Codecs() (in, out string) { return t.InCodec.Name(), t.OutCdc.Name() }

// Options implements Def.
func (t *Task[In, Out]) Options() *Options { return &t.opts }

// TimeoutValue is the TimeoutDefault value.
func (t *Task[In, Out]) TimeoutValue() Out { return t.def }

// call runs fn, turning a panic into a PanicError.
func (t *Task[In, Out]) call(ctx context.Context, in In) (out Out, err error, panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			err, panicked = &PanicError{Value: v, Stack: debug.Stack()}, true
		}
	}()
	out, err = t.fn(ctx, in)
	return out, err, false
}

// RunLocal implements Def.
func (t *Task[In, Out]) RunLocal(id, gen uint32) Outcome {
	r := t.Records.Get(id)
	if r == nil || r.Gen.Load() != gen || r.ctx == nil {
		return Stale
	}
	if err := r.ctx.Err(); err != nil { // the caller gave up before the call started
		r.LaneErr = err
		return Failed
	}
	var panicked bool
	r.LaneOut, r.LaneErr, panicked = t.call(r.ctx, r.In)
	switch {
	case panicked:
		return Panicked
	case r.LaneErr != nil:
		return Failed
	}
	return OK
}

// PanicOf implements Def.
func (t *Task[In, Out]) PanicOf(id uint32) error {
	if r := t.Records.Get(id); r != nil {
		return r.LaneErr
	}
	return &PanicError{Value: "unknown call"}
}

// RunEncoded implements Def.
func (t *Task[In, Out]) RunEncoded(ctx context.Context, in []byte, dst []byte) ([]byte, Outcome) {
	v, err := t.InCodec.Decode(in)
	if err != nil {
		return EncodeWireError(dst, CodeUnsupportedType, "input did not decode: "+err.Error()), BadInput
	}
	out, err, panicked := t.call(ctx, v)
	switch {
	case panicked:
		pe := err.(*PanicError)
		return EncodeWireStack(dst, "", fmt.Sprint(pe.Value), pe.Stack), Panicked
	case err != nil:
		code, msg := wireOf(err)
		return EncodeWireError(dst, code, msg), Failed
	}
	res, err := t.OutCdc.Append(dst, out)
	if err != nil {
		return EncodeWireError(dst[:0], CodeUnsupportedType, "output did not encode: "+err.Error()), BadOutput
	}
	return res, OK
}

// Codes a lane puts in the WireError of a BadInput or BadOutput outcome (the strings of
// knit's CodeUnsupportedType and CodePayloadTooLarge): the call's value could not cross,
// and the lane is fine.
const (
	CodeUnsupportedType = "UNSUPPORTED_TYPE"
	CodePayloadTooLarge = "PAYLOAD_TOO_LARGE"
)

// Coded is an error that carries a knit code across processes.
type Coded interface {
	KnitCode() string
	KnitMessage() string
}

// wireOf is how a task's error crosses to the host: its code and message if it has a knit
// code, else its text.
func wireOf(err error) (code, msg string) {
	var c Coded
	if errors.As(err, &c) {
		return c.KnitCode(), c.KnitMessage()
	}
	return "", err.Error()
}

// Record is one call in flight: typed, reused, found by index from a slot. The caller and
// the dispatch side (backlog, then lane) each hold a reference; the record is free again
// only when both let go, so a lane never touches a record handed to another call.
type Record[In, Out any] struct {
	ID    uint32
	Gen   atomic.Uint32 // bumped at every reuse; a slot naming an older generation is stale
	Lane  atomic.Int32  // lane holding the call, -1 while in the backlog
	Abort atomic.Int32  // the call's abort bit on its lane, -1 for none
	Enc   []byte        // the encoded input (process lanes), reused across calls
	// refs holds the references and the state in one word, so that starting a call is one
	// store and a free record needs no store of its state.
	refs refState
	// Seq is the call's sequence number on the lane it was last published to (0 while it is
	// in a backlog or looking for a lane): it tells, when that lane dies, whether it started.
	Seq atomic.Uint64
	// deaths counts the lanes that died while the call was running on them.
	deaths uint8
	// began is, for a twin's call (a Map chunk) that was running when its lane died, 1 + how
	// many of its elements had started; 0 where that is not known.
	began uint16
	// answered is 1 + the key of the lane whose result settled the call; 0 when none did
	// (Map names the lane in the errors of a chunk's elements).
	answered int32
	// Hard is when the call overruns its task's HardTimeout (zero: none).
	Hard  time.Time
	owner atomic.Uint64 // the pool that issued the call
	ctx   context.Context
	In    In
	// Written by the lane (in-process) or the result decoder, read by the settle winner.
	LaneOut Out
	LaneErr error
	// Written by the settle winner, read by the caller after Done.
	Out   Out
	Err   error
	done  chan struct{}
	fut   *Future[Out]
	batch *Batch // the batch the call belongs to (nil: its caller waits on done)
	table *Table[In, Out]
	link  localNode // its place in a LocalLane's queue
	// obs, if set, is told when the call settles; Begun is when it was submitted (the
	// observer's clock).
	obs   Observer
	Begun int64
	// fails, if set, is told when the call fails, whether or not obs times it.
	fails FailObserver
}

// Record states. A record with no reference is free, whatever its state says.
const (
	stateFree uint32 = iota
	statePending
	stateSettled // settled, or being settled: its winner writes Out and Err, then signals
	stateTaken   // taken by Alloc, not yet started
)

// refState is a record's reference count and state in one word: the count above stateBits,
// the state below. Every call path store is a full barrier on amd64 (XCHG): one word means
// one store where two fields took two.
type refState struct{ w atomic.Uint32 }

const (
	stateBits = 8
	stateMask = 1<<stateBits - 1
)

// Load returns the reference count.
func (s *refState) Load() int32 { return int32(s.w.Load() >> stateBits) }

// Store sets the reference count; the state reads free.
func (s *refState) Store(n int32) { s.w.Store(uint32(n) << stateBits) }

// Add adds d to the reference count and returns the new count.
func (s *refState) Add(d int32) int32 { return int32(s.w.Add(uint32(d)<<stateBits) >> stateBits) }

// state returns the state.
func (s *refState) state() uint32 { return s.w.Load() & stateMask }

// A free record's word is 0: no reference, state free. A released record keeps its last
// state (never free) until Release has reset it and stores 0, so that no taker sees a
// record half-released.

// free reports whether the record is free.
func (s *refState) free() bool { return s.w.Load() == 0 }

// claim takes a free record for its taker (one reference, not yet started); false if it
// is not free (another taker has it).
func (s *refState) claim() bool { return s.w.CompareAndSwap(0, 1<<stateBits|stateTaken) }

// claimNew is claim for a record no one else can see yet.
func (s *refState) claimNew() { s.w.Store(1<<stateBits | stateTaken) }

// setFree frees a reset record that has no reference left.
func (s *refState) setFree() { s.w.Store(0) }

// start sets both at once.
func (s *refState) start(refs int32, state uint32) { s.w.Store(uint32(refs)<<stateBits | state) }

// settle moves a pending record to settled, keeping its references; false if it was not
// pending.
func (s *refState) settle() bool {
	for {
		w := s.w.Load()
		if w&stateMask != statePending {
			return false
		}
		if s.w.CompareAndSwap(w, w&^stateMask|stateSettled) {
			return true
		}
	}
}

// settleDrop is settle for a holder that lets go of its reference in the same step (a
// LocalLane settling the call it ran): the count it leaves is another holder's.
func (s *refState) settleDrop() bool {
	for {
		w := s.w.Load()
		if w&stateMask != statePending {
			return false
		}
		if s.w.CompareAndSwap(w, (w-1<<stateBits)&^stateMask|stateSettled) {
			return true
		}
	}
}

// Start prepares a fresh record for a call with two references (caller and dispatch).
//
// A free record's Lane is -1 already (every settle path leaves it so, and Alloc starts it
// so); its Abort is set by the lane that takes it. Stores cost a full barrier each on the
// call path: Start does only the ones it must.
func (r *Record[In, Out]) Start(ctx context.Context, in In, owner uint64) {
	r.ctx, r.In = ctx, in
	if r.owner.Load() != owner {
		r.owner.Store(owner)
	}
	r.deaths, r.began, r.answered = 0, 0, 0
	r.refs.start(2, statePending)
}

// Observe has obs told when the call settles; begun is when it was submitted, on obs's
// clock. A call with no observer costs nothing more.
func (r *Record[In, Out]) Observe(obs Observer, begun int64) {
	r.obs, r.Begun = obs, begun
}

// OnFail has f told if the call fails.
func (r *Record[In, Out]) OnFail(f FailObserver) { r.fails = f }

// FailObserver is told of every call that fails (a pool's Stats): its task's registry index
// and its error. It must not block.
type FailObserver interface {
	Failed(task uint32, err error)
}

// Observer is told of every call that settles (a pool's metrics): its task's registry index,
// its error (nil: it succeeded), when it was submitted and how long it ran on its lane in
// nanoseconds (0: unknown; a lane's report: hostile). It must not block or allocate.
type Observer interface {
	Settled(task uint32, err error, begun int64, ran uint64)
}

// Ctx is the caller's context.
func (r *Record[In, Out]) Ctx() context.Context { return r.ctx }

// Pending reports whether the call is still unsettled.
func (r *Record[In, Out]) Pending() bool { return r.refs.state() == statePending }

// SettleLane ends the call with the lane's result (LaneOut, and err for a failed call). Only
// the first settle of a call wins; it reports whether this one did.
func (r *Record[In, Out]) SettleLane(err error) bool { return r.finish(r.LaneOut, err, 0) }

// settleRan is SettleLane for a call that ran for ran nanoseconds, as its lane reports.
func (r *Record[In, Out]) settleRan(err error, ran uint64) bool { return r.finish(r.LaneOut, err, ran) }

// Resolve ends the call with v.
func (r *Record[In, Out]) Resolve(v Out) bool { return r.finish(v, nil, 0) }

// Fail ends the call with err.
func (r *Record[In, Out]) Fail(err error) bool {
	var zero Out
	return r.finish(zero, err, 0)
}

func (r *Record[In, Out]) finish(out Out, err error, ran uint64) bool {
	if !r.refs.settle() {
		return false
	}
	r.finished(out, err, ran)
	return true
}

// finishDrop is finish for the dispatch side's holder, which lets go of its reference too
// if it settles the call: it must not touch the record then.
func (r *Record[In, Out]) finishDrop(out Out, err error, ran uint64) bool {
	if !r.refs.settleDrop() {
		return false
	}
	r.finished(out, err, ran)
	return true
}

func (r *Record[In, Out]) finished(out Out, err error, ran uint64) {
	r.Out, r.Err = out, err
	if r.obs != nil { // before the caller wakes: the record is not reused until then
		r.obs.Settled(r.table.task, err, r.Begun, ran)
	}
	if err != nil && r.fails != nil {
		r.fails.Failed(r.table.task, err)
	}
	r.settled()
}

func (r *Record[In, Out]) settled() {
	// No store of a settled state: Pending turned false at the CAS, and whoever reads Out
	// waits for the signal below first.
	if r.fut != nil {
		r.settleFuture()
		return
	}
	if b := r.batch; b != nil {
		b.settled()
		return
	}
	r.done <- struct{}{}
}

// Batch is the completion of calls whose caller waits for them together (Task.Map's
// chunks): each settles as any call does, and the one that settles last wakes the caller,
// once, on a channel the caller may share between its batches. A call of a batch gives its
// record's Done no token: its caller reads its result once the batch is done.
type Batch struct {
	pending atomic.Int32
	done    chan struct{}
}

// NewBatchDone returns a channel for batches to signal on (Reset): one token at most waits
// in it, for the one goroutine that waits for its batches.
func NewBatchDone() chan struct{} { return make(chan struct{}, 1) }

// Reset readies b for n calls, signalling on done.
func (b *Batch) Reset(n int, done chan struct{}) {
	b.done = done
	b.pending.Store(int32(n))
}

// Pending reports whether a call of the batch is unsettled.
func (b *Batch) Pending() bool { return b.pending.Load() != 0 }

// Wait blocks until every call of the batch has settled. A token left on the shared channel
// by another batch (or by this one, since its last call settled) only makes it look again.
func (b *Batch) Wait() {
	for b.pending.Load() != 0 {
		<-b.done
	}
}

// Wake is the channel Wait blocks on, for a caller that selects on it beside another (its
// context): it then looks at Pending again.
func (b *Batch) Wake() <-chan struct{} { return b.done }

// settled counts one of the batch's calls settled; the last wakes the caller. The send
// never blocks: a token already waiting wakes the caller just as well. The channel is read
// before the count: once it reaches zero the caller may reset the batch for its next calls.
func (b *Batch) settled() {
	done := b.done
	if b.pending.Add(-1) == 0 {
		select {
		case done <- struct{}{}:
		default:
		}
	}
}

// StartIn is Start for a call of batch b: its caller waits for the batch, not the call.
func (r *Record[In, Out]) StartIn(ctx context.Context, in In, owner uint64, b *Batch) {
	r.batch = b
	r.Start(ctx, in, owner)
}

// Began reports, for a twin's call that was running when its lane died, how many of its
// elements had started; false where that is not known.
func (r *Record[In, Out]) Began() (int, bool) { return int(r.began) - 1, r.began > 0 }

// Answered reports the key of the lane whose result settled the call; false when none did
// (it failed, or a shared ring's lane answered it).
func (r *Record[In, Out]) Answered() (int32, bool) { return r.answered - 1, r.answered > 0 }

// Done receives one token when the call settles; the caller takes it before Release.
func (r *Record[In, Out]) Done() <-chan struct{} { return r.done }

// Table holds a task's records in levels that double in size, so that a record never moves
// and lookups by index take no lock, and so that a task costs only as much as its calls in
// flight ever needed: an unused task's table is the levels' pointers, nothing more, and the
// first call makes a level of firstLevel records. (A table of 4,096 fixed chunk pointers made
// every Define cost 40 KB of heap, 400 MB for 10,000 tasks, in the host and in every lane.)
//
// Free records wait in a sync.Pool: a call takes one and gives it back on its own P's cache,
// where a free list shared by every caller and lane moved one cache line between cores per
// call (docs/benchmarks.md, "Records: a free list no caller shares"). The pool may drop what
// it holds at a garbage collection; a dropped record is still free (refs word 0) and a scan
// of the table finds it again.
type Table[In, Out any] struct {
	task  uint32         // the task's registry index
	def   *Task[In, Out] // the task, which a LocalLane runs its records with
	cache sync.Pool      // *Record: free records, maybe some twice or some taken since
	mu    sync.Mutex
	n     uint32 // under mu: records that exist
	scan  uint32 // under mu: where the next scan for dropped records starts
	// The levels never shrink and a level is never replaced: a record's address is stable
	// for the table's life. Level k holds firstLevel<<k records, from index
	// firstLevel*(2^k-1). Level 0, where a task with few calls in flight finds all of them,
	// is first, an array whose records are found with one load; levels[0] is not used.
	first  atomic.Pointer[[firstLevel]Record[In, Out]]
	levels [maxLevels]atomic.Pointer[[]Record[In, Out]]
}

const (
	firstLevelBits = 4
	firstLevel     = 1 << firstLevelBits // records made by a task's first call
	maxLevels      = 18
	// maxRecords is the most records a task has: 4 M calls in flight.
	maxRecords = firstLevel * (1<<maxLevels - 1)
	// scanBudget bounds the records a slow Alloc looks at for one the cache dropped
	// before it makes a new one: a table grows only while its records are mostly busy.
	scanBudget = 64
)

// place returns the level that holds record id and its offset in it: with x = id +
// firstLevel, level k holds the x whose highest set bit is firstLevelBits+k. One
// count-leading-zeros instruction; id is widened so that no uint32 overflows.
func place(id uint32) (level int, off uint64) {
	x := uint64(id) + firstLevel
	k := bits.Len64(x) - 1 - firstLevelBits
	return k, x - firstLevel<<k
}

// Get returns record id, or nil when id names none (a hostile or stale index).
func (t *Table[In, Out]) Get(id uint32) *Record[In, Out] {
	var r *Record[In, Out]
	if id < firstLevel { // a typed array: one load, as a table of fixed chunks took
		lv := t.first.Load()
		if lv == nil {
			return nil
		}
		r = &lv[id]
	} else {
		k, off := place(id)
		if k >= maxLevels {
			return nil
		}
		lv := t.levels[k].Load()
		if lv == nil {
			return nil
		}
		r = &(*lv)[off]
	}
	if r.done == nil {
		return nil
	}
	return r
}

// at returns record id, made or not, or nil if its level is not; under mu.
func (t *Table[In, Out]) at(id uint32) *Record[In, Out] {
	if id < firstLevel {
		if lv := t.first.Load(); lv != nil {
			return &lv[id]
		}
		return nil
	}
	k, off := place(id)
	if lv := t.levels[k].Load(); lv != nil {
		return &(*lv)[off]
	}
	return nil
}

// Alloc takes a free record.
func (t *Table[In, Out]) Alloc() (*Record[In, Out], error) {
	for {
		v := t.cache.Get()
		if v == nil {
			break
		}
		// The cache may hold a record twice (a scan took it while it was cached, and it
		// was freed again since): the claim decides which taker has it.
		if r := v.(*Record[In, Out]); r.refs.claim() {
			return r, nil
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.allocLocked()
}

// allocLocked finds a free record the cache dropped, or makes one. Called with mu held.
func (t *Table[In, Out]) allocLocked() (*Record[In, Out], error) {
	if r := t.scanLocked(scanBudget); r != nil {
		return r, nil
	}
	if t.n >= maxRecords {
		// Every record exists: a free one, if any, is somewhere the budget did not reach.
		if r := t.scanLocked(t.n); r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("knit: more than %d calls in flight on one task", maxRecords)
	}
	r := t.at(t.n)
	if r == nil {
		t.grow(t.n)
		r = t.at(t.n)
	}
	r.ID, r.table = t.n, t
	r.link.call = r
	r.Lane.Store(-1)
	r.Abort.Store(-1)
	r.refs.claimNew()
	r.done = make(chan struct{}, 1) // last: Get sees the record from here on
	t.n++
	return r, nil
}

// grow makes the level that holds record id; under mu.
func (t *Table[In, Out]) grow(id uint32) {
	k, _ := place(id)
	if k == 0 {
		t.first.Store(new([firstLevel]Record[In, Out]))
		return
	}
	recs := make([]Record[In, Out], firstLevel<<k)
	t.levels[k].Store(&recs)
}

// scanLocked looks at up to budget records, from where the last scan stopped, for free ones
// the cache dropped: it claims the first and gives the others back to the cache. Called with
// mu held.
func (t *Table[In, Out]) scanLocked(budget uint32) *Record[In, Out] {
	var got *Record[In, Out]
	for range min(budget, t.n) {
		if t.scan >= t.n {
			t.scan = 0
		}
		r := t.at(t.scan)
		if r == nil { // only where a test pretends the table is larger than it is
			k, _ := place(t.scan)
			t.scan = firstLevel * (1<<(k+1) - 1)
			continue
		}
		t.scan++
		switch {
		case r.done == nil || !r.refs.free(): // (a record not made yet: as above)
		case got == nil:
			if r.refs.claim() {
				got = r
			}
		default:
			t.cache.Put(r)
		}
	}
	return got
}

// Release drops one reference; the last one resets the record and frees it. A holder that
// sees one reference is the last (only a holder adds one): it skips the decrement, an
// atomic operation less on every call.
func (t *Table[In, Out]) Release(r *Record[In, Out]) {
	if r.refs.Load() != 1 && r.refs.Add(-1) != 0 {
		return
	}
	r.reset()
	r.refs.setFree() // only now may a scan claim it
	t.cache.Put(r)
}

// reset clears what a call left on its record and makes its slots stale (Gen).
func (r *Record[In, Out]) reset() {
	var zeroIn In
	var zeroOut Out
	r.In, r.LaneOut, r.LaneErr, r.Out, r.Err, r.ctx, r.fut, r.obs, r.fails, r.batch = zeroIn, zeroOut, nil, zeroOut, nil, nil, nil, nil, nil, nil
	r.Hard = time.Time{}
	if cap(r.Enc) > maxKeptEncoding {
		r.Enc = nil
	}
	r.Gen.Add(1)
}

// Reuse readies a settled record that its caller alone holds for the caller's next call,
// as Release then Alloc would, without the trip through the free records (Task.Map reuses
// its chunks' records). False, with nothing done, when the dispatch side has not let go
// yet (a drainer settles a process lane's call before it drops its reference): the caller
// then releases the record.
func (t *Table[In, Out]) Reuse(r *Record[In, Out]) bool {
	if r.refs.Load() != 1 || r.Pending() {
		return false
	}
	r.reset()
	r.refs.claimNew() // one reference, taken: as Alloc leaves it
	return true
}

// AllocN takes len(dst) free records into dst, or as many as there are up to the limit of
// records in flight: from the free records first, then, for the rest, under one hold of the
// table's lock (a batch of calls takes its records together, not one lock at a time). It
// returns how many it took, and an error when that is fewer than asked.
func (t *Table[In, Out]) AllocN(dst []*Record[In, Out]) (int, error) {
	n := 0
	for n < len(dst) {
		v := t.cache.Get()
		if v == nil {
			break
		}
		if r := v.(*Record[In, Out]); r.refs.claim() {
			dst[n] = r
			n++
		}
	}
	if n == len(dst) {
		return n, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for ; n < len(dst); n++ {
		r, err := t.allocLocked()
		if err != nil {
			return n, err
		}
		dst[n] = r
	}
	return n, nil
}

// maxKeptEncoding bounds the encoding buffer a free record keeps for its next call.
const maxKeptEncoding = 64 << 10

// Held calls f for every record of owner that lane still holds (queue closure when a lane
// dies). The caller must make sure the lane's results are no longer being drained.
func (t *Table[In, Out]) Held(owner uint64, lane int32, f func(r *Record[In, Out])) {
	t.mu.Lock()
	n := t.n
	t.mu.Unlock()
	for id := range n {
		if r := t.Get(id); r != nil && r.Lane.Load() == lane && r.owner.Load() == owner {
			f(r)
		}
	}
}

// SettleResult implements Def.
func (t *Task[In, Out]) SettleResult(owner uint64, lane int32, id, gen uint32, o Outcome, payload []byte, local bool, ran uint64, w Wrapper) error {
	r := t.Records.Get(id)
	if r == nil || r.Gen.Load() != gen || r.owner.Load() != owner || r.Lane.Load() != lane {
		return fmt.Errorf("result for call %d/%d of task %q, which this lane does not hold", id, gen, t.name)
	}
	// A call that failed after its context ended is settled by the caller's context
	// (timeout rules, TimeoutDefault), which is certain to fire.
	if r.Pending() && (o == OK || r.ctx.Err() == nil) {
		var err error
		switch {
		case o == OK && !local:
			if r.LaneOut, err = t.OutCdc.Decode(payload); err != nil {
				err = w.Wrap(t, BadOutput, err)
			}
		case o == OK:
		case local:
			err = w.Wrap(t, o, r.LaneErr)
		default:
			we, derr := DecodeWireError(payload)
			if derr != nil {
				err = w.Wrap(t, BadOutput, derr)
			} else {
				err = w.Wrap(t, o, we)
			}
		}
		if lane >= 0 {
			r.answered = lane + 1
		}
		r.settleRan(err, ran)
	}
	r.Lane.Store(-1)
	t.Records.Release(r)
	return nil
}

// Drop implements Def.
func (t *Task[In, Out]) Drop(lane int32, id, gen uint32) bool {
	r := t.Records.Get(id)
	if r == nil || r.Gen.Load() != gen || r.Lane.Load() != lane {
		return false
	}
	r.Lane.Store(-1)
	t.Records.Release(r)
	return true
}

// LaneEnd is a lane that ended, as FailLane needs it.
type LaneEnd struct {
	Owner uint64
	Lane  int32
	// Started is the sequence number of the last call the lane started (its running word);
	// a call published with a higher one, or still in the backlog, provably never ran.
	Started uint64
	// Chunk is the lane's chunk word (fastpath.Region.Chunk) when it ended: how many of the
	// elements of the Map chunk it was running had started.
	Chunk uint64
	// Exact says Started names the one call the lane may have been running when it died:
	// a call before it that the lane still holds had finished, its result lost with the lane
	// (a node's lane dies running a chunk of packed calls), so it is in doubt but did not
	// kill the lane, and counts no death towards poison. Not set when what had started is
	// inferred (a lost node: any call sent may have been running).
	Exact bool
	// Release is false for a lane that may still be running (abandoned): its calls all fail
	// and their records are never reused.
	Release bool
	// Err is the error of a call that cannot run again: started says whether it had started
	// on the lane, poison that it had started on a lane that died before, too.
	Err func(started, poison bool) error
	// Requeue dispatches a call again, on another lane; false when it cannot (the pool is
	// closing).
	Requeue func(Retry) bool
	// Shared, if set, picks among the calls on a shared submit ring (Lane is the ring's
	// key) those the lane held: held says whether it held the call published with sequence
	// number seq (abort is the call's abort bit), started whether it had started it
	// (Started is not used).
	Shared func(seq uint64, abort int32) (held, started bool)
	// SharedChunk, with Shared, reports how many elements of the Map chunk published on the
	// shared ring with sequence number seq the lane had started; false where that is not
	// known (then every element counts as started).
	SharedChunk func(seq uint64) (int, bool)
	// Keep fails the calls but leaves their records held as they are, never reused: a
	// result that may still come for one of them settles nothing.
	Keep bool
	// Local: the lane was a LocalLane, and Running the call it was running when it ended
	// (nil: none); that call alone had started (Started is not used).
	Local   bool
	Running LocalCall
}

// chunkStarted reports how many elements of the Map chunk published with sequence number
// seq the lane had started.
func (e *LaneEnd) chunkStarted(seq uint64) (int, bool) {
	if e.Shared == nil {
		return fastpath.ChunkStarted(e.Chunk, seq)
	}
	if e.SharedChunk == nil {
		return 0, false
	}
	return e.SharedChunk(seq)
}

// Retry is a call handed back for another lane. Its record keeps the dispatch reference;
// Fail settles the call and lets go of it.
type Retry struct {
	Def         Def
	ID, Gen     uint32
	Lane, Abort *atomic.Int32
	Seq         *atomic.Uint64
	Payload     []byte    // the encoded input (process lanes)
	Local       LocalCall // the record, for a LocalLane
	Ctx         context.Context
	Fail        func(error)
}

// FailLane implements Def. A call that had started when its lane died runs again only if
// its task is Idempotent, and only once: a call that was running on two lanes that died is
// poison, and fails with the poison error instead of killing every lane in turn.
func (t *Task[In, Out]) FailLane(e LaneEnd) int {
	n := 0
	t.Records.Held(e.Owner, e.Lane, func(r *Record[In, Out]) {
		seq := r.Seq.Load()
		started := seq != 0 && seq <= e.Started
		if e.Local {
			started = e.Running == LocalCall(r)
			// A submitter that met the ended lane's closed queue takes its call back with
			// the same CAS (the pool's lane.submitLocal), and so does a thief that moves
			// it: one of them has it.
			if e.Release && !r.Lane.CompareAndSwap(e.Lane, -1) {
				return
			}
		}
		if e.Shared != nil {
			held, s := e.Shared(seq, r.Abort.Load())
			if !held {
				return
			}
			started = s
		}
		// An abandoned lane may still run: its calls are fenced, never reused, unless it
		// has taken one back to settle it itself (a LocalLane's settleLocal) before the
		// fence.
		if !e.Release && !e.Keep && !r.Lane.CompareAndSwap(e.Lane, fenced) {
			return
		}
		n++
		if t.chunk != nil && started && !e.Local {
			if k, ok := e.chunkStarted(seq); ok {
				r.began = uint16(min(k, MaxChunk)) + 1
			}
		}
		if e.Keep {
			r.Fail(e.Err(started, false))
			return
		}
		suspect := started && !(e.Exact && e.Shared == nil && seq < e.Started) // it may have killed the lane
		poison := suspect && r.deaths > 0
		again := e.Release && e.Requeue != nil && r.Pending() && r.ctx.Err() == nil &&
			(!started || t.opts.Idempotent && !poison)
		if again {
			if suspect {
				r.deaths++
			}
			r.Lane.Store(-1)
			r.Abort.Store(-1)
			r.Seq.Store(0)
			if e.Requeue(Retry{Def: t, ID: r.ID, Gen: r.Gen.Load(), Lane: &r.Lane, Abort: &r.Abort, Seq: &r.Seq,
				Payload: r.Enc, Local: r, Ctx: r.ctx, Fail: func(err error) { r.Fail(err); t.Records.Release(r) }}) {
				return
			}
		}
		r.Fail(e.Err(started, poison))
		if e.Release {
			r.Lane.Store(-1)
			t.Records.Release(r)
		}
	})
	return n
}

// Withdraw implements Def.
func (t *Task[In, Out]) Withdraw(e LaneEnd) int {
	n := 0
	t.Records.Held(e.Owner, e.Lane, func(r *Record[In, Out]) {
		if seq := r.Seq.Load(); seq != 0 && seq <= e.Started {
			return // it has started: it stays
		}
		n++
		r.Lane.Store(-1)
		r.Abort.Store(-1)
		r.Seq.Store(0)
		if !r.Pending() || r.ctx.Err() != nil {
			t.Records.Release(r) // its caller settles it, as whenever its context ends (Drop)
			return
		}
		if e.Requeue(Retry{Def: t, ID: r.ID, Gen: r.Gen.Load(), Lane: &r.Lane, Abort: &r.Abort, Seq: &r.Seq,
			Payload: r.Enc, Local: r, Ctx: r.ctx, Fail: func(err error) { r.Fail(err); t.Records.Release(r) }}) {
			return
		}
		r.Fail(e.Err(false, false))
		t.Records.Release(r)
	})
	return n
}

// fenced marks a record held by an abandoned lane: it is never reused.
const fenced = -2
