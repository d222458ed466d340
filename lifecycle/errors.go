package lifecycle

import (
	"errors"
	"fmt"
	"strings"
)

// Code classifies a knit failure. The lifecycle codes match the reference implementation's
// strings exactly.
type Code string

// Codes.
const (
	CodePoolClosed      Code = "POOL_CLOSED"
	CodeTimeout         Code = "TIMEOUT"
	CodeTaskPanic       Code = "TASK_PANIC"
	CodeTaskError       Code = "TASK_ERROR"
	CodePayloadTooLarge Code = "PAYLOAD_TOO_LARGE"
	CodeOverloaded      Code = "OVERLOADED"
	CodeUnsupportedType Code = "UNSUPPORTED_TYPE"
	CodePoolUnavailable Code = "POOL_UNAVAILABLE"
	CodeCanceled        Code = "CANCELED"
	CodeThreadClosed    Code = "THREAD_CLOSED"
	CodeWorkerCrashed   Code = "WORKER_CRASHED"
	CodeWorkerExited    Code = "WORKER_EXITED"
	CodeStartupFailed   Code = "WORKER_STARTUP_FAILED"
	// CodeWorkerUnresponsive: the host killed a lane process whose heartbeat stood still
	// (frozen by SIGSTOP, a stuck runtime, …) for the liveness timeout.
	CodeWorkerUnresponsive Code = "WORKER_UNRESPONSIVE"
	// CodePoisonCall: a call that was running on two lanes that both died under it; it is
	// not run a third time.
	CodePoisonCall Code = "POISON_CALL"
	// CodeWorkerOutOfMemory: a lane process ran out of memory under its limit: the kernel's
	// OOM killer killed it in its cgroup, or the Go runtime died with "out of memory" /
	// "cannot allocate memory" (ProcessConfig.Limits.Memory, or any limit put on it).
	CodeWorkerOutOfMemory Code = "WORKER_OUT_OF_MEMORY"
	// CodeWorkerCPULimit: a lane process used up its CPU-time limit
	// (ProcessConfig.Limits.CPUTime) and the kernel ended it.
	CodeWorkerCPULimit Code = "WORKER_CPU_LIMIT"
	// CodeNodeLost: a remote lane's node was lost — killed, unreachable, partitioned or
	// frozen past the liveness timeout, or it dropped the host's lanes — with the lane's
	// calls on it in doubt.
	CodeNodeLost Code = "NODE_LOST"
)

// Error is a failure as the layers below the root report it: lane ends, startup failures,
// the supervisor's. The root converts it to a knit.Error (the same fields, documented there)
// before a caller sees it; it matches any error with the same KnitCode under errors.Is.
type Error struct {
	Code    Code
	Lane    int    // lane index, -1 when no lane is involved
	Task    string // task name, "" when no task is involved
	Message string
	Cause   error
	Started bool
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
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Cause != nil && (e.Message == "" || !strings.Contains(e.Message, e.Cause.Error())) {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// KnitCode and KnitMessage let an Error a task returns cross a process boundary with its
// code.
func (e *Error) KnitCode() string { return string(e.Code) }

// KnitMessage is the message that crosses with KnitCode.
func (e *Error) KnitMessage() string {
	if e.Cause != nil {
		return e.Message + ": " + e.Cause.Error()
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Is matches any error with the same code: an *Error, or a knit.Error (anything with a
// KnitCode).
func (e *Error) Is(target error) bool {
	var t interface{ KnitCode() string }
	return errors.As(target, &t) && t.KnitCode() == string(e.Code)
}

// Sentinels for errors.Is.
var (
	ErrPoolClosed      = sentinel(CodePoolClosed)
	ErrTimeout         = sentinel(CodeTimeout)
	ErrTaskPanic       = sentinel(CodeTaskPanic)
	ErrTaskError       = sentinel(CodeTaskError)
	ErrPayloadTooLarge = sentinel(CodePayloadTooLarge)
	ErrOverloaded      = sentinel(CodeOverloaded)
	ErrUnsupportedType = sentinel(CodeUnsupportedType)
	ErrPoolUnavailable = sentinel(CodePoolUnavailable)
	ErrThreadClosed    = sentinel(CodeThreadClosed)
	ErrWorkerCrashed   = sentinel(CodeWorkerCrashed)
	ErrWorkerExited    = sentinel(CodeWorkerExited)
	ErrStartupFailed   = sentinel(CodeStartupFailed)
	ErrUnresponsive    = sentinel(CodeWorkerUnresponsive)
	ErrPoisonCall      = sentinel(CodePoisonCall)
	ErrOutOfMemory     = sentinel(CodeWorkerOutOfMemory)
	ErrCPULimit        = sentinel(CodeWorkerCPULimit)
	ErrNodeLost        = sentinel(CodeNodeLost)
)

func sentinel(c Code) *Error { return &Error{Code: c, Lane: -1} }
