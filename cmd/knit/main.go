// Command knit is knit's command-line tool. Today it has one real subcommand, demo, which
// walks a pool of goroutine lanes through its lifecycle with every step logged through zap.
//
//	go run ./cmd/knit demo
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
)

// The demo's tasks. Like every knit task they are defined at package level, so that the
// host and every lane build the same registry during init.
var (
	demoSquare = knit.Define("demo.square", func(_ context.Context, n int64) (int64, error) {
		return n * n, nil
	}, knit.Timeout(time.Second))

	demoPanic = knit.Define("demo.panic", func(_ context.Context, msg string) (string, error) {
		panic(msg)
	})

	demoGoexit = knit.Define("demo.goexit", func(context.Context, int) (int, error) {
		runtime.Goexit() // ends the lane's goroutine: the lane is classified WORKER_EXITED
		return 0, nil
	})

	// demoCrash panics in a goroutine nobody recovers: the Go runtime kills its process lane.
	demoCrash = knit.Define("demo.crash", func(context.Context, int) (int, error) {
		done := make(chan struct{})
		go func() { panic("unrecoverable: nobody catches a goroutine's panic") }()
		<-done
		return 0, nil
	})
)

const usage = `knit — typed task actors on supervised lanes

Usage:
  knit demo    run goroutine lanes through calls, a panic, a lane exit and Close, then
               process lanes through calls and a crash that ends only its own lane
  knit help    show this help
`

func main() {
	knit.Main() // first, always: in a process lane it serves tasks and never returns

	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	case "demo":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "knit demo: unexpected arguments %q\n\n%s", args[1:], usage)
			return 2
		}
		log, err := newLogger()
		if err != nil {
			fmt.Fprintf(stderr, "knit: logger: %v\n", err)
			return 1
		}
		defer func() { _ = log.Sync() }()
		if err := demo(log); err != nil {
			log.Error("demo failed", zap.Error(err))
			return 1
		}
		return 0
	default:
		fmt.Fprintf(stderr, "knit: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// newLogger is a human-readable console logger with times, on stderr.
func newLogger() (*zap.Logger, error) {
	cfg := zap.NewDevelopmentConfig()
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	cfg.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000000")
	return cfg.Build()
}

// demo runs the lifecycle walk-through. It returns an error when knit does not behave as
// described, so the demo doubles as a smoke test.
func demo(log *zap.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const lanes = 4
	log.Info("pool starting", zap.Int("lanes", lanes), zap.Stringer("runtime", knit.Goroutine))
	// knit's own lifecycle logs (info and up) join the demo's timeline.
	libLog := log.Named("knit").WithOptions(zap.IncreaseLevel(zapcore.InfoLevel))
	pool, err := knit.NewPool(knit.Config{Lanes: lanes, Runtime: knit.Goroutine, Logger: libLog},
		demoSquare, demoPanic, demoGoexit)
	if err != nil {
		return fmt.Errorf("NewPool: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = pool.Close(context.Background())
		}
	}()
	log.Info("pool started", zap.Int("lanes", len(pool.Stats().Lanes)))
	logStats(log, "lane", pool)

	// 1. A burst of calls: futures first, then a blocking call.
	if err := burst(ctx, log, pool, "burst", 1, 8); err != nil {
		return err
	}

	// 2. A task that panics: its call fails with TASK_PANIC and the lane keeps serving.
	_, err = demoPanic.Call(ctx, pool, "something went wrong")
	var ke *knit.Error
	if !errors.Is(err, knit.ErrTaskPanic) || !errors.As(err, &ke) {
		return fmt.Errorf("panicking task: got %v, want ErrTaskPanic", err)
	}
	first, _, _ := strings.Cut(ke.Error(), "\n") // the rest is the task's stack
	log.Warn("task panicked: the call failed, the lane lives on",
		zap.String("task", ke.Task), zap.Int("lane", ke.Lane), zap.String("code", string(ke.Code)),
		zap.String("error", first))
	st := pool.Stats().Lanes[ke.Lane]
	if st.State != "ready" || st.Failed != 1 {
		return fmt.Errorf("lane %d after the panic: %+v, want ready with one failed call", ke.Lane, st)
	}
	logLane(log, "lane after panic", st)

	// 3. A task that calls runtime.Goexit: its lane's goroutine ends, the call fails and the
	// lane is classified WORKER_EXITED.
	_, err = demoGoexit.Call(ctx, pool, 7)
	ke = nil
	if !errors.Is(err, knit.ErrWorkerExited) || !errors.As(err, &ke) {
		return fmt.Errorf("goexit task: got %v, want ErrWorkerExited", err)
	}
	exited := ke.Lane
	log.Warn("lane exited: the call failed",
		zap.String("task", demoGoexit.Name()), zap.Int("lane", exited), zap.String("code", string(ke.Code)),
		zap.String("error", ke.Error()))
	st = pool.Stats().Lanes[exited]
	if st.State != strings.ToLower(string(knit.CodeWorkerExited)) {
		return fmt.Errorf("lane %d after runtime.Goexit is %q, want worker_exited", exited, st.State)
	}
	logLane(log, "lane after exit", st)
	restartLane(log, exited, ke.Code)

	// 4. Calls go on: the balancer skips the ended lane.
	if err := burst(ctx, log, pool, "after exit", 100, 6); err != nil {
		return err
	}
	logStats(log, "lane", pool)

	// 5. Close: refuse new calls, let calls in flight finish, stop lanes in reverse order.
	log.Info("pool closing")
	closed = true
	if err := pool.Close(ctx); err != nil {
		return fmt.Errorf("Close: %w", err)
	}
	log.Info("pool closed")
	logStats(log, "lane after close", pool)
	if _, err := demoSquare.Call(ctx, pool, 2); errors.Is(err, knit.ErrPoolClosed) {
		log.Info("call after close refused", zap.Error(err))
	} else {
		return fmt.Errorf("call after Close: %v, want ErrPoolClosed", err)
	}
	return processDemo(ctx, log, libLog)
}

// processDemo runs the same tasks on process lanes: one crashes its process, and only its
// lane dies.
func processDemo(ctx context.Context, log, libLog *zap.Logger) error {
	log.Info("process pool starting", zap.Int("lanes", 2), zap.Stringer("runtime", knit.Process))
	pool, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Logger: libLog,
		Balancer: knit.FirstIdle,
		// A crashing Go lane prints every goroutine's stack; keep the demo's log short.
		Process: knit.ProcessConfig{Env: []string{"GOTRACEBACK=none"}}},
		demoSquare, demoCrash)
	if err != nil {
		return fmt.Errorf("NewPool(process): %w", err)
	}
	defer pool.Close(context.Background())
	for _, l := range pool.Stats().Lanes {
		log.Info("process lane ready", zap.Int("lane", l.Lane), zap.Int("pid", l.PID))
	}
	if err := burst(ctx, log, pool, "process lanes", 1, 4); err != nil {
		return err
	}
	_, err = demoCrash.Call(ctx, pool, 0)
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed {
		return fmt.Errorf("crashing task: got %v, want WORKER_CRASHED", err)
	}
	first, _, _ := strings.Cut(ke.Error(), "\n")
	log.Warn("process lane crashed: classified, its calls settled, the host lives on",
		zap.Int("lane", ke.Lane), zap.String("code", string(ke.Code)), zap.String("error", first))
	restartLane(log, ke.Lane, ke.Code)
	if err := burst(ctx, log, pool, "after the crash", 10, 4); err != nil {
		return err
	}
	logStats(log, "process lane", pool)
	return pool.Close(ctx)
}

// burst starts n demo.square calls as futures, waits for each, then makes one blocking call.
func burst(ctx context.Context, log *zap.Logger, pool *knit.Pool, phase string, from, n int64) error {
	start := time.Now()
	futs := make([]*knit.Future[int64], n)
	for i := range n {
		futs[i] = demoSquare.Go(ctx, pool, from+i)
	}
	for i, f := range futs {
		in := from + int64(i)
		out, err := f.Wait()
		if err != nil || out != in*in {
			return fmt.Errorf("%s: demo.square(%d) = %d, %v", phase, in, out, err)
		}
		log.Info("call result", zap.String("phase", phase), zap.String("task", demoSquare.Name()),
			zap.Int64("in", in), zap.Int64("out", out))
	}
	in := from + n
	out, err := demoSquare.Call(ctx, pool, in)
	if err != nil || out != in*in {
		return fmt.Errorf("%s: demo.square(%d) = %d, %v", phase, in, out, err)
	}
	log.Info("call result (blocking Call)", zap.String("phase", phase), zap.String("task", demoSquare.Name()),
		zap.Int64("in", in), zap.Int64("out", out))
	log.Info("burst done", zap.String("phase", phase), zap.Int64("calls", n+1), zap.Duration("took", time.Since(start)))
	return nil
}

// restartLane is where a supervisor would restart the lane that ended. Supervision
// (DESIGN §7) is being built; until it lands an ended goroutine lane stays ended and the
// pool runs on with the lanes it has left.
func restartLane(log *zap.Logger, lane int, code knit.Code) {
	log.Info("restart: supervision arrives with the supervisor work",
		zap.Int("lane", lane), zap.String("code", string(code)))
}

func logStats(log *zap.Logger, msg string, pool *knit.Pool) {
	for _, l := range pool.Stats().Lanes {
		logLane(log, msg, l)
	}
}

func logLane(log *zap.Logger, msg string, l knit.LaneStats) {
	log.Info(msg, zap.Int("lane", l.Lane), zap.String("state", l.State), zap.Int("inflight", l.InFlight),
		zap.Int("queued", l.Queued), zap.Uint64("completed", l.Completed), zap.Uint64("failed", l.Failed))
}
