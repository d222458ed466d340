package knit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/lifecycle"
)

// Code classifies an Error. Codes are stable strings, the same on every lane and in logs,
// metrics and events. docs/architecture.md, "Error codes", says when each is returned and
// what a service should answer for it (retry, a 4xx, a 5xx).
type Code string

// Codes.
const (
	// CodePoolClosed: the pool was closed before the call could run.
	CodePoolClosed Code = "POOL_CLOSED"
	// CodeTimeout: the call had no result by its deadline (the caller's context, or the
	// task's Timeout).
	CodeTimeout Code = "TIMEOUT"
	// CodeTaskPanic: the task panicked; the Cause is a *PanicError.
	CodeTaskPanic Code = "TASK_PANIC"
	// CodeTaskError: the task returned an error; it is the Cause (from a process lane, its
	// text).
	CodeTaskError Code = "TASK_ERROR"
	// CodePayloadTooLarge: an input or a result is over Payload.MaxCall.
	CodePayloadTooLarge Code = "PAYLOAD_TOO_LARGE"
	// CodeOverloaded: the backlog was full (Config.Backlog, without BlockWhenFull).
	CodeOverloaded Code = "OVERLOADED"
	// CodeUnsupportedType: a value cannot cross to a process lane (no codec, or it did not
	// encode or decode).
	CodeUnsupportedType Code = "UNSUPPORTED_TYPE"
	// CodePoolUnavailable: no lane can take the call (the pool has failed, or every lane is
	// in crash-loop backoff with Config.FailFast), or the pool could not start.
	CodePoolUnavailable Code = "POOL_UNAVAILABLE"
	// CodeInvalidArgument: the caller's mistake: a Config field out of its bounds, a nil
	// pool, context or task, a size Resize cannot take. Retrying cannot help.
	CodeInvalidArgument Code = "INVALID_ARGUMENT"
	// CodeUnknownTask: the pool does not serve the task (it was not given to NewPool, or was
	// defined after it).
	CodeUnknownTask Code = "UNKNOWN_TASK"
	// CodeCanceled: the caller's context was cancelled.
	CodeCanceled Code = "CANCELED"
	// CodeThreadClosed: the lane holding the call was stopped by the host (Close).
	CodeThreadClosed Code = "THREAD_CLOSED"
	// CodeWorkerCrashed: the lane crashed while it held the call (a panic that crashes the
	// lane, a signal, a hard timeout, a broken protocol).
	CodeWorkerCrashed Code = "WORKER_CRASHED"
	// CodeWorkerExited: the lane exited on its own while it held the call.
	CodeWorkerExited Code = "WORKER_EXITED"
	// CodeStartupFailed: a lane could not start.
	CodeStartupFailed Code = "WORKER_STARTUP_FAILED"
	// CodeUnresponsive: the host killed a lane process whose heartbeat stood still for
	// Config.Liveness (frozen by SIGSTOP, a stuck runtime, …).
	CodeUnresponsive Code = "WORKER_UNRESPONSIVE"
	// CodePoisonCall: the call was running on two lanes that both died under it; it is not
	// run a third time.
	CodePoisonCall Code = "POISON_CALL"
	// CodeOutOfMemory: a lane process ran out of memory under its limit
	// (ProcessConfig.Limits.Memory, or any limit put on it).
	CodeOutOfMemory Code = "WORKER_OUT_OF_MEMORY"
	// CodeCPULimit: a lane process used up its CPU time (ProcessConfig.Limits.CPUTime).
	CodeCPULimit Code = "WORKER_CPU_LIMIT"
	// CodeNodeLost: a remote lane's node was lost (killed, unreachable, partitioned or
	// frozen for Config.Liveness, or it dropped the host's lanes) while the lane held the
	// call. A call that was sent to the node is in doubt — it may have run, or still run
	// there until the node fences it — so it runs again only if its task is Idempotent
	// (docs/remote.md).
	CodeNodeLost Code = "NODE_LOST"
)

// Error is every failure knit reports: a Code, the lane and task involved, a message and
// the Cause underneath. Error() is one line — the code, the task, the lane and a reason —
// that may be shown to a client: a lane's stack and standard error stay in the Stack and
// Stderr fields (and a panic's stack in its *PanicError), for logs, where knit itself logs
// them at Debug. errors.Is matches Errors by code, so the sentinels below work as targets:
//
//	if errors.Is(err, knit.ErrTimeout) { … }
//	var ke *knit.Error
//	if errors.As(err, &ke) && ke.Started { … }
type Error struct {
	Code    Code   // what happened: compare with the Code constants, or use errors.Is with a sentinel
	Lane    int    // lane index, -1 when no lane is involved
	Task    string // task name, "" when no task is involved
	Message string
	Cause   error
	// Started is set on the error of a call that failed because its lane ended (a lifecycle
	// code): true when the call had started on the lane. A call that had not started is run
	// on another lane instead; it fails only when it cannot be (the pool is closing, or its
	// context ended).
	Started bool
	// Stack and Stderr are a process lane's own account of its crash, when it left one:
	// the Go runtime's failure line and the crashing goroutine's stack (at most 12 frames),
	// and the last lines of its standard error (at most 16). Never in Error().
	Stack, Stderr []string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("knit: ")
	b.WriteString(string(e.Code))
	if e.Task != "" {
		fmt.Fprintf(&b, " task %q", e.Task)
	}
	if e.Lane >= 0 {
		fmt.Fprintf(&b, " lane %d", e.Lane)
	}
	msg := firstLine(e.Message)
	if msg != "" {
		b.WriteString(": ")
		b.WriteString(msg)
	}
	if e.Cause != nil {
		if c := firstLine(e.Cause.Error()); c != "" && !strings.Contains(msg, c) {
			b.WriteString(": ")
			b.WriteString(c)
		}
	}
	return b.String()
}

// firstLine is s up to its first line break, and at most maxReason bytes: what Error()
// shows of a message or a cause.
func firstLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > maxReason {
		s = s[:maxReason] + "…"
	}
	return s
}

// maxReason bounds each part of Error(): a task's error text is the application's, and
// may be long.
const maxReason = 512

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Is matches any error with the same code: an *Error, or an error of knit's layers below
// that carries one.
func (e *Error) Is(target error) bool {
	var t coded
	return errors.As(target, &t) && t.KnitCode() == string(e.Code)
}

// KnitCode and KnitMessage let an Error a task returns cross to the host with its code.
func (e *Error) KnitCode() string { return string(e.Code) }

// KnitMessage is the message that crosses with KnitCode.
func (e *Error) KnitMessage() string {
	if e.Cause != nil {
		return e.Message + ": " + e.Cause.Error()
	}
	return e.Message
}

// coded is an error that carries a knit code (an *Error, a *lifecycle.Error).
type coded interface{ KnitCode() string }

// Sentinels for errors.Is.
var (
	ErrPoolClosed          = sentinel(CodePoolClosed)
	ErrTimeout             = sentinel(CodeTimeout)
	ErrTaskPanic           = sentinel(CodeTaskPanic)
	ErrTaskError           = sentinel(CodeTaskError)
	ErrPayloadTooLarge     = sentinel(CodePayloadTooLarge)
	ErrOverloaded          = sentinel(CodeOverloaded)
	ErrUnsupportedType     = sentinel(CodeUnsupportedType)
	ErrPoolUnavailable     = sentinel(CodePoolUnavailable)
	ErrInvalidArgument     = sentinel(CodeInvalidArgument)
	ErrUnknownTask         = sentinel(CodeUnknownTask)
	ErrCanceled            = sentinel(CodeCanceled)
	ErrThreadClosed        = sentinel(CodeThreadClosed)
	ErrWorkerCrashed       = sentinel(CodeWorkerCrashed)
	ErrWorkerExited        = sentinel(CodeWorkerExited)
	ErrWorkerStartupFailed = sentinel(CodeStartupFailed)
	ErrWorkerUnresponsive  = sentinel(CodeUnresponsive)
	ErrPoisonCall          = sentinel(CodePoisonCall)
	ErrWorkerOutOfMemory   = sentinel(CodeOutOfMemory)
	ErrWorkerCPULimit      = sentinel(CodeCPULimit)
	ErrNodeLost            = sentinel(CodeNodeLost)
)

func sentinel(c Code) *Error { return &Error{Code: c, Lane: -1} }

// Why a process-lane task's context ended, as context.Cause in the task reports it.
var (
	// ErrCallerDeadline: the caller's deadline (its context's, or the task's Timeout) passed.
	ErrCallerDeadline = &Error{Code: CodeTimeout, Lane: -1, Message: "the caller's deadline passed",
		Cause: context.DeadlineExceeded}
	// ErrCallerCanceled: the caller gave up on the call (its context was cancelled).
	ErrCallerCanceled = &Error{Code: CodeCanceled, Lane: -1, Message: "the caller cancelled the call",
		Cause: context.Canceled}
)

// PanicError is the Cause of a TASK_PANIC error: the panic value (its text, from a process
// lane) and, in Stack, the panicking goroutine's stack. Error() never includes the stack, so
// an error may be shown to a client; reach the stack with errors.As for logs.
type PanicError struct {
	// Value is what the task passed to panic; from a process lane, its text (fmt's %v).
	Value any
	// Stack is the panicking goroutine's stack (debug.Stack), from whichever process it ran in.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// errorOf is err as knit reports it to its caller: a *lifecycle.Error of the layers below
// becomes an *Error. It allocates only for those.
func errorOf(err error) error {
	if le, ok := err.(*lifecycle.Error); ok {
		return fromLifecycle(le)
	}
	return err
}

// fromLifecycle is the *Error for a *lifecycle.Error, its cause converted too where it is
// one of knit's.
func fromLifecycle(le *lifecycle.Error) *Error {
	if le == nil {
		return nil
	}
	e := &Error{Code: Code(le.Code), Lane: le.Lane, Task: le.Task, Message: le.Message, Cause: le.Cause, Started: le.Started}
	switch c := le.Cause.(type) {
	case *lifecycle.Error:
		e.Cause = fromLifecycle(c)
	case *actors.PanicError:
		e.Cause = panicOf(c)
	case *lifecycle.LaneReport:
		e.Stack, e.Stderr, e.Cause = c.Stack, c.Tail, c.Err
		if c.Failure != "" {
			e.Stack = append([]string{c.Failure}, c.Stack...)
		}
	}
	return e
}

// panicOf is the *PanicError for the lanes' panic record.
func panicOf(p *actors.PanicError) *PanicError { return &PanicError{Value: p.Value, Stack: p.Stack} }
