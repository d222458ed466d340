package knit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
)

// Calls (call.go): Task.Call, Task.Go and Future — results, cancellation, deadlines, what a
// call costs, the caller's context in a process lane, and futures waited for in every way.

func TestCall(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 2})
	ctx := context.Background()
	sum, err := add.Call(ctx, p, [2]int64{40, 2})
	if err != nil || sum != 42 {
		t.Fatalf("add = %d, %v", sum, err)
	}
	b, err := echo.Call(ctx, p, []byte("hello"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("echo = %q, %v", b, err)
	}
	f := add.Go(ctx, p, [2]int64{1, 2})
	<-f.Done()
	if v, err := f.Wait(); err != nil || v != 3 {
		t.Fatalf("future = %d, %v", v, err)
	}
}

func TestManyCalls(t *testing.T) {
	calls := 1_000_000
	if testing.Short() {
		calls = 100_000
	}
	p := newPool(t, knit.Config{Lanes: 4})
	addConcurrently(t, p, calls, 64)
	var done uint64
	for _, l := range p.Stats().Lanes {
		done += l.Completed
	}
	if done != uint64(calls) {
		t.Fatalf("lanes completed %d calls, want %d", done, calls)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestCancel(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	g := newGate()
	ctx, cancel := context.WithCancel(context.Background())
	f := block.Go(ctx, p, g)
	<-g.started
	cancel()
	_, err := f.Wait()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want one wrapping context.Canceled", err)
	}
	if taskErr := <-g.ended; !errors.Is(taskErr, context.Canceled) {
		t.Fatalf("task context ended with %v", taskErr)
	}
	// The same through Call.
	ctx, cancel = context.WithCancel(context.Background())
	go func() { <-g.started; cancel() }()
	if _, err := block.Call(ctx, p, g); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call err = %v", err)
	}
	<-g.ended
}

func TestDeadline(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	g := newGate()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := block.Call(ctx, p, g)
	if !errors.Is(err, knit.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout wrapping DeadlineExceeded", err)
	}
	select {
	case <-g.started: // the task ran: its context ended with the call
		if taskErr := <-g.ended; !errors.Is(taskErr, context.DeadlineExceeded) {
			t.Fatalf("task context ended with %v", taskErr)
		}
	default: // on a loaded machine the deadline can pass before the lane takes the call: it never runs
	}
}

func TestScalarCallDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are only meaningful without -race and -cover")
	}
	// With the default logger (KNIT_DEBUG unset, or naming only namespaces off the call
	// path) and with a caller's logger at Info, under a supervision tree whose events and
	// protoactor logs flow through the same loggers: a call costs nothing.
	for _, tc := range []struct {
		name, debug string
		logger      *zap.Logger
	}{
		{"default", "", nil},
		{"debug-supervisor", "supervisor,steal", nil},
		{"caller-logger", "", zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.InfoLevel))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KNIT_DEBUG", tc.debug)
			for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
				p := newPool(t, knit.Config{Lanes: 1, Runtime: rt, Logger: tc.logger})
				ctx := context.Background()
				var failures atomic.Int32
				allocs := testing.AllocsPerRun(10_000, func() {
					if _, err := add.Call(ctx, p, [2]int64{1, 2}); err != nil {
						failures.Add(1)
					}
				})
				if failures.Load() != 0 || allocs != 0 {
					t.Fatalf("%v: %v allocs per scalar call (%d failures), want 0", rt, allocs, failures.Load())
				}
			}
		})
	}
}

// A Future's settling belongs to knit: its method set is reading only. (A Fail method once
// let a user settle an unsettled future, which made the lane panic and Close hang.)
func TestFutureMethodsReadOnly(t *testing.T) {
	typ := reflect.TypeFor[*knit.Future[int]]()
	var names []string
	for i := range typ.NumMethod() {
		names = append(names, typ.Method(i).Name)
	}
	sort.Strings(names)
	if want := []string{"Done", "Pending", "Wait"}; !reflect.DeepEqual(names, want) {
		t.Errorf("*knit.Future methods %v, want %v", names, want)
	}
}

// The caller's context in a process lane: its deadline, its trace.

// A task on a process lane sees its caller's deadline; a call without one has none.
func TestProcessLaneSeesCallerDeadline(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1}, deadlineOf)
	want := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	got, err := deadlineOf.Call(ctx, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != want.UnixNano() {
		t.Fatalf("lane saw deadline %v, caller's is %v", time.Unix(0, got), want)
	}
	got, err = deadlineOf.Call(context.Background(), p, 0)
	if err != nil || got != 0 {
		t.Fatalf("without a deadline: %d, %v", got, err)
	}
}

// With Config.Propagator (and WithPropagator in the lane's knit.Main, as TestMain has), a
// trace goes on in a process lane; without it the lane sees none.
func TestProcessLaneCarriesTrace(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	for _, tc := range []struct {
		name string
		prop propagation.TextMapPropagator
		want string
	}{
		{"propagator", propagation.TraceContext{}, sc.TraceID().String()},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 1, Propagator: tc.prop}, traceOf)
			got, err := traceOf.Call(ctx, p, 0)
			if err != nil || got != tc.want {
				t.Fatalf("lane saw trace %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Futures on process lanes wake no reaper until someone blocks on one (Wait once its spin
// has run out, or Done); a future nobody waits on is drained by whoever looks next, by a
// reaper once its lane holds more calls than its return ring has slots, or by the reaper's
// safety net. These tests drive every way of waiting with a spin so short that it always
// runs out, so each wait must be served by a reaper woken for it: a lost wake-up hangs a
// wait, which the watchdog reports.

// settleWithin fails the test if wait does not return within a minute (a hang guard, not
// a timing claim).
func settleWithin(t *testing.T, p *knit.Pool, what string, wait func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s: not settled after a minute (lost wake-up?); lanes: %+v", what, p.Stats().Lanes)
	}
}

func TestProcessFuturesWakeNoLostWakeUp(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, CallerSpin: time.Nanosecond})
	ctx := context.Background()
	rounds := 2000
	if testing.Short() {
		rounds = 300
	}
	want := func(f *knit.Future[int64], n int64) error {
		if v, err := f.Wait(); err != nil || v != n+1 {
			return fmt.Errorf("call %d: %d, %v", n, v, err)
		}
		return nil
	}
	settleWithin(t, p, "Wait, one at a time", func() error {
		for i := range int64(rounds) {
			if err := want(add.Go(ctx, p, [2]int64{i, 1}), i); err != nil {
				return err
			}
		}
		return nil
	})
	settleWithin(t, p, "select on Done, 8 at a time", func() error {
		for i := int64(0); i < int64(rounds); i += 8 {
			var fs [8]*knit.Future[int64]
			for k := range fs {
				fs[k] = add.Go(ctx, p, [2]int64{i + int64(k), 1})
			}
			for k, f := range fs {
				<-f.Done()
				if err := want(f, i+int64(k)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	settleWithin(t, p, "polling Pending", func() error {
		for i := range int64(rounds / 10) {
			f := add.Go(ctx, p, [2]int64{i, 1})
			for f.Pending() {
				runtime.Gosched()
			}
			if err := want(f, i); err != nil {
				return err
			}
		}
		return nil
	})
	settleWithin(t, p, "a burst nobody waits on, then Wait newest first", func() error {
		fs := make([]*knit.Future[int64], 300) // more than both lanes' rings hold
		for i := range fs {
			fs[i] = add.Go(ctx, p, [2]int64{int64(i), 1})
		}
		for i := len(fs) - 1; i >= 0; i-- {
			if err := want(fs[i], int64(i)); err != nil {
				return err
			}
		}
		return nil
	})
}

// A result nobody asks for is still drained: the lane's in-flight count falls to zero.
func TestProcessFutureNobodyWaitsOnSettles(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	f := add.Go(context.Background(), p, [2]int64{1, 1})
	settleWithin(t, p, "in-flight count back to zero", func() error {
		for p.Stats().Lanes[0].InFlight != 0 {
			time.Sleep(time.Millisecond) // polling a count: nothing to synchronise on
		}
		return nil
	})
	if v, err := f.Wait(); err != nil || v != 2 {
		t.Fatalf("Wait = %d, %v", v, err)
	}
}

// One goroutine keeps a sliding window of futures on two process lanes, with no watchdog
// (Liveness < 0), whose periodic drain would otherwise hide a reaper that nobody wakes: a
// lingering reaper that let go of the spinner token woke only the reapers of lanes with a
// blocked Call, so a future on another lane, whose reaper had stood aside, was never drained
// and its Wait hung (with the watchdog on, for up to a second).
func TestProcessFutureWindowNoWatchdog(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Liveness: -1})
	ctx := context.Background()
	const window = 64
	n := 60_000
	if testing.Short() {
		n = 10_000
	}
	errc := make(chan error, 1)
	go func() {
		// Bursts: the window fills, then drains to empty, so that every burst starts with
		// idle reapers and lanes, as the first calls of a pool do.
		var ring [window]*knit.Future[int64]
		for i := 0; i < n; i += 2 * window {
			for j := range 2 * window {
				k := j % window
				if f := ring[k]; f != nil {
					if v, err := f.Wait(); err != nil || v != int64(i+j-window)+1 {
						errc <- fmt.Errorf("call %d: %d, %v", i+j-window, v, err)
						return
					}
					ring[k] = nil
				}
				if j < window {
					ring[k] = add.Go(ctx, p, [2]int64{int64(i + j), 1})
				}
			}
		}
		errc <- nil
	}()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the window stalled (a future nobody drains); lanes: %+v", p.Stats().Lanes)
	}
}

// Bursts larger than the lanes' rings hold (4 lanes × 32 slots): calls wait in backlogs,
// and each burst is waited for whole before the next starts. With the watchdog off, a
// backlog nobody flushes or a result nobody drains would hang the test.
func TestProcessFutureBurstsBeyondRingsNoWatchdog(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 4, Liveness: -1})
	ctx := context.Background()
	const burst = 200
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	fs := make([]*knit.Future[int64], burst)
	for r := range rounds {
		done := make(chan error, 1)
		go func() {
			for i := range fs {
				fs[i] = add.Go(ctx, p, [2]int64{int64(i), int64(r)})
			}
			for i, f := range fs {
				if v, err := f.Wait(); err != nil || v != int64(i+r) {
					done <- fmt.Errorf("round %d call %d: %d, %v", r, i, v, err)
					return
				}
			}
			done <- nil
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("round %d stalled; lanes: %+v", r, p.Stats().Lanes)
		}
	}
}

// TestPayloadRefusedBeforeEncoding: an input over the limit is refused with
// PAYLOAD_TOO_LARGE before it is encoded — a 100 MB []byte, string or struct field costs
// the host no copy of it — where its size is known cheaply.
func TestPayloadRefusedBeforeEncoding(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, echo, blobLen, strLen)
	big := make([]byte, 100<<20)
	calls := map[string]func() error{
		"[]byte": func() error { return errOf(echo.Call(context.Background(), p, big)) },
		"string": func() error { return errOf(strLen.Call(context.Background(), p, unsafeString(big))) },
		"struct": func() error { return errOf(blobLen.Call(context.Background(), p, blob{Name: "x", Data: big})) },
	}
	for name, call := range calls {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := call()
		runtime.ReadMemStats(&after)
		wantCode(t, name, err, knit.CodePayloadTooLarge)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
			t.Errorf("%s: refusing it allocated %d MiB", name, grew>>20)
		}
	}
	if n, err := blobLen.Call(context.Background(), p, blob{Data: big[:1000]}); err != nil || n != 1000 {
		t.Fatalf("a small blob: %d, %v", n, err)
	}
}

// unsafeString views b as a string without a copy (the test's own 100 MB must not count).
func unsafeString(b []byte) string { return unsafe.String(&b[0], len(b)) }

// TestHardTimeoutFromStart: a call's HardTimeout is measured from when its lane starts it.
// B waits 2 s behind A, then runs 2 s: its caller's 3 s pass while B runs (it times out as a
// call), but B has run only 1 s of its 3 then, so the lane is not killed, and B finishes.
// (Counted from the queue, the lane was killed at 3 s, failing B WORKER_CRASHED.)
func TestHardTimeoutFromStart(t *testing.T) {
	ev := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), OnEvent: ev.record}, hardNap, add)
	pid := p.Stats().Lanes[0].PID
	a := hardNap.Go(context.Background(), p, 2000)
	b := hardNap.Go(context.Background(), p, 2000)
	if v, err := a.Wait(); err != nil || v != 2000 {
		t.Fatalf("A: %d, %v", v, err)
	}
	if _, err := b.Wait(); !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("B: %v, want TIMEOUT (its caller's 3 s)", err)
	}
	// B finishes on the lane: the next call runs once it has, on the same process.
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("a call after B: %d, %v", sum, err)
	}
	if got := p.Stats().Lanes[0]; got.PID != pid || got.Crashes != 0 {
		t.Errorf("the lane was killed: pid %d → %d, %d crashes", pid, got.PID, got.Crashes)
	}
}

// A caller alone on a process lane that does not spin sleeps on the return ring's direct
// doorbell: its calls settle, and so does the call that kills the lane it waits on
// (WORKER_CRASHED), after which the restarted lane serves again.
func TestCallParkedDirect(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, LaneSpin: -1, CallerSpin: -1, Logger: quiet()}, mapSquare, mapCrash)
	ctx := context.Background()
	for i := range 300 {
		if v, err := mapSquare.Call(ctx, p, i); err != nil || v != i*i {
			t.Fatalf("call %d: %d, %v", i, v, err)
		}
	}
	if _, err := mapCrash.Call(ctx, p, 13); !errors.Is(err, knit.ErrWorkerCrashed) {
		t.Fatalf("the call that crashed its lane: %v, want WORKER_CRASHED", err)
	}
	for i := range 50 {
		if v, err := mapCrash.Call(ctx, p, i+20); err != nil || v != (i+20)*(i+20) {
			t.Fatalf("call %d after the restart: %d, %v", i, v, err)
		}
	}
}
