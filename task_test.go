package knit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Define and its options (task.go).

func TestTaskTimeout(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := blockTimeout.Call(context.Background(), p, newGate())
	if !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	v, err := blockDefault.Call(context.Background(), p, newGate())
	if err != nil || v != "fallback" {
		t.Fatalf("TimeoutDefault gave %q, %v", v, err)
	}
	v, err = blockDefault.Go(context.Background(), p, newGate()).Wait()
	if err != nil || v != "fallback" {
		t.Fatalf("TimeoutDefault future gave %q, %v", v, err)
	}
}

func TestDefinePanics(t *testing.T) {
	mustPanic := func(name, want string, f func()) {
		t.Helper()
		defer func() {
			v := recover()
			if v == nil || !strings.Contains(fmt.Sprint(v), want) {
				t.Errorf("%s: panic %v, want one mentioning %q", name, v, want)
			}
		}()
		f()
	}
	mustPanic("duplicate", "defined twice", func() {
		knit.Define("test.add", func(context.Context, int) (int, error) { return 0, nil })
	})
	mustPanic("unsupported", "chan int", func() {
		knit.Define("test.chan", func(context.Context, chan int) (int, error) { return 0, nil })
	})
	mustPanic("default type", "TimeoutDefault", func() {
		knit.Define("test.baddefault", func(context.Context, int) (int, error) { return 0, nil },
			knit.TimeoutDefault(time.Second, "not an int"))
	})
}

func TestDefineRefusesNegativeTimeouts(t *testing.T) {
	for name, opt := range map[string]knit.TaskOption{
		"Timeout":        knit.Timeout(-1),
		"HardTimeout":    knit.HardTimeout(-5),
		"TimeoutDefault": knit.TimeoutDefault(-1, 0),
		"nil":            nil,
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "test.codec.negative."+name) {
					t.Errorf("%s: Define did not panic naming the task: %v", name, r)
				}
			}()
			knit.Define("test.codec.negative."+name, func(context.Context, int) (int, error) { return 0, nil }, opt)
		}()
	}
}
