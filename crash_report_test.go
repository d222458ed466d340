package knit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/lifecycle"
)

// TestCrashErrorKeepsStackOut: a lane that crashes on a segmentation fault fails its call
// with WORKER_CRASHED whose message is one line of reason — the runtime's failure line and
// the exit status — with none of the lane's stack (source paths) or stderr; those are in the
// error's *lifecycle.LaneReport, the faulting goroutine's frames and not another's. (Error()
// carried "… | main.fault() at /src/…/x_test.go:41 | …", and the docs present Error() as
// safe to pass to a client.)
func TestCrashErrorKeepsStackOut(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, hostileTasks...)
	_, err := fault.Call(context.Background(), p, 0)
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed {
		t.Fatalf("err = %v, want WORKER_CRASHED", err)
	}
	if want := "fatal error: fault (exit status 2)"; ke.Message != want {
		t.Errorf("message %q, want %q", ke.Message, want)
	}
	for _, leak := range []string{".go:", "[running]", "goroutine", " | ", "\n"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("Error() has the lane's output (%q): %s", leak, err)
		}
	}
	var r *lifecycle.LaneReport
	if !errors.As(err, &r) {
		t.Fatalf("no LaneReport in %v", err)
	}
	stack := strings.Join(r.Stack, " | ")
	for _, want := range []string{"[signal SIGSEGV", "[running]:", "process_test.go:"} {
		if !strings.Contains(stack, want) {
			t.Errorf("report's stack lacks %q: %s", want, stack)
		}
	}
	if r.Failure != "fatal error: fault" || strings.Contains(stack, "abortWatch") || len(r.Tail) == 0 {
		t.Errorf("report %+v: want the failure line, the faulting goroutine only, and the stderr tail", r)
	}
}
