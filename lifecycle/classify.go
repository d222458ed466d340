package lifecycle

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/knitgo/knit/internal/logging"
)

// Exit is what the host knows when a lane has ended. Everything in it that the lane wrote
// (Fatal, Tail, Failure, Crash) is hostile text: Classify cleans and bounds it.
type Exit struct {
	Lane     int
	Stopping bool // the host had asked the lane to stop
	// Ready is the host's own record that it saw the lane ready — never a word read from the
	// lane's region when it ends, which the lane could have rewritten.
	Ready        bool
	Status       int            // exit status; -1 when killed by a signal
	Signal       syscall.Signal // the signal that killed it, or 0
	Fatal        string         // the reason the lane left in its region, if any
	Tail         []string       // the last lines of its stderr
	Failure      string         // the line where the Go runtime announced a panic or fatal error
	Crash        []string       // the runtime's account after Failure: signal line, faulting goroutine's frames
	Startup      time.Duration  // with StartupTimeout: the host gave up waiting for ready
	Handoff      error          // the host killed it: handing it its shared memory failed
	HardTimeout  string         // the host killed it: a call overran its hard timeout
	Unresponsive string         // the host killed it: its heartbeat stood still
	Corrupt      error          // the host killed it: it broke the ring protocol
	Err          error          // waiting for it failed
	// What the host knows of the lane's resource limits (ProcessConfig.Limits), all from the
	// kernel, none from the lane.
	OOMKills    uint64        // its cgroup's oom_kill count at its end (0 without a cgroup)
	MemoryLimit int64         // its memory limit, bytes (0: none)
	CPUTime     time.Duration // user+system CPU time it used (wait4's rusage)
	CPULimit    time.Duration // its CPU-time limit as applied (RLIMIT_CPU; 0: none)
	// DataLimited: its memory limit was RLIMIT_DATA, which counts thread stacks; and no
	// process limit was set. A cgo lane that cannot create a thread then ran out of memory.
	DataLimited bool
}

// ErrGoexit is the end of a goroutine lane whose task called runtime.Goexit: its executor
// never returned.
var ErrGoexit = errors.New("lane goroutine exited (runtime.Goexit in a task)")

// ClassifyReturn is Classify for a goroutine lane, whose executor returned err (ErrGoexit:
// it never returned); stopping: the host had asked it to stop. THREAD_CLOSED after a stop
// request; WORKER_EXITED for Goexit or a return without a stop request, which alone is
// normal (an end on its own with success); WORKER_CRASHED for an error.
func ClassifyReturn(lane int, stopping bool, err error) (e *Error, normal bool) {
	switch {
	case stopping && err == nil:
		return &Error{Code: CodeThreadClosed, Lane: lane, Message: "lane stopped"}, false
	case stopping:
		return &Error{Code: CodeThreadClosed, Lane: lane, Message: "lane stopped", Cause: err}, false
	case errors.Is(err, ErrGoexit):
		return &Error{Code: CodeWorkerExited, Lane: lane, Message: err.Error()}, false
	case err != nil:
		return &Error{Code: CodeWorkerCrashed, Lane: lane, Message: "lane failed", Cause: err}, false
	}
	return &Error{Code: CodeWorkerExited, Lane: lane, Message: "lane returned without a stop request"}, true
}

// Bounds on the lane's text in a LaneReport: lines of the tail, bytes per line.
const (
	tailLines = 16
	lineBytes = 256
)

// Classify turns an ended lane into its coded error. The first matching rule wins:
// THREAD_CLOSED after a stop request whatever the status; WORKER_STARTUP_FAILED before
// ready; WORKER_CRASHED for a hard timeout; WORKER_UNRESPONSIVE for a lane the host killed
// because its heartbeat stood still; WORKER_CRASHED for a corrupt ring; WORKER_OUT_OF_MEMORY
// for a lane the kernel's OOM killer killed in its cgroup (SIGKILL and an oom_kill count) or
// whose Go runtime died of "out of memory" or "cannot allocate memory"; WORKER_CPU_LIMIT for
// a lane that used its CPU-time limit up; WORKER_CRASHED for a signal, a Go panic or fatal
// error; WORKER_EXITED for any other exit, with its status.
//
// The message is the reason, on one line: how the lane ended and, for a Go panic or fatal
// error, the runtime's failure line ("panic: ...", as a TASK_PANIC's message has the panic
// value). What else the lane printed about its end — the faulting goroutine's frames, with
// their source paths, and the last lines of its stderr — is not in the message, which may
// reach a client: it is in a *LaneReport, the error's Cause (errors.As), for logs.
func Classify(x Exit) *Error {
	e := &Error{Lane: x.Lane}
	how := x.how()
	failure := logging.Clean(x.Failure, lineBytes)
	switch {
	case x.Stopping:
		e.Code, e.Message = CodeThreadClosed, "lane stopped ("+how+")"
	case !x.Ready:
		e.Code = CodeStartupFailed
		switch {
		case x.Handoff != nil:
			e.Message, e.Cause = "could not hand the lane its shared memory ("+how+")", x.Handoff
		case x.Fatal != "":
			e.Message = logging.Clean(x.Fatal, 1024) + " (" + how + ")"
		case x.Startup > 0:
			e.Message = fmt.Sprintf("not ready within the startup timeout of %v", x.Startup)
		case failure != "":
			e.Message = "exited before ready: " + failure + " (" + how + ")"
		case x.bootLine() != "":
			e.Message = "exited before ready: " + x.bootLine() + " (" + how + ")"
		default:
			e.Message = "exited before ready: " + how
		}
	case x.HardTimeout != "":
		e.Code, e.Message = CodeWorkerCrashed, "killed by the host: hard timeout: "+x.HardTimeout
	case x.Unresponsive != "":
		e.Code, e.Message = CodeWorkerUnresponsive, "killed by the host: unresponsive: "+x.Unresponsive
	case x.Corrupt != nil:
		e.Code, e.Message, e.Cause = CodeWorkerCrashed, "killed by the host: corrupt ring", x.Corrupt
	case x.Signal == syscall.SIGKILL && x.OOMKills > 0:
		e.Code, e.Message = CodeWorkerOutOfMemory, "killed by the kernel's out-of-memory killer in its cgroup"+x.memoryLimit()+" ("+how+")"
	case x.Status == 2 && x.outOfMemory(failure):
		e.Code, e.Message = CodeWorkerOutOfMemory, failure+x.memoryLimit()+" ("+how+")"
	case x.cpuLimitReached():
		e.Code, e.Message = CodeWorkerCPULimit, fmt.Sprintf("used up its CPU time limit of %v (%v used; %s)",
			x.CPULimit, x.CPUTime.Round(time.Millisecond), how)
	case x.Signal != 0:
		e.Code, e.Message = CodeWorkerCrashed, how
	case x.Status == 2 && failure != "":
		e.Code, e.Message = CodeWorkerCrashed, failure+" ("+how+")"
	default:
		e.Code, e.Message = CodeWorkerExited, "exited on its own: "+how
	}
	if e.Cause == nil && x.Err != nil {
		e.Cause = x.Err
	}
	if e.Code == CodeThreadClosed {
		return e
	}
	if r := x.report(failure); r != nil {
		r.Err, e.Cause = e.Cause, r
	}
	return e
}

// A LaneReport is what a lane process printed about its end, cleaned and bounded: the Go
// runtime's failure line, the faulting goroutine's frames and the last lines of its stderr.
// Classify makes it the Cause of the lane's error, so that a call that failed because its
// lane ended carries it too; find it with errors.As and log it, at Debug. None of it is in
// the error's message: frames name source files, and a lane's stderr is anybody's text.
type LaneReport struct {
	// Failure is the runtime's failure line ("panic: ...", "fatal error: ..."), or "".
	Failure string
	// Stack is the runtime's account after it: the signal line, the faulting goroutine's
	// header and its frames ("function at file:line"), at most 12 of them.
	Stack []string
	// Tail is the last lines of the lane's stderr, at most 16 (part of the goroutine dump,
	// after a crash).
	Tail []string
	// Err is what lay under the lane's end besides its output (waiting for the process
	// failed, say), or nil: Unwrap returns it.
	Err error
}

// Error says what the report holds, and never any of its text: an *Error whose Cause it is
// may be shown to a client.
func (r *LaneReport) Error() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	var parts []string
	if r.Failure != "" {
		parts = append(parts, "failure line")
	}
	if len(r.Stack) > 0 {
		parts = append(parts, fmt.Sprintf("%d stack lines", len(r.Stack)))
	}
	if len(r.Tail) > 0 {
		parts = append(parts, fmt.Sprintf("%d stderr lines", len(r.Tail)))
	}
	return "lane report: " + strings.Join(parts, ", ") + " (errors.As *LaneReport)"
}

// Unwrap returns Err.
func (r *LaneReport) Unwrap() error { return r.Err }

// report is what the lane printed about its end, or nil if it printed nothing.
func (x Exit) report(failure string) *LaneReport {
	if failure == "" && len(x.Crash) == 0 && len(x.Tail) == 0 {
		return nil
	}
	r := &LaneReport{Failure: failure}
	for _, l := range x.Crash {
		r.Stack = append(r.Stack, logging.Clean(l, lineBytes))
	}
	for _, l := range x.Tail[max(0, len(x.Tail)-tailLines):] {
		r.Tail = append(r.Tail, logging.Clean(l, lineBytes))
	}
	return r
}

// bootLine is the reason a lane that failed its boot printed before it had a region to
// write it in ("knit lane: bad boot record: ...", "knit lane 2: knit/shm: ..."): the last
// such line of its stderr, cleaned, or "".
func (x Exit) bootLine() string {
	for i := len(x.Tail) - 1; i >= 0; i-- {
		if strings.HasPrefix(x.Tail[i], "knit lane") {
			return logging.Clean(x.Tail[i], lineBytes)
		}
	}
	return ""
}

// cpuLimitReached reports whether the lane ended for its CPU-time limit: it exited with
// ExitCPULimit on the kernel's SIGXCPU at the soft limit, or died of SIGXCPU, or the kernel
// killed it (SIGKILL) at the hard limit. The CPU time wait4 reports must agree: at least
// half the limit after SIGXCPU (the kernel checks the limit against tick-sampled times, and
// wait4's are scaled to the exact runtime: on a busy machine they fall well short), within
// a tenth for a SIGKILL, which has many other causes. A task's os.Exit(80) early in a lane's
// life is an exit, not a limit.
func (x Exit) cpuLimitReached() bool {
	switch {
	case x.CPULimit <= 0:
		return false
	case x.Signal == 0 && x.Status == ExitCPULimit, x.Signal == syscall.SIGXCPU:
		return x.CPUTime >= x.CPULimit/2
	case x.Signal == syscall.SIGKILL:
		return x.CPUTime >= x.CPULimit-max(x.CPULimit/10, 100*time.Millisecond)
	}
	return false
}

// memoryLimit names the lane's memory limit in a message, if it had one.
func (x Exit) memoryLimit() string {
	if x.MemoryLimit <= 0 {
		return ""
	}
	return ", memory limit " + mib(x.MemoryLimit)
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

// CrashReport reads a lane's stderr, line by line, for the Go runtime's account of a crash:
//
//	panic: boom                          (or "fatal error: ...": the failure line)
//	[signal SIGSEGV: ... addr=0x0 pc=...]
//
//	goroutine 7 [running]:               (the faulting goroutine: the first block)
//	main.f(...)
//		/src/main.go:12 +0x1d
//	...
//
//	goroutine 1 [chan receive]:          (every other goroutine: the rest of the dump)
//
// It keeps the failure line, the signal line and the first goroutine's frames, compacted
// to "function at file:line". The zero value is ready to use; it is not safe for concurrent
// use.
type CrashReport struct {
	phase   int
	failure string
	signal  string
	header  string
	frames  []frame
	fn      string // a function line waiting for its file line
	waited  int    // lines between the failure line and a goroutine header
}

type frame struct {
	text    string
	runtime bool // a frame of the runtime's own panic and signal machinery
}

const (
	phaseBefore = iota // no failure line yet
	phaseHeader        // after the failure line, before the first goroutine header
	phaseFrames        // in the first goroutine's block
	phaseRest          // the rest of the dump
)

// Bounds: lines kept from one crash report, and lines after a failure line within which a
// goroutine header must come (otherwise the "failure" was ordinary output).
const (
	maxFrames  = 12
	headerWait = 16
)

var goroutineHeader = regexp.MustCompile(`^goroutine (\d+)(?: [^\[]*)? \[([^\]]*)\]:$`)

// runtimeSignal is the line the Go runtime starts its report with when it dies of a signal
// ("SIGABRT: abort", "SIGSEGV: segmentation violation").
var runtimeSignal = regexp.MustCompile(`^SIG[A-Z0-9]+: [a-z]`)

// Line reads one line. It reports whether the line is part of a runtime crash report after
// its failure line — a line of the goroutine dump, which a host logs at Debug only.
func (c *CrashReport) Line(s string) (dump bool) {
	switch c.phase {
	case phaseBefore:
		// Besides a panic or fatal error: cgo's own account of why it aborts ("runtime/cgo:
		// pthread_create failed: ..."), and the runtime dying of a signal it cannot turn
		// into a panic ("SIGABRT: abort", then "PC=...").
		if strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ") ||
			strings.HasPrefix(s, "runtime/cgo: ") || runtimeSignal.MatchString(s) {
			c.failure, c.phase, c.waited = cut(s), phaseHeader, 0
		}
		return false
	case phaseHeader:
		if m := goroutineHeader.FindStringSubmatch(s); m != nil {
			c.header, c.phase = "goroutine "+m[1]+" ["+m[2]+"]:", phaseFrames
			return true
		}
		if (strings.HasPrefix(s, "[signal ") || runtimeSignal.MatchString(s)) && c.signal == "" {
			c.signal = cut(s)
		}
		if dumpLike(s) { // the "runtime stack:" of a fatal error on the system stack, say
			return true
		}
		if c.waited++; c.waited > headerWait {
			*c = CrashReport{}
			return c.Line(s)
		}
		return true
	case phaseFrames:
		switch {
		case s == "":
			c.phase = phaseRest
		case strings.HasPrefix(s, "\t"):
			loc := strings.TrimSpace(cut(s))
			if i := strings.Index(loc, " +0x"); i >= 0 {
				loc = loc[:i]
			} else if i := strings.Index(loc, " fp="); i >= 0 {
				loc = loc[:i]
			}
			if c.fn != "" && len(c.frames) < 4*maxFrames {
				c.frames = append(c.frames, frame{text: compactFrame(c.fn) + " at " + loc, runtime: isRuntimeFrame(c.fn)})
			}
			c.fn = ""
		default:
			c.fn = cut(s)
		}
		return true
	}
	return true
}

// dumpLike reports whether a line may belong to the runtime's report before its first
// goroutine header: a blank line, a section title, a frame or its file line.
func dumpLike(s string) bool {
	return s == "" || s == "runtime stack:" || strings.HasPrefix(s, "\t") || strings.HasSuffix(s, ")")
}

// compactFrame shortens a frame's function line: its arguments, hexadecimal words that mean
// nothing to a reader of the error, become "(…)".
func compactFrame(fn string) string {
	if !strings.HasSuffix(fn, ")") || strings.HasPrefix(fn, "created by ") {
		return fn
	}
	depth := 0
	for i := len(fn) - 1; i >= 0; i-- {
		switch fn[i] {
		case ')':
			depth++
		case '(':
			if depth--; depth == 0 {
				if i+2 == len(fn) {
					return fn
				}
				return fn[:i] + "(…)"
			}
		}
	}
	return fn
}

// cut bounds what a report keeps of one line (a lane's line can be 64 KiB): Classify cuts
// again, to lineBytes, once cleaned.
func cut(s string) string { return s[:min(len(s), 4*lineBytes)] }

func isRuntimeFrame(fn string) bool {
	return strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "panic(")
}

// Failure is the failure line ("panic: ...", "fatal error: ..."), or "".
func (c *CrashReport) Failure() string { return c.failure }

// Crash is what followed the failure line: the signal line, if any, the faulting
// goroutine's header and its frames — the runtime's own panic and signal frames left out
// when there are others — at most maxFrames of them.
func (c *CrashReport) Crash() []string {
	if c.failure == "" {
		return nil
	}
	var out []string
	if c.signal != "" {
		out = append(out, c.signal)
	}
	if c.header == "" {
		return out
	}
	out = append(out, c.header)
	user := 0
	for _, f := range c.frames {
		if !f.runtime {
			user++
		}
	}
	n := 0
	for _, f := range c.frames {
		if (f.runtime && user > 0) || n == maxFrames {
			continue
		}
		out = append(out, f.text)
		n++
	}
	return out
}
