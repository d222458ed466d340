package knit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/knitgo/knit"
)

// The pool (pool.go): NewPool, dispatch (a full pool, BlockWhenFull, balancers, FailFast),
// Close, its methods in any order, and its loggers.

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
	if _, err := knit.NewPool(knit.Config{}); !errors.Is(err, knit.ErrInvalidArgument) {
		t.Errorf("NewPool with no tasks: %v, want INVALID_ARGUMENT", err)
	}
	p := newPool(t, knit.Config{Lanes: 1})
	if _, err := unserved.Call(context.Background(), p, 1); !errors.Is(err, knit.ErrUnknownTask) {
		t.Errorf("task not in the pool: %v, want UNKNOWN_TASK", err)
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

func TestNewPoolNilTask(t *testing.T) {
	var none *knit.Task[int, int]
	for name, tasks := range map[string][]knit.Definition{
		"nil":       {add, nil},
		"typed nil": {none},
		"zero Task": {&knit.Task[int, int]{}},
	} {
		_, err := knit.NewPool(knit.Config{Lanes: 1}, tasks...)
		wantCode(t, name, err, knit.CodeInvalidArgument)
		if !strings.Contains(err.Error(), "nil") {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// Every exported method, in orders a user might call them — futures settled and unsettled,
// Close twice, calls after Close — neither panics a lane nor hangs Close.
func TestAPIInAnyOrder(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Logger: quiet(), StopAckTimeout: 10 * time.Second}, add, sleepy)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			unsettled := sleepy.Go(ctx, p, 0)
			if !unsettled.Pending() {
				t.Fatal("a blocked call's future is settled")
			}
			select {
			case <-unsettled.Done():
				t.Fatal("Done closed for a blocked call")
			default:
			}
			settled := add.Go(context.Background(), p, [2]int64{1, 2})
			if v, err := settled.Wait(); err != nil || v != 3 {
				t.Fatalf("Wait: %d, %v", v, err)
			}
			if v, err := settled.Wait(); err != nil || v != 3 || settled.Pending() {
				t.Fatalf("second Wait: %d, %v", v, err)
			}
			<-settled.Done()
			_ = p.Stats()
			_ = p.PID()
			_ = p.Events()
			if _, err := add.Call(context.Background(), p, [2]int64{2, 2}); err != nil {
				t.Fatal(err)
			}
			cancel()
			if _, err := unsettled.Wait(); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled future: %v", err)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := add.Call(context.Background(), p, [2]int64{1, 1}); !errors.Is(err, knit.ErrPoolClosed) {
				t.Errorf("call after Close: %v", err)
			}
			if _, err := add.Go(context.Background(), p, [2]int64{1, 1}).Wait(); !errors.Is(err, knit.ErrPoolClosed) {
				t.Errorf("Go after Close: %v", err)
			}
			if s := p.Stats(); !s.Closed {
				t.Errorf("Stats after Close: %+v", s)
			}
			for range p.Events() { // closed by Close
			}
		})
	}
}

// With FailFast, a call that finds every lane in crash-loop backoff fails at once with
// POOL_UNAVAILABLE; without it, it waits within its context; either way the pool serves
// again once the lanes boot.
func TestFailFastWhileEveryLaneBacksOff(t *testing.T) {
	for _, failFast := range []bool{true, false} {
		bootFail := filepath.Join(t.TempDir(), "bootfail")
		if err := os.WriteFile(bootFail, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("KNIT_TEST_BOOTFAIL", bootFail)
		t.Setenv("KNIT_TEST_BOOTFAIL_ANY", "1")
		rec := newRecorder()
		p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: rec.record,
			FailFast: failFast, Process: knit.ProcessConfig{Spares: -1},
			Restart: knit.Restart{MaxRestarts: 1, Period: time.Hour,
				Backoff: knit.Backoff{Min: time.Millisecond, Max: time.Millisecond, CrashLoopMax: time.Millisecond, Jitter: -1}}}, supTasks...)
		if err != nil {
			t.Fatal(err)
		}
		_ = syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL)
		first := rec.await(t, "crash-loop backoff", func(e knit.Event) bool { return e.To == knit.StateCrashLoopBackoff })
		ctx, cancel := context.WithCancel(context.Background())
		if !failFast { // the call waits through more backoffs: only its context ends it
			go func() {
				rec.await(t, "more backoffs", func(e knit.Event) bool {
					return e.To == knit.StateCrashLoopBackoff && e.Incarnation >= first.Incarnation+3
				})
				cancel()
			}()
		}
		_, err = add.Call(ctx, p, [2]int64{1, 2})
		cancel()
		switch {
		case failFast && !errors.Is(err, knit.ErrPoolUnavailable):
			t.Errorf("fail fast: %v, want POOL_UNAVAILABLE", err)
		case !failFast && !errors.Is(err, context.Canceled):
			t.Errorf("waiting call: %v, want its context's end", err)
		}
		if err := os.Remove(bootFail); err != nil {
			t.Fatal(err)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation > 0 })
		if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
			t.Errorf("call once the lane boots: %v", err)
		}
		_ = p.Close(context.Background())
	}
}

// Every namespace but steal says something at Debug, on the host and in process lanes (whose
// lines the host re-emits under the same names).
func TestDebugNamespaces(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			ready := make(chan knit.Event, 8)
			// Generous timeouts: a loaded machine must not turn the stop into a kill, or a
			// spare's start into a failure, and so change what is logged.
			p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: rt, PanicCrashesLane: true, Logger: zap.New(core),
				StopAckTimeout: time.Hour, StartupTimeout: time.Hour,
				OnEvent: func(e knit.Event) {
					if e.To == knit.StateReady {
						ready <- e
					}
				}}, procTasks...)
			if err != nil {
				t.Fatal(err)
			}
			<-ready
			call := func() {
				t.Helper()
				if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
					t.Fatalf("call: %d, %v", sum, err)
				}
			}
			call()
			// End the first incarnation on its own, so that a restart follows.
			if rt == knit.Process {
				knit.AwaitSpares(p) // the restart takes the spare
				if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			} else if _, err := boom.Call(context.Background(), p, "crash the lane"); err == nil {
				t.Fatal("a panicking call succeeded")
			}
			if e := <-ready; e.Incarnation != 1 {
				t.Fatalf("ready event %+v, want incarnation 1", e)
			}
			call()
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}

			var seen []string
			for _, e := range logs.All() {
				if e.Level == zapcore.DebugLevel {
					seen = append(seen, e.LoggerName+": "+e.Message)
				}
			}
			want := []string{
				"knit.lifecycle: pool started",
				"knit.codec: task codecs",
				"knit.fastpath: region created",
				"knit.lane: stop requested",
				"knit.lane: stop acknowledged",
				"knit.lane: lane ended",
			}
			if rt == knit.Process {
				want = append(want,
					"knit.lane: lane process started",
					"knit.lane: spare process assigned",
					"knit.lane: lane process reaped",
					// from the lane processes
					"knit.lifecycle: lane ready",
					"knit.fastpath: region mapped",
					"knit.codec: tasks resolved",
					"knit.fastpath: rings fenced",
				)
			} else {
				want = append(want, "knit.lane: lane goroutine started", "knit.fastpath: queue sealed")
			}
			for _, w := range want {
				if !slices.Contains(seen, w) {
					t.Errorf("no Debug entry %q; got %q", w, seen)
				}
			}
		})
	}
}

// Process lanes log Debug entries when the host's logger would take them.
func TestLaneDebugFollowsHostLogger(t *testing.T) {
	info, _ := observer.New(zapcore.InfoLevel)
	debug, _ := observer.New(zapcore.DebugLevel)
	cases := []struct {
		env    string
		logger *zap.Logger
		want   string
	}{
		{"", nil, ""},
		{"lane, codec", nil, "codec,lane"},
		{"*", nil, "*"},
		{"lane", zap.New(info), ""},
		{"", zap.New(debug), "*"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q/%v", tc.env, tc.logger != nil), func(t *testing.T) {
			t.Setenv("KNIT_DEBUG", tc.env)
			p, err := knit.NewPool(knit.Config{Lanes: 1, Logger: tc.logger}, add)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			if got := knit.LaneDebug(p); got != tc.want {
				t.Errorf("lanes get KNIT_DEBUG=%q, want %q", got, tc.want)
			}
		})
	}
}

// A logger the application named knit already gives knit.lifecycle, not knit.knit.lifecycle,
// and every entry names the pool (Config.Name).
func TestLoggerNames(t *testing.T) {
	for _, base := range []string{"", "knit", "app.knit", "app"} {
		core, logs := observer.New(zapcore.DebugLevel)
		logger := zap.New(core)
		if base != "" {
			logger = logger.Named(base)
		}
		p, err := knit.NewPool(knit.Config{Name: "thumbs", Lanes: 1, Logger: logger}, add)
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Close(context.Background())
		want := "knit.lifecycle"
		if base != "" && base != "knit" && base != "app.knit" {
			want = base + ".knit.lifecycle"
		} else if base == "app.knit" {
			want = "app.knit.lifecycle"
		}
		var names []string
		for _, e := range logs.All() {
			if e.LoggerName == want && e.ContextMap()["pool"] == "thumbs" {
				return
			}
			names = append(names, e.LoggerName)
		}
		t.Errorf("logger %q: no entry from %s naming pool thumbs; names %v", base, want, names)
	}
}

// TestStoppedFromOutside: after an application stops or poisons the pool's actor
// (Pool.PID, in its own ActorSystem), calls fail with POOL_CLOSED, Stats says why, every
// lane process ends, and Close returns at once.
func TestStoppedFromOutside(t *testing.T) {
	for _, poison := range []bool{false, true} {
		sys := actor.NewActorSystem()
		ev := newRecorder()
		p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, ActorSystem: sys, Logger: quiet(), OnEvent: ev.record}, add, sleepy)
		if err != nil {
			t.Fatal(err)
		}
		held := sleepy.Go(context.Background(), p, 0) // never finishes on its own
		var pids []int
		for _, l := range p.Stats().Lanes {
			pids = append(pids, l.PID)
		}
		if poison {
			sys.Root.Poison(p.PID())
		} else {
			sys.Root.Stop(p.PID())
		}
		for lane := range 2 {
			ev.await(t, fmt.Sprintf("lane %d closed", lane), func(e knit.Event) bool { return e.Lane == lane && e.To == knit.StateClosed })
		}
		if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); !errors.Is(err, knit.ErrPoolClosed) {
			t.Errorf("a call after the stop: %v, want POOL_CLOSED", err)
		}
		if _, err := held.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
			t.Errorf("the held call: %v, want THREAD_CLOSED", err)
		}
		if s := p.Stats(); !s.Failed || !strings.Contains(s.Failure, "stopped from outside") {
			t.Errorf("Stats: Failed %v, Failure %q", s.Failed, s.Failure)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				t.Errorf("lane process %d outlived Close", pid)
			}
		}
		sys.Shutdown()
	}
}

// In a process pool with the default LaneSpin, LeastLoaded gives the calls of a quick task
// to the lanes that spin (the lowest GOMAXPROCS-1) until each holds what it runs in 40 µs, or
// 1024 calls of a tiny task, while the lanes that park at once hold none: a parked lane
// costs the host a wake-up per batch it is given. The next call goes to a parked lane.
// (Calls queued behind a running one do not move: MoveQueuedAfter would move them after
// 100 ms, which a loaded machine can take to submit them.)
func TestLeastLoadedFillsSpinningLanesFirst(t *testing.T) {
	spinning := runtime.GOMAXPROCS(0) - 1
	if spinning < 1 {
		t.Skip("with one P no lane spins")
	}
	p := newProcessPool(t, knit.Config{Lanes: spinning + 1, MoveQueuedAfter: -1, Logger: quiet()}, sleepy)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var futures []*knit.Future[int]
	inFlight := func() []int {
		var n []int
		for _, l := range p.Stats().Lanes {
			n = append(n, l.InFlight)
		}
		return n
	}
	// A quick task (its pace known): the spinning lanes take what they run in 40 µs, or,
	// for a tiny task, what a caller submits meanwhile.
	for _, pace := range []time.Duration{time.Microsecond, 100 * time.Nanosecond} {
		knit.SetTaskPace(p, sleepy, pace)
		share := knit.SpinnerFor(pace)
		if share == 0 {
			t.Fatalf("a pace of %v takes no calls on a spinning lane", pace)
		}
		for len(futures) < share*spinning {
			futures = append(futures, sleepy.Go(ctx, p, 0))
		}
		got := inFlight()
		for i, n := range got {
			if want := map[bool]int{true: share, false: 0}[i < spinning]; n != want {
				t.Errorf("pace %v: after %d calls, lanes hold %v: want %d on each spinning lane, none on the last", pace, len(futures), got, share)
				break
			}
		}
	}
	futures = append(futures, sleepy.Go(ctx, p, 0))
	if got := inFlight(); got[spinning] != 1 {
		t.Errorf("after %d calls, lanes hold %v: want the next on the lane that parks", len(futures), got)
	}
	cancel()
	for _, f := range futures {
		if _, err := f.Wait(); !errors.Is(err, context.Canceled) {
			t.Errorf("a call ended with %v, want CANCELED", err)
		}
	}
}

// A task whose pace is not known, or slower than a wake-up, is spread by queue depth: a
// burst of calls that sleep does not queue on the spinning lanes while another lane parks.
func TestLeastLoadedSpreadsSlowTasks(t *testing.T) {
	spinning := runtime.GOMAXPROCS(0) - 1
	if spinning < 1 {
		t.Skip("with one P no lane spins")
	}
	for _, pace := range []time.Duration{0, 40 * time.Microsecond} {
		t.Run(fmt.Sprint("pace=", pace), func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: spinning + 1, MoveQueuedAfter: -1, Logger: quiet()}, sleepy)
			knit.SetTaskPace(p, sleepy, pace)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var futures []*knit.Future[int]
			for range 8 * (spinning + 1) {
				futures = append(futures, sleepy.Go(ctx, p, 0))
			}
			for _, l := range p.Stats().Lanes {
				if l.InFlight != 8 {
					t.Errorf("lane %d holds %d of %d calls: want 8 on each", l.Lane, l.InFlight, len(futures))
				}
			}
			cancel()
			for _, f := range futures {
				if _, err := f.Wait(); !errors.Is(err, context.Canceled) {
					t.Errorf("a call ended with %v, want CANCELED", err)
				}
			}
		})
	}
}

// The balancer learns a task's pace from what its process lanes report.
func TestTaskPaceLearned(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("with one P no lane spins: the pool keeps no pace")
	}
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet()}, add)
	if got := knit.TaskPace(p, add); got != 0 {
		t.Fatalf("pace before any call: %v, want 0", got)
	}
	for i := range 100 {
		if _, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil {
			t.Fatal(err)
		}
	}
	if got := knit.TaskPace(p, add); got <= 0 || got >= time.Second {
		t.Errorf("pace after 100 calls: %v, want a running time", got)
	}
}
