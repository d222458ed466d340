package lifecycle

import (
	"fmt"
	"strings"
	"syscall"
	"time"
)

// Exit is what the host knows when a lane has ended.
type Exit struct {
	Lane         int
	Stopping     bool           // the host had asked the lane to stop
	Ready        bool           // the lane had reported ready
	Status       int            // exit status; -1 when killed by a signal
	Signal       syscall.Signal // the signal that killed it, or 0
	Fatal        string         // the reason the lane left in its region, if any
	Tail         []string       // the last lines of its stderr
	Failure      string         // the line where the Go runtime announced a panic or fatal error
	Startup      time.Duration  // with StartupTimeout: the host gave up waiting for ready
	HardTimeout  string         // the host killed it: a call overran its hard timeout
	Unresponsive string         // the host killed it: its heartbeat stood still
	Corrupt      error          // the host killed it: it broke the ring protocol
	Err          error          // waiting for it failed
}

// tailLines is how many stderr lines go into an error message.
const tailLines = 16

// Classify turns an ended lane into its coded error. The first matching rule wins:
// THREAD_CLOSED after a stop request whatever the status; WORKER_STARTUP_FAILED before
// ready; WORKER_CRASHED for a hard timeout; WORKER_UNRESPONSIVE for a lane the host killed
// because its heartbeat stood still; WORKER_CRASHED for a corrupt ring, a signal, a Go panic
// or fatal error; WORKER_EXITED for any other exit, with its status.
func Classify(x Exit) *Error {
	e := &Error{Lane: x.Lane}
	how := x.how()
	switch {
	case x.Stopping:
		e.Code, e.Message = CodeThreadClosed, "lane stopped ("+how+")"
	case !x.Ready:
		e.Code = CodeStartupFailed
		switch {
		case x.Fatal != "":
			e.Message = x.Fatal + " (" + how + ")"
		case x.Startup > 0:
			e.Message = fmt.Sprintf("not ready within the startup timeout of %v", x.Startup)
		default:
			e.Message = "exited before ready: " + how
		}
	case x.HardTimeout != "":
		e.Code, e.Message = CodeWorkerCrashed, "killed by the host: hard timeout: "+x.HardTimeout
	case x.Unresponsive != "":
		e.Code, e.Message = CodeWorkerUnresponsive, "killed by the host: unresponsive: "+x.Unresponsive
	case x.Corrupt != nil:
		e.Code, e.Message, e.Cause = CodeWorkerCrashed, "killed by the host: corrupt ring", x.Corrupt
	case x.Signal != 0:
		e.Code, e.Message = CodeWorkerCrashed, how
	case x.Status == 2 && x.Failure != "":
		e.Code, e.Message = CodeWorkerCrashed, x.Failure+" ("+how+")"
	default:
		e.Code, e.Message = CodeWorkerExited, "exited on its own: "+how
	}
	if e.Cause == nil && x.Err != nil {
		e.Cause = x.Err
	}
	if len(x.Tail) > 0 && e.Code != CodeThreadClosed {
		tail := x.Tail[max(0, len(x.Tail)-tailLines):]
		e.Message += "\nstderr tail:\n  " + strings.Join(tail, "\n  ")
	}
	return e
}

func (x Exit) how() string {
	if x.Signal != 0 {
		return fmt.Sprintf("killed by signal %s", signalName(x.Signal))
	}
	if x.Status < 0 {
		return "status unknown"
	}
	return fmt.Sprintf("exit status %d", x.Status)
}

func signalName(s syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGSEGV: "SIGSEGV", syscall.SIGBUS: "SIGBUS", syscall.SIGABRT: "SIGABRT",
		syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM", syscall.SIGILL: "SIGILL",
		syscall.SIGFPE: "SIGFPE", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return s.String()
}
