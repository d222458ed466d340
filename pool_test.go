package knit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
)

func newPool(t testing.TB, cfg knit.Config) *knit.Pool {
	t.Helper()
	tasks := []knit.Definition{add, echo, fail, boom, block, blockTimeout, blockDefault, goexit}
	if cfg.Runtime == knit.Process {
		// A *gate holds channels in unexported fields: it cannot cross a process boundary,
		// and NewPool refuses it for process lanes.
		tasks = []knit.Definition{add, echo, fail, boom, goexit}
	}
	p, err := knit.NewPool(cfg, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

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

// addConcurrently makes n add calls from workers goroutines and checks every sum.
func addConcurrently(t *testing.T, p *knit.Pool, n, workers int) {
	t.Helper()
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				sum, err := add.Call(context.Background(), p, [2]int64{int64(i), int64(w)})
				if err != nil || sum != int64(i+w) {
					errc <- fmt.Errorf("call %d: %d, %v", i, sum, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
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

// occupy holds the only lane of p in a blocked call and fills its 32 slots.
func occupy(t *testing.T, p *knit.Pool, g *gate) []*knit.Future[string] {
	futs := []*knit.Future[string]{block.Go(context.Background(), p, g)}
	<-g.started
	for range 32 {
		futs = append(futs, block.Go(context.Background(), p, g))
	}
	return futs
}

func TestOverload(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1, Backlog: 2})
	g := newGate()
	futs := occupy(t, p, g)
	futs = append(futs, block.Go(context.Background(), p, g), block.Go(context.Background(), p, g))
	_, err := block.Call(context.Background(), p, g)
	if !errors.Is(err, knit.ErrOverloaded) {
		t.Fatalf("err = %v, want ErrOverloaded", err)
	}
	close(g.open)
	for i, f := range futs {
		if v, err := f.Wait(); err != nil || v != "opened" {
			t.Fatalf("call %d: %q, %v", i, v, err)
		}
	}
}

func TestBlockWhenFull(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1, Backlog: 1, BlockWhenFull: true})
	g := newGate()
	futs := occupy(t, p, g)
	futs = append(futs, block.Go(context.Background(), p, g))
	// The next call waits for room; its context ending first gives up the wait.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := block.Call(ctx, p, g); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked call: %v", err)
	}
	// A call blocked for room goes in once the lane makes progress.
	late := make(chan *knit.Future[string])
	go func() { late <- block.Go(context.Background(), p, g) }()
	close(g.open)
	for i, f := range append(futs, <-late) {
		if v, err := f.Wait(); err != nil || v != "opened" {
			t.Fatalf("call %d: %q, %v", i, v, err)
		}
	}
}

func TestCloseWhileInFlight(t *testing.T) {
	// Lanes 0 and 1 hold the blocked calls; first-idle sends probes to lane 2.
	p, err := knit.NewPool(knit.Config{Lanes: 3, Balancer: knit.FirstIdle}, block, add)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	futs := []*knit.Future[string]{block.Go(context.Background(), p, g), block.Go(context.Background(), p, g)}
	<-g.started
	<-g.started
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	// Once Close has begun, new calls are refused while the two in flight carry on.
	for {
		_, err := add.Call(context.Background(), p, [2]int64{})
		if errors.Is(err, knit.ErrPoolClosed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
	close(g.open)
	for _, f := range futs {
		if v, err := f.Wait(); err != nil || v != "opened" {
			t.Fatalf("in-flight call: %q, %v", v, err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestCloseAbandonsStuckLane(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 2, StopAckTimeout: time.Millisecond}, block)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	stuck := block.Go(context.Background(), p, g)
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // do not wait for the call to finish
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.Close(ctx) }()
	}
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, knit.ErrThreadClosed) || !strings.Contains(err.Error(), "abandoned") {
			t.Fatalf("Close = %v, want THREAD_CLOSED naming the abandoned lane", err)
		}
	}
	if _, err := stuck.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
		t.Fatalf("held call settled with %v, want THREAD_CLOSED", err)
	}
	close(g.open) // let the abandoned goroutine finish so nothing leaks
}

func TestGoexitEndsLane(t *testing.T) {
	// Transient (default): an exit without a stop request is abnormal and the lane comes
	// back as incarnation 1; the next call waits for it.
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := goexit.Call(context.Background(), p, 1)
	if !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("err = %v, want WORKER_EXITED", err)
	}
	if _, err := add.Call(context.Background(), p, [2]int64{}); err != nil {
		t.Fatalf("call after the restart: %v", err)
	}
	// The new incarnation takes calls a moment before its ready event is reported.
	for e := range p.Events() {
		if e.Lane == 0 && e.To == knit.StateReady && e.Incarnation == 1 {
			break
		}
	}
	if s := p.Stats().Lanes[0]; s.State != knit.StateReady || s.Incarnation != 1 || s.Restarts != 1 {
		t.Fatalf("lane after restart: %+v", s)
	}

	// Temporary: the lane is not restarted, the pool has none left and says so.
	p = newPool(t, knit.Config{Lanes: 1, Restart: knit.Restart{Type: knit.Temporary}})
	if _, err := goexit.Call(context.Background(), p, 1); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("err = %v, want WORKER_EXITED", err)
	}
	for e := range p.Events() {
		if e.Lane == -1 && e.To == knit.StateFailed {
			break
		}
	}
	if _, err := add.Call(context.Background(), p, [2]int64{}); !errors.Is(err, knit.ErrPoolUnavailable) {
		t.Fatalf("call on a pool with no live lane: %v, want ErrPoolUnavailable", err)
	}
	if s := p.Stats(); s.Lanes[0].State != knit.StateDead || !s.Failed {
		t.Fatalf("stats %+v", s)
	}
}

func TestBalancers(t *testing.T) {
	for _, b := range []knit.Balancer{knit.LeastLoaded, knit.RoundRobin, knit.FirstIdle, knit.Random, knit.FirstIdleOrRandom} {
		p := newPool(t, knit.Config{Lanes: 3, Balancer: b, Steal: knit.StealOff}) // balancers place calls on private lanes
		for i := range 300 {
			if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i+1) {
				t.Fatalf("balancer %d call %d: %d, %v", b, i, sum, err)
			}
		}
		lanes := p.Stats().Lanes
		switch b {
		case knit.RoundRobin:
			for _, l := range lanes {
				if l.Completed != 100 {
					t.Errorf("round-robin: lane %d ran %d calls, want 100", l.Lane, l.Completed)
				}
			}
		case knit.FirstIdle, knit.LeastLoaded:
			if lanes[0].Completed != 300 {
				t.Errorf("first-idle with one call at a time: lane 0 ran %d, want 300", lanes[0].Completed)
			}
		}
	}
}

func TestRefusals(t *testing.T) {
	if _, err := knit.NewPool(knit.Config{}); err == nil {
		t.Error("NewPool with no tasks succeeded")
	}
	p := newPool(t, knit.Config{Lanes: 1})
	if _, err := unserved.Call(context.Background(), p, 1); !errors.Is(err, knit.ErrPoolUnavailable) {
		t.Errorf("task not in the pool: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := add.Call(ctx, p, [2]int64{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	_ = p.Close(context.Background())
	if _, err := add.Call(context.Background(), p, [2]int64{}); !errors.Is(err, knit.ErrPoolClosed) {
		t.Errorf("closed pool: %v", err)
	}
	if _, err := add.Go(context.Background(), p, [2]int64{}).Wait(); !errors.Is(err, knit.ErrPoolClosed) {
		t.Errorf("closed pool, Go: %v", err)
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

// A goroutine lane that crashes (PanicCrashesLane) is restarted; the Idempotent calls it held
// run again on the new incarnation, the others settle with WORKER_CRASHED.
func TestCrashedGoroutineLaneRestartsAndReRunsIdempotentCalls(t *testing.T) {
	var events []knit.Event
	var mu sync.Mutex
	p, err := knit.NewPool(knit.Config{Lanes: 1, PanicCrashesLane: true, OnEvent: func(e knit.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}}, gatedPanic, idemDouble, plainTwice)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	g := newGate()
	crash := gatedPanic.Go(context.Background(), p, g)
	<-g.started
	var idem, plain []*knit.Future[int]
	for i := range 10 {
		idem = append(idem, idemDouble.Go(context.Background(), p, i))
		plain = append(plain, plainTwice.Go(context.Background(), p, i))
	}
	close(g.open)
	if _, err := crash.Wait(); !errors.Is(err, knit.ErrWorkerCrashed) {
		t.Fatalf("crashing call: %v", err)
	}
	for i, f := range idem {
		if v, err := f.Wait(); err != nil || v != 2*i {
			t.Errorf("idempotent call %d: %d, %v", i, v, err)
		}
	}
	for i, f := range plain {
		if v, err := f.Wait(); err != nil && !errors.Is(err, knit.ErrWorkerCrashed) || err == nil && v != 2*i {
			t.Errorf("plain call %d: %d, %v", i, v, err)
		}
	}
	if s := p.Stats().Lanes[0]; s.Incarnation != 1 || s.Restarts != 1 {
		t.Errorf("lane %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	var crashed bool
	for _, e := range events {
		crashed = crashed || e.To == knit.StateCrashed && e.Code == knit.CodeWorkerCrashed && e.Incarnation == 0
	}
	if !crashed {
		t.Errorf("no crashed event: %+v", events)
	}
}
