package knit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/knitgo/knit/actors"
)

// Task is a typed task definition made by Define. Run it with its Call, Go and Map
// methods on a Pool that serves it.
type Task[In, Out any] struct {
	def  *actors.Task[In, Out]
	twin func() twinCaller[In] // the twin that carries Map's chunks to lanes in other processes
}

// Name returns the task's name.
func (t *Task[In, Out]) Name() string { return t.def.Name() }

// Fingerprint identifies the task's name and In/Out types; host and process lanes compare
// fingerprints at boot.
func (t *Task[In, Out]) Fingerprint() uint64 { return t.def.Fingerprint() }

func (t *Task[In, Out]) actorsDef() actors.Def {
	if t == nil || t.def == nil { // a nil *Task, or a Task not made by Define
		return nil
	}
	return t.def
}

// Definition is a task that NewPool accepts: a *Task of any type.
type Definition interface{ actorsDef() actors.Def }

// Codec encodes and decodes one type for process lanes (WithCodec). Decode gets hostile
// bytes: it must return an error, never panic, on input it did not make.
type Codec[T any] interface {
	Name() string                           // e.g. "json", shown in logs
	Append(dst []byte, v T) ([]byte, error) // appends the encoding of v to dst
	Decode(b []byte) (T, error)
}

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
	d := actors.Define(name, fn, o)
	// The twin is made on first use, once: a Map would otherwise take the registry's lock.
	return &Task[In, Out]{def: d, twin: sync.OnceValue(func() twinCaller[In] {
		return &Task[[]In, []byte]{def: d.Twin().(*actors.Task[[]In, []byte])}
	})}
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
