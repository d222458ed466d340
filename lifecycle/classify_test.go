package lifecycle

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tail := []string{"doing work", "more work"}
	cases := []struct {
		name string
		x    Exit
		code Code
		want []string
	}{
		{"stop acknowledged", Exit{Stopping: true, Ready: true, Status: 0}, CodeThreadClosed, []string{"exit status 0"}},
		{"killed after a stop request", Exit{Stopping: true, Ready: true, Status: -1, Signal: syscall.SIGKILL}, CodeThreadClosed, []string{"SIGKILL"}},
		{"stop request wins over a crash", Exit{Stopping: true, Ready: true, Status: 2, Failure: "panic: x"}, CodeThreadClosed, nil},
		{"fatal message before ready", Exit{Status: 78, Fatal: `unknown task "x"`}, CodeStartupFailed, []string{`unknown task "x"`, "exit status 78"}},
		{"startup timeout", Exit{Status: -1, Signal: syscall.SIGKILL, Startup: time.Second}, CodeStartupFailed, []string{"startup timeout of 1s"}},
		{"exit before ready", Exit{Status: 0, Tail: tail}, CodeStartupFailed, []string{"exited before ready: exit status 0", "more work"}},
		{"signal", Exit{Ready: true, Status: -1, Signal: syscall.SIGSEGV, Tail: tail}, CodeWorkerCrashed, []string{"SIGSEGV", "doing work"}},
		{"go panic", Exit{Ready: true, Status: 2, Failure: "panic: boom", Tail: tail}, CodeWorkerCrashed, []string{"panic: boom", "exit status 2"}},
		{"go fatal error", Exit{Ready: true, Status: 2, Failure: "fatal error: fault"}, CodeWorkerCrashed, []string{"fatal error: fault"}},
		{"hard timeout", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, HardTimeout: `task "slow" ran over 1s`}, CodeWorkerCrashed, []string{"hard timeout", "slow"}},
		{"corrupt ring", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, Corrupt: errors.New("bad tag")}, CodeWorkerCrashed, []string{"corrupt ring", "bad tag"}},
		{"exit 2 without a Go failure", Exit{Ready: true, Status: 2}, CodeWorkerExited, []string{"exit status 2"}},
		{"os.Exit(3)", Exit{Ready: true, Status: 3}, CodeWorkerExited, []string{"exit status 3"}},
		{"exit 0 on its own", Exit{Ready: true, Status: 0}, CodeWorkerExited, []string{"exit status 0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.x.Lane = 3
			e := Classify(tc.x)
			if e.Code != tc.code || e.Lane != 3 {
				t.Fatalf("code %s lane %d, want %s lane 3 (%v)", e.Code, e.Lane, tc.code, e)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error(), w) {
					t.Errorf("%q lacks %q", e.Error(), w)
				}
			}
		})
	}
}

func TestErrorIsByCode(t *testing.T) {
	e := &Error{Code: CodeWorkerCrashed, Lane: 1, Message: "x", Cause: syscall.EPIPE}
	if !errors.Is(e, ErrWorkerCrashed) || errors.Is(e, ErrWorkerExited) || !errors.Is(e, syscall.EPIPE) {
		t.Fatal("errors.Is does not match by code and cause")
	}
	if got := e.Error(); !strings.Contains(got, "WORKER_CRASHED") || !strings.Contains(got, "lane 1") {
		t.Fatalf("Error() = %q", got)
	}
}
