// Command knit is knit's command-line tool. Its subcommand demo walks a pool of goroutine
// lanes and a pool of process lanes through their lifecycle — calls, crashes, how each
// crash is classified and how the supervisor restarts the lane — with every step logged
// through zap, and serves the pools' live inspector (inspect.Handler) while it runs;
// inspect shows a running pool's inspector in a terminal.
//
//	go run ./cmd/knit demo
//	go run ./cmd/knit demo -hold              # keep the process pool up for the inspector
//	KNIT_DEBUG=lifecycle,supervisor go run ./cmd/knit demo   # knit's Debug entries too
//	go run ./cmd/knit inspect http://127.0.0.1:PORT/
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/inspect"
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

	// demoGated is Idempotent: a call whose lane dies under it runs again on another lane.
	// It dials the demo's unix socket, says which process it runs in, and waits there for
	// the demo's go-ahead — long enough for the demo to kill its lane. It returns its pid.
	demoGated = knit.Define("demo.gated", func(ctx context.Context, socket string) (int, error) {
		conn, err := net.Dial("unix", socket)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.Close() }) // a cancelled call lets go
		defer stop()
		if _, err := fmt.Fprintln(conn, os.Getpid()); err != nil {
			return 0, err
		}
		if _, err := conn.Read(make([]byte, 1)); err != nil { // the go-ahead
			return 0, err
		}
		return os.Getpid(), nil
	}, knit.Idempotent())
)

const usage = `knit — typed task actors on supervised lanes

Usage:
  knit demo [-addr host:port] [-hold]
               run goroutine lanes, then process lanes, through calls, a panic, lanes that
               exit, crash or are killed, how knit classifies each, and the supervisor
               restarting them; an idempotent call survives the SIGKILL of its lane.
               The pools' live inspector is served on -addr (default 127.0.0.1:0, a free
               port; "off": none), its address logged; -hold keeps the process pool up,
               with a trickle of calls, until Ctrl-C
  knit inspect [-once] [-interval d] URL
               show the pool behind the inspector page at URL, live in a terminal, or one
               snapshot when stdout is not a terminal (or with -once)
  knit help    show this help

KNIT_DEBUG=lifecycle,supervisor,lane (or *) adds knit's Debug entries to the demo's log.
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
	case "inspect":
		ctx, stop := interruptible(context.Background())
		defer stop()
		return inspectCmd(ctx, args[1:], stdout, stderr)
	case "demo":
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.SetOutput(stderr)
		fs.Usage = func() { fmt.Fprint(stderr, usage) }
		var opts demoOptions
		fs.StringVar(&opts.addr, "addr", "127.0.0.1:0", `where to serve the inspector ("off": nowhere)`)
		fs.BoolVar(&opts.hold, "hold", false, "keep the process pool up for the inspector until Ctrl-C")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "knit demo: unexpected arguments %q\n\n%s", fs.Args(), usage)
			return 2
		}
		base, err := newLogger()
		if err != nil {
			fmt.Fprintf(stderr, "knit: logger: %v\n", err)
			return 1
		}
		defer func() { _ = base.Sync() }()
		log := base.Named("demo")
		if err := demo(log, knitLogger(base), opts); err != nil {
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

// knitLogger is the logger the demo gives knit (Config.Logger); knit names it "knit" and
// logs under knit.lifecycle, knit.supervisor, knit.lane… A logger of your own decides
// knit's levels, so this one does what knit's default logger does: Info and above, plus
// Debug for the namespaces KNIT_DEBUG names ("lifecycle,supervisor", or "*").
func knitLogger(base *zap.Logger) *zap.Logger {
	debug := strings.FieldsFunc(os.Getenv("KNIT_DEBUG"), func(r rune) bool { return r == ',' || r == ' ' })
	if len(debug) == 0 {
		return base.WithOptions(zap.IncreaseLevel(zapcore.InfoLevel))
	}
	return base.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return debugFilter{c, debug} }))
}

// debugFilter passes Debug entries only for the loggers named knit.<namespace>[.…].
type debugFilter struct {
	zapcore.Core
	namespaces []string
}

func (f debugFilter) With(fields []zapcore.Field) zapcore.Core {
	return debugFilter{f.Core.With(fields), f.namespaces}
}

func (f debugFilter) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	on := e.Level >= zapcore.InfoLevel || slices.ContainsFunc(f.namespaces, func(ns string) bool {
		name := "knit." + strings.ToLower(ns)
		return ns == "*" || e.LoggerName == name || strings.HasPrefix(e.LoggerName, name+".")
	})
	if !on {
		return ce
	}
	return f.Core.Check(e, ce)
}

// stopAck is how long a lane has to acknowledge Close's stop request (default 50ms). The
// demo is generous so that a busy CI machine does not fail it; lanes answer in microseconds.
const stopAck = time.Second

// demoOptions are the demo's flags.
type demoOptions struct {
	addr string // where to serve the inspector; "off": nowhere
	hold bool   // keep the process pool up until Ctrl-C
}

// demo runs the lifecycle walk-through. It returns an error when knit does not behave as
// described, so the demo doubles as a smoke test.
func demo(log, knitLog *zap.Logger, opts demoOptions) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ui, err := serveInspector(log, opts.addr)
	if err != nil {
		return err
	}
	defer ui.close()
	restarts, err := goroutineDemo(ctx, log, knitLog, ui)
	if err != nil {
		return err
	}
	var hold func(*knit.Pool)
	if opts.hold {
		hold = func(p *knit.Pool) { holdPool(log, p, ui.url) }
	}
	procRestarts, err := processDemo(ctx, log, knitLog, ui, hold)
	if err != nil {
		return err
	}
	log.Info("demo done: every lane that failed was classified and restarted, and every expectation held",
		zap.Int("goroutine_restarts", restarts), zap.Int("process_restarts", procRestarts),
		zap.Duration("took", time.Since(start)))
	return nil
}

// goroutineDemo runs calls, a panicking task and a lane exit on goroutine lanes, waits for
// the supervisor to restart the lane that exited, and closes the pool. It returns the
// number of restarts.
func goroutineDemo(ctx context.Context, log, knitLog *zap.Logger, ui *inspectorServer) (int, error) {
	const lanes = 4
	log.Info("pool starting", zap.Int("lanes", lanes), zap.Stringer("runtime", knit.Goroutine))
	// The zero Restart policy: a lane that crashes or exits on its own (Transient) is
	// restarted on its own (OneForOne), at most 5 times in 10s, after 1ms, 2ms, 4ms … 2s.
	pool, err := knit.NewPool(knit.Config{Lanes: lanes, Runtime: knit.Goroutine, Logger: knitLog,
		StopAckTimeout: stopAck}, demoSquare, demoPanic, demoGoexit)
	if err != nil {
		return 0, fmt.Errorf("NewPool: %w", err)
	}
	ui.show(pool)
	closed := false
	defer func() {
		if !closed {
			_ = pool.Close(context.Background())
		}
	}()
	// Every lifecycle transition arrives on pool.Events(), in order (knit logs each one
	// too, under knit.lifecycle): the demo waits on it for restarts, never on a clock.
	events := pool.Events()
	log.Info("pool started", zap.Int("lanes", len(pool.Stats().Lanes)), zap.String("supervisor", pool.PID().Id))
	logStats(log, "lane", pool)

	// 1. A burst of calls: futures first, then a blocking call.
	if err := burst(ctx, log, pool, "burst", 1, 8); err != nil {
		return 0, err
	}

	// 2. A task that panics: its call fails with TASK_PANIC and the lane keeps serving.
	_, err = demoPanic.Call(ctx, pool, "something went wrong")
	var ke *knit.Error
	if !errors.Is(err, knit.ErrTaskPanic) || !errors.As(err, &ke) {
		return 0, fmt.Errorf("panicking task: got %v, want ErrTaskPanic", err)
	}
	first, _, _ := strings.Cut(ke.Error(), "\n") // the rest is the task's stack
	log.Warn("task panicked: the call failed, the lane lives on",
		zap.String("task", ke.Task), zap.Int("lane", ke.Lane), zap.String("code", string(ke.Code)),
		zap.String("error", first))
	st := pool.Stats().Lanes[ke.Lane]
	if st.State != knit.StateReady || st.Failed != 1 || st.Incarnation != 0 {
		return 0, fmt.Errorf("lane %d after the panic: %+v, want ready with one failed call", ke.Lane, st)
	}
	logLane(log, "lane after panic", st)

	// 3. A task that calls runtime.Goexit: its lane's goroutine ends, the call fails, the
	// lane is classified WORKER_EXITED and, being Transient, restarted as incarnation 1.
	_, err = demoGoexit.Call(ctx, pool, 7)
	ke = nil
	if !errors.Is(err, knit.ErrWorkerExited) || !errors.As(err, &ke) {
		return 0, fmt.Errorf("goexit task: got %v, want ErrWorkerExited", err)
	}
	exited := ke.Lane
	log.Warn("lane exited under its call: the call failed",
		zap.String("task", demoGoexit.Name()), zap.Int("lane", exited), zap.String("code", string(ke.Code)),
		zap.String("error", ke.Error()))
	if err := awaitReady(ctx, events, exited, 1); err != nil {
		return 0, err
	}
	st = pool.Stats().Lanes[exited]
	if st.State != knit.StateReady || st.Incarnation != 1 || st.Restarts != 1 {
		return 0, fmt.Errorf("lane %d after its restart: %+v, want ready, incarnation 1, 1 restart", exited, st)
	}
	log.Info("supervisor restarted the lane", zap.Int("lane", exited), zap.Stringer("state", st.State),
		zap.Int("incarnation", st.Incarnation), zap.Int("restarts", st.Restarts))

	// 4. Calls go on over every lane.
	if err := burst(ctx, log, pool, "after the restart", 100, 6); err != nil {
		return 0, err
	}
	logStats(log, "lane", pool)

	// 5. Close: refuse new calls, let calls in flight finish, stop lanes in reverse order.
	log.Info("pool closing")
	closed = true
	if err := pool.Close(ctx); err != nil {
		return 0, fmt.Errorf("Close: %w", err)
	}
	log.Info("pool closed")
	logStats(log, "lane after close", pool)
	if _, err := demoSquare.Call(ctx, pool, 2); errors.Is(err, knit.ErrPoolClosed) {
		log.Info("call after close refused", zap.Error(err))
	} else {
		return 0, fmt.Errorf("call after Close: %v, want ErrPoolClosed", err)
	}
	return totalRestarts(pool), nil
}

// processDemo runs tasks on two process lanes. An Idempotent call waits on lane 0 while a
// task crashes lane 1's process; the supervisor starts a new process for lane 1; then the
// demo SIGKILLs lane 0 under the waiting call, which runs again on the live lane: lane 1's
// new process. It returns the number of restarts.
func processDemo(ctx context.Context, log, knitLog *zap.Logger, ui *inspectorServer, hold func(*knit.Pool)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a knit that misbehaves fails the demo, never hangs it
	defer cancel()
	log.Info("process pool starting", zap.Int("lanes", 2), zap.Stringer("runtime", knit.Process))
	// This time the transitions come through Config.OnEvent, which must not block.
	events := make(chan knit.Event, 256)
	pool, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Logger: knitLog, StopAckTimeout: stopAck,
		Balancer: knit.FirstIdle, // a call goes to the first idle lane: lane 0, else lane 1
		Restart:  knit.Restart{Type: knit.Transient, Strategy: knit.OneForOne, MaxRestarts: 3, Period: 10 * time.Second},
		OnEvent: func(e knit.Event) {
			select {
			case events <- e:
			default: // full: the demo's wait fails, with a clear error, instead of knit stalling
			}
		},
		// A crashing Go lane prints every goroutine's stack; keep the demo's log short.
		Process: knit.ProcessConfig{Env: []string{"GOTRACEBACK=none"}}},
		demoSquare, demoCrash, demoGated)
	if err != nil {
		return 0, fmt.Errorf("NewPool(process): %w", err)
	}
	defer pool.Close(context.Background())
	ui.show(pool)
	first := pool.Stats().Lanes // the lanes' first processes
	for _, l := range first {
		log.Info("process lane ready", zap.Int("lane", l.Lane), zap.Int("pid", l.PID))
	}
	if err := burst(ctx, log, pool, "process lanes", 1, 4); err != nil {
		return 0, err
	}

	// 1. An Idempotent call starts on lane 0, tells the demo its pid over a unix socket and
	// waits there for the demo's go-ahead.
	gate, err := openGate(ctx)
	if err != nil {
		return 0, err
	}
	defer gate.close()
	fut := demoGated.Go(ctx, pool, gate.socket)
	held, err := gate.accept()
	if err != nil {
		return 0, fmt.Errorf("demo.gated: %w", err)
	}
	defer held.conn.Close()
	heldLane := laneOf(pool, held.pid)
	log.Info("idempotent call running, waiting for the demo's go-ahead",
		zap.String("task", demoGated.Name()), zap.Int("lane", heldLane), zap.Int("pid", held.pid))

	// 2. Meanwhile a task crashes the other lane's process: its call fails with
	// WORKER_CRASHED, naming the panic and the exit status, and the supervisor starts a new
	// process for the lane.
	_, err = demoCrash.Call(ctx, pool, 0)
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed {
		return 0, fmt.Errorf("crashing task: got %v, want WORKER_CRASHED", err)
	}
	crashed := ke.Lane
	if crashed == heldLane {
		return 0, fmt.Errorf("demo.crash ran on lane %d, busy with demo.gated", crashed)
	}
	msg, _, _ := strings.Cut(ke.Error(), "\n") // then the lane's stderr tail
	log.Warn("process lane crashed under its call: the call failed, the host lives on",
		zap.Int("lane", crashed), zap.Int("pid", first[crashed].PID), zap.String("code", string(ke.Code)),
		zap.String("error", msg))
	if err := awaitReady(ctx, events, crashed, 1); err != nil {
		return 0, err
	}
	st := pool.Stats().Lanes[crashed]
	if st.State != knit.StateReady || st.Incarnation != 1 || st.Restarts != 1 {
		return 0, fmt.Errorf("lane %d after its restart: %+v, want ready, incarnation 1, 1 restart", crashed, st)
	}
	log.Info("supervisor restarted the process lane", zap.Int("lane", crashed),
		zap.Int("incarnation", st.Incarnation), zap.Int("restarts", st.Restarts))

	// 3. SIGKILL the lane that holds the Idempotent call: the lane is classified
	// WORKER_CRASHED (killed by signal SIGKILL) and the call runs again on a live lane.
	log.Warn("killing the lane under the idempotent call with SIGKILL", zap.Int("lane", heldLane), zap.Int("pid", held.pid))
	if err := syscall.Kill(held.pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill %d: %w", held.pid, err)
	}
	rerun, err := gate.accept()
	if err != nil {
		return 0, fmt.Errorf("demo.gated, run again after the SIGKILL: %w", err)
	}
	defer rerun.conn.Close()
	// The re-run is a call of a lane: Stats knows that lane's current process.
	rerunLane := laneOf(pool, rerun.pid)
	if rerunLane < 0 || slices.ContainsFunc(first, func(l knit.LaneStats) bool { return l.PID == rerun.pid }) {
		return 0, fmt.Errorf("demo.gated ran again in pid %d, want a restarted lane's new process: %+v", rerun.pid, pool.Stats().Lanes)
	}
	log.Info("idempotent call running again, on a restarted lane's new process: letting it finish",
		zap.Int("lane", rerunLane), zap.Int("pid", rerun.pid), zap.Int("old_pid", first[rerunLane].PID),
		zap.Int("incarnation", pool.Stats().Lanes[rerunLane].Incarnation))
	if _, err := rerun.conn.Write([]byte{1}); err != nil {
		return 0, err
	}
	got, err := fut.Wait()
	if err != nil || got != rerun.pid {
		return 0, fmt.Errorf("demo.gated after its lane was killed: %d, %v; want %d, <nil>", got, err, rerun.pid)
	}
	log.Info("idempotent call result: it outlived the lane it started on",
		zap.String("task", demoGated.Name()), zap.Int("killed_pid", held.pid), zap.Int("served_by_pid", got))

	// 4. The killed lane comes back too, and both lanes serve.
	if err := awaitReady(ctx, events, heldLane, 1); err != nil {
		return 0, err
	}
	if err := burst(ctx, log, pool, "after the restarts", 10, 4); err != nil {
		return 0, err
	}
	if hold != nil {
		hold(pool)
		// Holding outlasts the demo's deadline: closing gets a deadline of its own.
		ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
	}
	log.Info("process pool closing")
	if err := pool.Close(ctx); err != nil {
		return 0, fmt.Errorf("Close(process): %w", err)
	}
	log.Info("process pool closed")
	logStats(log, "process lane after close", pool)
	for _, l := range pool.Stats().Lanes {
		// (While the pool was held, someone may have killed lanes to watch the inspector.)
		if hold == nil && (l.Incarnation != 1 || l.Restarts != 1 || l.PID == first[l.Lane].PID) {
			return 0, fmt.Errorf("lane %d at the end: %+v, want incarnation 1, 1 restart, a new pid", l.Lane, l)
		}
	}
	return totalRestarts(pool), nil
}

// laneOf is the lane whose current process is pid, or -1.
func laneOf(pool *knit.Pool, pid int) int {
	return slices.IndexFunc(pool.Stats().Lanes, func(l knit.LaneStats) bool { return l.PID == pid })
}

// gate is where runs of demo.gated report to the demo: a unix socket in a temporary
// directory. Every wait on it ends at ctx's deadline.
type gate struct {
	dir, socket string
	ln          *net.UnixListener
	deadline    time.Time
}

// gatedRun is one run of demo.gated: its connection, and the pid of the lane process it
// runs in.
type gatedRun struct {
	conn net.Conn
	pid  int
}

func openGate(ctx context.Context) (*gate, error) {
	dir, err := os.MkdirTemp("", "knit-demo-")
	if err != nil {
		return nil, err
	}
	g := &gate{dir: dir, socket: filepath.Join(dir, "gate.sock")}
	if g.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: g.socket, Net: "unix"}); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g.deadline, _ = ctx.Deadline()
	_ = g.ln.SetDeadline(g.deadline)
	return g, nil
}

func (g *gate) close() {
	g.ln.Close()
	os.RemoveAll(g.dir)
}

// accept waits for the next run of demo.gated and reads the pid it sends.
func (g *gate) accept() (gatedRun, error) {
	conn, err := g.ln.Accept()
	if err != nil {
		return gatedRun{}, err
	}
	_ = conn.SetDeadline(g.deadline)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err == nil {
		var pid int
		if pid, err = strconv.Atoi(strings.TrimSpace(line)); err == nil {
			return gatedRun{conn: conn, pid: pid}, nil
		}
	}
	conn.Close()
	return gatedRun{}, err
}

// awaitReady reads lifecycle events until lane reports ready as the given incarnation
// (knit logs the transitions on the way: crashed or exited, restarting, booting, ready).
func awaitReady(ctx context.Context, events <-chan knit.Event, lane, incarnation int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return fmt.Errorf("event stream ended before lane %d restarted", lane)
			}
			if e.Lane == lane && e.To == knit.StateReady && e.Incarnation == incarnation {
				return nil
			}
			if e.Lane == lane && e.To == knit.StateDead {
				return fmt.Errorf("the supervisor gave lane %d up: %s", lane, e.Reason)
			}
		case <-ctx.Done():
			return fmt.Errorf("lane %d did not come back as incarnation %d: %w", lane, incarnation, ctx.Err())
		}
	}
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

func totalRestarts(pool *knit.Pool) int {
	n := 0
	for _, l := range pool.Stats().Lanes {
		n += l.Restarts
	}
	return n
}

func logStats(log *zap.Logger, msg string, pool *knit.Pool) {
	for _, l := range pool.Stats().Lanes {
		logLane(log, msg, l)
	}
}

func logLane(log *zap.Logger, msg string, l knit.LaneStats) {
	fields := []zap.Field{zap.Int("lane", l.Lane), zap.Stringer("state", l.State),
		zap.Int("incarnation", l.Incarnation), zap.Int("restarts", l.Restarts)}
	if l.PID != 0 {
		fields = append(fields, zap.Int("pid", l.PID))
	}
	log.Info(msg, append(fields, zap.Int("inflight", l.InFlight), zap.Int("queued", l.Queued),
		zap.Uint64("completed", l.Completed), zap.Uint64("failed", l.Failed))...)
}

// inspectorServer serves the inspector of the demo's current pool.
type inspectorServer struct {
	url     string // "" when not serving
	srv     *http.Server
	current atomic.Pointer[http.Handler]
}

// serveInspector starts an HTTP server on addr for the pools' inspector ("off": none) and
// logs its address.
func serveInspector(log *zap.Logger, addr string) (*inspectorServer, error) {
	s := &inspectorServer{}
	if addr == "off" {
		return s, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("inspector: %w", err)
	}
	s.url = "http://" + ln.Addr().String() + "/"
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	log.Info("inspector serving: open it in a browser, or run knit inspect", zap.String("url", s.url))
	return s, nil
}

// show makes p the pool the inspector shows. Pages and knit inspect, whose streams end
// when the previous pool closes, find the new one when they connect again.
func (s *inspectorServer) show(p *knit.Pool) {
	if s.srv != nil {
		h := inspect.Handler(p)
		s.current.Store(&h)
	}
}

func (s *inspectorServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := s.current.Load()
	if h == nil {
		http.Error(w, "no pool yet", http.StatusServiceUnavailable)
		return
	}
	(*h).ServeHTTP(w, r)
}

// close stops the server. The pools are closed by now, so their streams have ended;
// Shutdown lets a response being written finish.
func (s *inspectorServer) close() {
	if s.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		_ = s.srv.Close()
	}
}

// holdPool keeps p up, serving a call every 100ms, until Ctrl-C or SIGTERM.
func holdPool(log *zap.Logger, p *knit.Pool, url string) {
	ctx, stop := interruptible(context.Background())
	defer stop()
	log.Info("holding the process pool up with a trickle of calls: Ctrl-C ends the demo", zap.String("inspector", url))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for n := int64(0); ; n++ {
		select {
		case <-ctx.Done():
			log.Info("hold ended")
			return
		case <-tick.C:
			if _, err := demoSquare.Call(ctx, p, n); err != nil && ctx.Err() == nil {
				log.Warn("call while holding", zap.Error(err))
			}
		}
	}
}
