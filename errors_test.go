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
