package knit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/actors"
)

// Values that cannot cross a process boundary, and lanes that send what the host must
// refuse. Each test checks the call's code and that the lane is unharmed: same process, no
// restart, the next call answered.

// sameLane checks that lane 0 of p is still its first process and answers.
func sameLane(t *testing.T, p *knit.Pool, pid int) {
	t.Helper()
	if s, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || s != 3 {
		t.Fatalf("lane no longer answers: %d, %v", s, err)
	}
	l := p.Stats().Lanes[0]
	if l.PID != pid || l.Restarts != 0 || l.Incarnation != 0 {
		t.Fatalf("lane was replaced: pid %d (was %d), %d restarts", l.PID, pid, l.Restarts)
	}
}

func TestCodecResultTooLarge(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Payload: knit.Payload{Arena: 64 << 10, MaxCall: 16 << 10}}, codecTasks...)
	ctx := context.Background()
	pid := p.Stats().Lanes[0].PID
	for _, n := range []int{16<<10 + 1, 64 << 10, 1 << 20} { // over MaxCall, the arena, both
		_, err := bigResult.Call(ctx, p, n)
		wantCode(t, "big result", err, knit.CodePayloadTooLarge)
		sameLane(t, p, pid)
	}
	if b, err := bigResult.Call(ctx, p, 16<<10-8); err != nil || len(b) != 16<<10-8 {
		t.Fatalf("result within the limit: %d bytes, %v", len(b), err)
	}
	// An error message over the limit is cut, not turned into another failure.
	_, err := bigError.Call(ctx, p, 100<<10)
	wantCode(t, "big error", err, knit.CodeTaskError)
	// Error() shows a bounded part of it; the whole (cut) text is the cause.
	var ke *knit.Error
	if !errors.As(err, &ke) || len(err.Error()) > 600 {
		t.Fatalf("big error: Error() is %d bytes", len(err.Error()))
	}
	if n := len(ke.Message) + len(fmt.Sprint(ke.Cause)); n > 16<<10+200 || n < 1000 {
		t.Fatalf("big error message is %d bytes", n)
	}
	sameLane(t, p, pid)
}

func TestCodecCyclicAndDeep(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1}, codecTasks...)
	ctx := context.Background()
	pid := p.Stats().Lanes[0].PID
	loop := &cnode{Val: 1}
	loop.Next = loop
	_, err := walkList.Call(ctx, p, loop)
	wantCode(t, "cyclic input", err, knit.CodeUnsupportedType)
	if !strings.Contains(err.Error(), "cyclic") {
		t.Fatalf("cyclic input: %v does not say why", err)
	}
	if n, err := walkList.Call(ctx, p, &cnode{Next: &cnode{}}); err != nil || n != 2 {
		t.Fatalf("list of two: %d, %v", n, err)
	}
	_, err = cyclicOut.Call(ctx, p, 0)
	wantCode(t, "cyclic output", err, knit.CodeUnsupportedType)
	sameLane(t, p, pid)

	var deep any = 1
	for range 40 {
		deep = []any{deep}
	}
	_, err = deepAny.Call(ctx, p, deep)
	wantCode(t, "deep input", err, knit.CodeUnsupportedType)
	sameLane(t, p, pid)

	// Goroutine lanes share values by reference: a cycle is just a value there.
	g, err := knit.NewPool(knit.Config{Lanes: 1}, walkList)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(ctx)
	if n, err := walkList.Call(ctx, g, loop); err != nil || n != 1000 {
		t.Fatalf("goroutine lane: %d, %v", n, err)
	}
}

func TestCodecLaneRefusesInput(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_FORGE=1"}}}, codecTasks...)
	pid := p.Stats().Lanes[0].PID
	_, err := refuseOnLane.Call(context.Background(), p, 7)
	wantCode(t, "input the lane cannot decode", err, knit.CodeUnsupportedType)
	sameLane(t, p, pid)
}

// A lane that answers with a small payload decoding into a huge value: the host refuses it
// before allocating, and survives.
func TestCodecForgedResultBudget(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_FORGE=1"}}}, codecTasks...)
	for _, n := range []int{65536, 1 << 20} { // 512 MiB, 8 GiB
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := forge.Call(context.Background(), p, n)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("forged result of %d empty strings decoded", n)
		}
		if !errors.Is(err, actors.ErrOverBudget) {
			t.Fatalf("forged result of %d empty strings: %v, want the decode budget refusal", n, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 256<<20 {
			t.Fatalf("forged result of %d empty strings: the host allocated %d MiB", n, got>>20)
		}
	}
	if v, err := forge.Call(context.Background(), p, 3); err != nil || len(v) != 3 {
		t.Fatalf("a small forged result (within the budget) = %d, %v", len(v), err)
	}
}

func TestCodecUnexportedFieldRefused(t *testing.T) {
	_, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process}, add, hidden)
	wantCode(t, "NewPool", err, knit.CodeUnsupportedType)
	for _, want := range []string{"test.codec.hidden", "hiddenField", "secret"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("NewPool error %q does not name %q", err, want)
		}
	}
	// Goroutine lanes pass values by reference: the field arrives.
	g, err := knit.NewPool(knit.Config{Lanes: 1}, hidden)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(context.Background())
	if _, err := hidden.Call(context.Background(), g, hiddenField{Name: "x", secret: 1}); err != nil {
		t.Fatal(err)
	}
}

// The lane's decoder keeps to the budget too: a forged input fails its call with an input
// error and the lane lives on.
func TestCodecForgedInputBudget(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_FORGE=1"}}}, codecTasks...)
	pid := p.Stats().Lanes[0].PID
	for _, n := range []int64{65536, 1 << 20} {
		forgeCount.Store(n)
		_, err := forgeIn.Call(context.Background(), p, nil)
		wantCode(t, "forged input", err, knit.CodeUnsupportedType)
		if !strings.Contains(err.Error(), "budget") {
			t.Fatalf("forged input: %v does not name the budget", err)
		}
		sameLane(t, p, pid)
	}
	forgeCount.Store(2)
	if n, err := forgeIn.Call(context.Background(), p, nil); err != nil || n != 2 {
		t.Fatalf("small forged input: %d, %v", n, err)
	}
}
