package knit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/knitgo/knit"
)

// The errors calls return (errors.go): a task's error, a task's panic (PanicError).

func TestTaskError(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := fail.Call(context.Background(), p, "bad input")
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeTaskError || ke.Task != "test.fail" || !strings.Contains(err.Error(), "bad input") {
		t.Fatalf("err = %#v", err)
	}
}

func TestPanicRejectsCallLaneLives(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := boom.Call(context.Background(), p, "kaboom")
	if !errors.Is(err, knit.ErrTaskPanic) {
		t.Fatalf("err = %v, want ErrTaskPanic", err)
	}
	var pe *knit.PanicError
	if !strings.Contains(err.Error(), "kaboom") || strings.Contains(err.Error(), "goroutine") ||
		!errors.As(err, &pe) || !strings.Contains(string(pe.Stack), "goroutine") {
		t.Fatalf("panic error lacks the value, or its stack is in the message, not in the PanicError: %v", err)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil || sum != 2 {
		t.Fatalf("lane did not keep serving: %d, %v", sum, err)
	}
	if s := p.Stats(); s.Lanes[0].State != knit.StateReady || s.Lanes[0].Failed != 1 {
		t.Fatalf("stats after panic: %+v", s.Lanes[0])
	}
}

func TestTaskPanicKeepsStackOutOfMessage(t *testing.T) {
	g, err := knit.NewPool(knit.Config{Lanes: 1}, boom)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(context.Background())
	p := newProcessPool(t, knit.Config{Lanes: 1}, boom)
	for name, pool := range map[string]*knit.Pool{"goroutine": g, "process": p} {
		_, err := boom.Call(context.Background(), pool, "kaboom")
		wantCode(t, name, err, knit.CodeTaskPanic)
		if strings.Contains(err.Error(), "goroutine") || !strings.Contains(err.Error(), "panic: kaboom") {
			t.Errorf("%s: message %q carries a stack, or not the value", name, err)
		}
		var pe *knit.PanicError
		if !errors.As(err, &pe) || !strings.Contains(string(pe.Stack), "goroutine") || pe.Error() != "panic: kaboom" {
			t.Errorf("%s: PanicError %+v", name, pe)
		}
	}
}

// TestCrashErrorKeepsStackOut: a lane that crashes on a segmentation fault fails its call
// with WORKER_CRASHED whose message is one line of reason — the runtime's failure line and
// the exit status — with none of the lane's stack (source paths) or stderr; those are in the
// error's Stack and Stderr fields, the faulting goroutine's frames and not another's. (Error()
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
	stack := strings.Join(ke.Stack, " | ")
	for _, want := range []string{"[signal SIGSEGV", "[running]:", "tasks_test.go:"} {
		if !strings.Contains(stack, want) {
			t.Errorf("Error.Stack lacks %q: %s", want, stack)
		}
	}
	if len(ke.Stack) == 0 || ke.Stack[0] != "fatal error: fault" || strings.Contains(stack, "abortWatch") || len(ke.Stderr) == 0 {
		t.Errorf("Stack %q, Stderr %q: want the failure line, the faulting goroutine only, and the stderr tail", ke.Stack, ke.Stderr)
	}
}
