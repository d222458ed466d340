// Package knit runs typed task actors on supervised worker lanes. A lane is a goroutine in
// the host process or a separate OS process; calls and results move between host and lane
// through a shared-memory fast path (slot rings and doorbells), never through actor
// mailboxes.
//
// Define tasks once, at package level, so that the host and every process lane build the
// same registry during init:
//
//	var Add = knit.Define("add", func(ctx context.Context, in [2]int64) (int64, error) {
//		return in[0] + in[1], nil
//	})
//
//	func main() {
//		knit.Main()
//		pool, err := knit.NewPool(knit.Config{Lanes: 4}, Add)
//		...
//		sum, err := Add.Call(ctx, pool, [2]int64{1, 2})
//	}
//
// Every failure is a *Error with a Code; errors.Is(err, knit.ErrTimeout) and friends work.
package knit

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/internal/pool"
	"github.com/knitgo/knit/lifecycle"
)

// Error is every failure knit reports: a Code, the lane and task involved, a message and
// the Cause underneath. errors.Is matches Errors by code, so the sentinels below work as
// targets.
type Error = lifecycle.Error

// Code classifies an Error.
type Code = lifecycle.Code

// Codes.
const (
	CodePoolClosed      = lifecycle.CodePoolClosed
	CodeTimeout         = lifecycle.CodeTimeout
	CodeTaskPanic       = lifecycle.CodeTaskPanic
	CodeTaskError       = lifecycle.CodeTaskError
	CodePayloadTooLarge = lifecycle.CodePayloadTooLarge
	CodeOverloaded      = lifecycle.CodeOverloaded
	CodeUnsupportedType = lifecycle.CodeUnsupportedType
	CodePoolUnavailable = lifecycle.CodePoolUnavailable
	CodeCanceled        = lifecycle.CodeCanceled
	CodeThreadClosed    = lifecycle.CodeThreadClosed
	CodeWorkerCrashed   = lifecycle.CodeWorkerCrashed
	CodeWorkerExited    = lifecycle.CodeWorkerExited
	CodeStartupFailed   = lifecycle.CodeStartupFailed
	CodeUnresponsive    = lifecycle.CodeWorkerUnresponsive
	CodePoisonCall      = lifecycle.CodePoisonCall
	CodeOutOfMemory     = lifecycle.CodeWorkerOutOfMemory // a lane ran out of memory (ProcessConfig.Limits)
	CodeCPULimit        = lifecycle.CodeWorkerCPULimit    // a lane used up its CPU time (ProcessConfig.Limits)
)

// Sentinels for errors.Is.
var (
	ErrPoolClosed          = lifecycle.ErrPoolClosed
	ErrTimeout             = lifecycle.ErrTimeout
	ErrTaskPanic           = lifecycle.ErrTaskPanic
	ErrTaskError           = lifecycle.ErrTaskError
	ErrPayloadTooLarge     = lifecycle.ErrPayloadTooLarge
	ErrOverloaded          = lifecycle.ErrOverloaded
	ErrUnsupportedType     = lifecycle.ErrUnsupportedType
	ErrPoolUnavailable     = lifecycle.ErrPoolUnavailable
	ErrThreadClosed        = lifecycle.ErrThreadClosed
	ErrWorkerCrashed       = lifecycle.ErrWorkerCrashed
	ErrWorkerExited        = lifecycle.ErrWorkerExited
	ErrWorkerStartupFailed = lifecycle.ErrStartupFailed
	ErrWorkerUnresponsive  = lifecycle.ErrUnresponsive
	ErrPoisonCall          = lifecycle.ErrPoisonCall
	ErrWorkerOutOfMemory   = lifecycle.ErrOutOfMemory
	ErrWorkerCPULimit      = lifecycle.ErrCPULimit
)

// Why a process-lane task's context ended, as context.Cause in the task reports it.
var (
	ErrCallerDeadline = lifecycle.ErrCallerDeadline // the caller's deadline passed (TIMEOUT)
	ErrCallerCanceled = lifecycle.ErrCallerCanceled // the caller gave up on the call (CANCELED)
)

// PanicError is the Cause of a TASK_PANIC error: the panic value (its text, from a process
// lane) and, in Stack, the panicking goroutine's stack. Error() never includes the stack, so
// an error may be shown to a client; reach the stack with errors.As for logs.
type PanicError = actors.PanicError

// Codec encodes and decodes one type for process lanes. Decode gets hostile bytes.
type Codec[T any] = actors.Codec[T]

// TaskOption configures a task at Define. The options are this package's functions.
type TaskOption interface{ applyTask(*actors.Options) }

type taskOption func(*actors.Options)

func (o taskOption) applyTask(x *actors.Options) { o(x) }

// Timeout settles a call with ErrTimeout when it has not finished after d (time in the
// backlog counts). The task's context is cancelled at the same moment. Zero means none; a
// negative d makes Define panic.
func Timeout(d time.Duration) TaskOption {
	return taskOption(func(o *actors.Options) { o.Timeout = d })
}

// TimeoutDefault resolves a call with v, and no error, when it has not finished after d.
// v must be assignable to the task's Out type (checked at Define).
func TimeoutDefault(d time.Duration, v any) TaskOption {
	return taskOption(func(o *actors.Options) { o.Timeout, o.Default, o.HasDefault = d, v, true })
}

// HardTimeout bounds a call like Timeout does, and more: on a process lane, a call that
// overruns it gets the lane killed (WORKER_CRASHED, reason hard timeout; its other calls
// settle with that code, or run again elsewhere if Idempotent) and the supervisor restarts
// it. Goroutines cannot be killed, so on goroutine lanes it acts as a Timeout. Zero means
// none; a negative d makes Define panic.
func HardTimeout(d time.Duration) TaskOption {
	return taskOption(func(o *actors.Options) { o.HardTimeout = d })
}

// Idempotent marks a task whose calls may run again on another lane when the lane that
// held them dies.
func Idempotent() TaskOption {
	return taskOption(func(o *actors.Options) { o.Idempotent = true })
}

// WithCodec replaces the codec knit chose for the task's input (a Codec[In]) or output (a
// Codec[Out]).
func WithCodec(c any) TaskOption {
	return taskOption(func(o *actors.Options) { o.Codec = c })
}

// Define registers a task under a unique name. Call it at package level: host and process
// lanes must define the same tasks. It panics on a duplicate name, on an In or Out type no
// codec can carry, and on options that do not fit the task's types or are negative
// durations. What each type's values may be on process lanes, and what NewPool refuses for
// them, is in docs/process-lanes.md, "Codec rules".
func Define[In, Out any](name string, fn func(context.Context, In) (Out, error), opts ...TaskOption) *Task[In, Out] {
	var o actors.Options
	for _, opt := range opts {
		if opt == nil {
			panic(fmt.Sprintf("knit: task %q: a nil TaskOption", name))
		}
		opt.applyTask(&o)
	}
	if err := checkOptions(&o); err != nil {
		panic(fmt.Sprintf("knit: task %q: %v", name, err))
	}
	return pool.NewTask(actors.Define(name, fn, o))
}

// Main must be the first statement of main (and of TestMain in tests that use process
// lanes). In a process started as a lane it serves tasks and exits; in the host it returns
// at once.
func Main(opts ...MainOption) {
	if lifecycle.IsLane() {
		var h lifecycle.Hooks
		for _, o := range opts {
			o.applyMain(&h)
		}
		os.Exit(lifecycle.Serve(h))
	}
}

// A MainOption configures what Main gives the lanes of this binary.
type MainOption interface{ applyMain(*lifecycle.Hooks) }

type mainOption func(*lifecycle.Hooks)

func (o mainOption) applyMain(h *lifecycle.Hooks) { o(h) }

// WithPropagator makes lanes put the context values their callers' pools carry
// (Config.Propagator) into each task's context, e.g. propagation.TraceContext{}.
func WithPropagator(p propagation.TextMapPropagator) MainOption {
	return mainOption(func(h *lifecycle.Hooks) { h.Propagator = p })
}

// checkOptions refuses task options that cannot mean anything: a negative Timeout or
// HardTimeout (zero means none).
func checkOptions(o *actors.Options) error {
	switch {
	case o.Timeout < 0:
		return fmt.Errorf("Timeout %v is negative (0 means none)", o.Timeout)
	case o.HardTimeout < 0:
		return fmt.Errorf("HardTimeout %v is negative (0 means none)", o.HardTimeout)
	}
	return nil
}
