package knit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/internal/shm"
)

// Hostile lanes (docs/process-lanes.md, "Threat model"): each test runs a task (tasks_test.go)
// that misbehaves on purpose from inside a real lane process — it freezes, forges results,
// truncates or scribbles over its region, floods its output, lies at boot, storms the
// doorbells — or plays a stranger at a lane's rendezvous, or a spare that freezes. Each test
// asserts that the host survives, that no caller receives a value its lane did not compute
// for it, that every call settles (calls without a deadline included: the watchdog bounds
// them), the codes, and that nothing leaks: child processes, /dev/shm names, goroutines
// (through TestMain's goleak), and for the later tests descriptors and mappings too.

// A frozen lane is found by the watchdog: a call without a deadline settles, the lane is
// killed as unresponsive and restarted, and Close returns.
func TestFrozenLaneIsKilled(t *testing.T) {
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), OnEvent: rec.record, Liveness: 300 * time.Millisecond}, freeze, add)
	_, err := freeze.Call(context.Background(), p, 0) // no deadline
	if !errors.Is(err, knit.ErrWorkerUnresponsive) {
		t.Fatalf("call on a frozen lane: %v, want %s", err, knit.CodeUnresponsive)
	}
	e := rec.await(t, "frozen lane ended", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	if e.Code != knit.CodeUnresponsive {
		t.Errorf("frozen lane ended with %s (%s)", e.Code, e.Reason)
	}
	rec.await(t, "frozen lane back", func(x knit.Event) bool {
		return x.Lane == e.Lane && x.To == knit.StateReady && x.Incarnation > e.Incarnation
	})
	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
}

// Close with a busy frozen lane returns: the watchdog ends the lane it waits for.
func TestCloseWithFrozenLane(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: quiet(), Liveness: 300 * time.Millisecond}, freeze)
	if err != nil {
		t.Fatal(err)
	}
	f := freeze.Go(context.Background(), p, 0)
	_ = p.Close(context.Background())
	if _, err := f.Wait(); err == nil {
		t.Error("the frozen call succeeded")
	}
}

// A lane whose doorbell is gone still has its results collected (the watchdog polls the
// return rings).
func TestLostDoorbell(t *testing.T) {
	// The default Liveness (the watchdog polls every second): a short one on a loaded
	// machine can kill the lane as unresponsive, failing a call.
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), CallerSpin: -1}, closeBell)
	for range 3 {
		if v, err := closeBell.Call(context.Background(), p, 0); err != nil || v != 7 {
			t.Fatalf("call after the doorbell was replaced: %d, %v", v, err)
		}
	}
}

// A result a lane writes for a call it does not hold settles nothing: the forging lane is
// killed, the call's own lane answers it, and no caller sees a forged value.
func TestForgedResultForAnotherLanesCall(t *testing.T) {
	gate := t.TempDir() + "/gate"
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), OnEvent: rec.record, Balancer: knit.RoundRobin}, forgeOther, victim)
	v := victim.Go(context.Background(), p, gate) // held by one lane, waiting
	var forgeErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, forgeErr = forgeOther.Call(context.Background(), p, victimIndex(t, p)) })
	crashed := rec.await(t, "forging lane killed", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	fifoWrite(t, gate, "opening the victim's gate")
	got, err := v.Wait()
	if err != nil || got != 42 {
		t.Fatalf("victim call: %d, %v (want its own lane's 42)", got, err)
	}
	wg.Wait()
	_ = forgeErr // the forger's own call settles with its lane's end
	for _, e := range rec.events(1 - crashed.Lane) {
		if e.To == knit.StateCrashed {
			t.Errorf("the innocent lane %d was killed: %v", 1-crashed.Lane, e)
		}
	}
}

// victimIndex is the victim task's registry index, as the lanes see it.
func victimIndex(t *testing.T, p *knit.Pool) uint32 {
	t.Helper()
	return knit.TaskIndex(victim)
}

// HardTimeout holds when the caller gives up first: the lane that keeps running the call
// is killed at the hard deadline, and the next calls are served.
func TestHardTimeoutAfterCallerGaveUp(t *testing.T) {
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), OnEvent: rec.record}, overrun, add)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := overrun.Call(ctx, p, 0); !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("overrunning call: %v", err)
	}
	e := rec.await(t, "lane killed at the hard deadline", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	if e.Code != knit.CodeWorkerCrashed {
		t.Errorf("lane ended with %s (%s)", e.Code, e.Reason)
	}
	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
}

// TestHostileTruncate: ftruncate of the region from the lane fails with EPERM in both
// shared-memory modes, and the host keeps serving from that very lane.
func TestHostileTruncate(t *testing.T) {
	for _, mode := range []knit.SharedMemoryMode{knit.Inherit, knit.Named} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{SharedMemory: mode}}, hostileTasks...)
			pid := p.Stats().Lanes[0].PID
			for _, size := range []int64{0, 4096, 1 << 30} {
				got, err := truncRegion.Call(context.Background(), p, size)
				if err != nil || got != unix.EPERM.Error() {
					t.Fatalf("ftruncate(region, %d) in the lane: %q, %v; want %q", size, got, err, unix.EPERM.Error())
				}
			}
			for i := range 100 { // the host touches every part of the region again
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i)+1 {
					t.Fatalf("call %d after the attempts: %d, %v", i, sum, err)
				}
			}
			if s := p.Stats().Lanes[0]; s.PID != pid || s.Incarnation != 0 {
				t.Fatalf("the lane was replaced: %+v (was pid %d)", s, pid)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t)
		})
	}
}

// gateCore is a zap core whose sink blocks for the lane's stderr lines until open is closed,
// like a full pipe nobody reads. It reports the first blocked write on blocked, and the
// relay's drop reports on drops.
type gateCore struct {
	zapcore.LevelEnabler
	open, blocked chan struct{}
	once          sync.Once
	drops         chan uint64
}

func (c *gateCore) With([]zapcore.Field) zapcore.Core { return c }
func (c *gateCore) Sync() error                       { return nil }
func (c *gateCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *gateCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if e.LoggerName == "knit.lane" && e.Message == "lane stderr" {
		c.once.Do(func() { close(c.blocked) })
		<-c.open
	}
	if strings.HasPrefix(e.Message, "lane output: lines dropped") {
		for _, f := range fields {
			if f.Key == "dropped" {
				c.drops <- uint64(f.Integer)
			}
		}
	}
	return nil
}

// TestHostileOutputBlockedSink: a lane writing megabytes to stderr while the host's log sink
// blocks forever keeps serving, Close returns, and the dropped lines are reported.
func TestHostileOutputBlockedSink(t *testing.T) {
	core := &gateCore{LevelEnabler: zap.InfoLevel, open: make(chan struct{}), blocked: make(chan struct{}), drops: make(chan uint64, 16)}
	opened := false
	defer func() {
		if !opened {
			close(core.open)
		}
	}()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: zap.New(core)}, hostileTasks...)
	if err != nil {
		t.Fatal(err)
	}
	// A deadline only so that a regression fails instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const lines = 50_000 // 5 MB: far more than a pipe holds
	for i := range 3 {
		if n, err := spew.Call(ctx, p, lines); err != nil || n != lines {
			t.Fatalf("spew %d with the sink blocked: %d, %v", i, n, err)
		}
	}
	<-core.blocked
	if sum, err := add.Call(ctx, p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("call with the sink blocked: %d, %v", sum, err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return while the log sink blocked")
	}
	checkNoLeaks(t)
	// The sink unblocks: the relay writes what it queued and reports what it dropped.
	opened = true
	close(core.open)
	var dropped uint64
	for dropped == 0 {
		select {
		case n := <-core.drops:
			dropped += n
		case <-ctx.Done():
			t.Fatal("dropped lines were not reported")
		}
	}
}

// TestHostileScribbleAfterReady: a lane that was ready, then rewrote its boot word, fatal
// message and whole control block and exited, is a lane that exited — not one that failed
// to start — and its text does not reach the error.
func TestHostileScribbleAfterReady(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, hostileTasks...)
	_, err := scribble.Call(context.Background(), p, 5)
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerExited || !strings.Contains(err.Error(), "exit status 5") {
		t.Fatalf("err = %v, want WORKER_EXITED with exit status 5", err)
	}
	if strings.Contains(err.Error(), "forged") {
		t.Fatalf("the region's fatal area of a ready lane reached the error: %v", err)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 2}); err != nil || sum != 4 {
		t.Fatalf("after the restart: %d, %v", sum, err)
	}
}

// TestHostileBootMessage: a lane that fails its boot with control characters and bulk in its
// fatal message and on stderr produces a one-line, printable, bounded error.
func TestHostileBootMessage(t *testing.T) {
	obs, logs := observer.New(zap.DebugLevel)
	_, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: zap.New(obs),
		Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_HOSTILE_BOOT=1"}}}, add)
	if !errors.Is(err, knit.ErrWorkerStartupFailed) {
		t.Fatalf("err = %v, want WORKER_STARTUP_FAILED", err)
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\n\x1b\t") || !strings.Contains(msg, `\x1b[31mforged\nWARN knit.lifecycle fake line\xff`) || len(msg) > 8192 {
		t.Fatalf("error not cleaned or not bounded (%d bytes): %.300q", len(msg), msg)
	}
	for _, e := range logs.All() {
		for _, s := range append([]string{e.Message}, stringFields(e)...) {
			if strings.ContainsAny(s, "\n\x1b") {
				t.Fatalf("log entry %q carries raw control characters: %.200q", e.Message, s)
			}
		}
	}
	checkNoLeaks(t)
}

func stringFields(e observer.LoggedEntry) []string {
	var out []string
	for _, f := range e.Context {
		if f.Type == zapcore.StringType {
			out = append(out, f.String)
		}
	}
	return out
}

// observerCore is a core that enables every level and keeps what it gets (hooks run only for
// entries their core enables).
func observerCore() zapcore.Core {
	core, _ := observer.New(zap.DebugLevel)
	return core
}

// TestHelperBlockedStderrHost is not a test: TestHostStderrBlocked runs the test binary as a
// host with knit's default logger, whose stderr is a pipe nobody reads.
func TestHelperBlockedStderrHost(t *testing.T) {
	if os.Getenv("KNIT_TEST_BLOCKED_STDERR_HOST") == "" {
		t.Skip("helper process only")
	}
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1}, hostileTasks...)
	if err != nil {
		fmt.Println("NewPool:", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for range 3 {
		if _, err := spew.Call(context.Background(), p, 50_000); err != nil {
			fmt.Println("spew:", err)
			return
		}
	}
	fmt.Println("served")
	fmt.Println("closed:", p.Close(ctx))
}

// TestHostStderrBlocked: a host whose stderr nobody reads serves a lane that writes megabytes
// to its stderr, and closes.
func TestHostStderrBlocked(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperBlockedStderrHost$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_TEST_BLOCKED_STDERR_HOST=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe() // the helper's stderr: never read
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd.Stderr = w
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines, done := make(chan string), make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	timeout := time.After(2 * time.Minute) // a regression fails instead of hanging
	for _, want := range []string{"served", "closed: <nil>"} {
		select {
		case got, ok := <-lines:
			if !ok || got != want {
				t.Fatalf("helper host said %q (open %v), want %q", got, ok, want)
			}
		case <-timeout:
			t.Fatalf("the helper host hung before %q with its stderr blocked", want)
		}
	}
}

// More hostile lanes: a lane that scribbles over its whole region while calls are in
// flight, forges results for its own calls, storms the doorbells, and spares that freeze.
// These tests also check what the process holds against a baseline taken before the pool.

// leakBaseline is what a test's process had before its pool: descriptors, mappings of lane
// regions, goroutines.
type leakBaseline struct {
	fds        map[string]string
	maps       int
	goroutines goleak.Option
}

func takeBaseline(t *testing.T) leakBaseline {
	t.Helper()
	return leakBaseline{fds: openFDs(t), maps: regionMappings(t), goroutines: goleak.IgnoreCurrent()}
}

// openFDs maps this process's descriptors to what they are.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	dir := "/proc/self/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fds := map[string]string{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		fds[e.Name()] = target
	}
	return fds
}

// regionMappings counts this process's mappings of lane regions.
func regionMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:knit-lane")
}

// check fails t if anything the pools made since the baseline is left once they are closed:
// child processes, /dev/shm names, descriptors, region mappings, goroutines. A process being
// reaped, or a pipe being closed behind it, is waited for, within a bound.
func (b leakBaseline) check(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var left []string
	for {
		left = left[:0]
		if kids := children(t); len(kids) > 0 {
			left = append(left, "child processes "+strings.Join(kids, " "))
		}
		if names := shmNames(t); len(names) > 0 {
			left = append(left, "/dev/shm names "+strings.Join(names, " "))
		}
		for fd, target := range openFDs(t) {
			if b.fds[fd] != target {
				left = append(left, "descriptor "+fd+" -> "+target)
			}
		}
		if n := regionMappings(t); n > b.maps {
			left = append(left, strconv.Itoa(n-b.maps)+" region mappings")
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("left after Close: %s", strings.Join(left, "; "))
	}
	goleak.VerifyNone(t, b.goroutines)
}

// ended matches a lane's end by the host or on its own.
func ended(e knit.Event) bool { return e.To == knit.StateCrashed || e.To == knit.StateExited }

// settle waits for f within a bound far beyond the watchdog's, so that a call that would
// hang fails the test instead.
func settle[T any](t *testing.T, what string, f *knit.Future[T]) (T, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Wait()
	case <-time.After(time.Minute):
		t.Fatalf("%s did not settle", what)
		panic("unreachable")
	}
}

// TestHostileScribbleWholeRegion: a lane writes random bytes over all of its region, again
// and again, while calls run on every lane. The host kills it (a corrupt ring, or a
// heartbeat that stood still), callers of that lane get its coded end or a correct value,
// the other lanes serve on untouched, and the lane comes back.
func TestHostileScribbleWholeRegion(t *testing.T) {
	for _, mode := range []knit.SharedMemoryMode{knit.Inherit, knit.Named} {
		t.Run(mode.String(), func(t *testing.T) { scribbleWholeRegion(t, mode) })
	}
}

func scribbleWholeRegion(t *testing.T, mode knit.SharedMemoryMode) {
	base := takeBaseline(t)
	rec := newRecorder()
	// The default Liveness: a short one on a loaded machine can kill an innocent lane as
	// unresponsive, which this test asserts never happens.
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 3, Logger: quiet(), OnEvent: rec.record,
		Balancer: knit.RoundRobin,
		Process:  knit.ProcessConfig{Env: quickExit, SharedMemory: mode}}, moreHostileTasks...)
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served atomic.Int64
	var mu sync.Mutex
	failedOn := map[int]int{} // lane → calls that failed with its end
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				a, b := rng.Int64N(1<<40), rng.Int64N(1<<40)
				sum, err := add.Call(context.Background(), p, [2]int64{a, b}) // no deadline
				var ke *knit.Error
				switch {
				case err == nil && sum == a+b:
					served.Add(1)
				case err == nil:
					t.Errorf("add(%d, %d) = %d: a value its lane did not compute", a, b, sum)
					return
				case errors.As(err, &ke) && (ke.Code == knit.CodeWorkerCrashed || ke.Code == knit.CodeUnresponsive):
					mu.Lock()
					failedOn[ke.Lane]++
					mu.Unlock()
				default:
					t.Errorf("add(%d, %d): %v", a, b, err)
					return
				}
			}
		})
	}
	_, err = settle(t, "the scribbling call", scribbleAll.Go(context.Background(), p, seed))
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed && ke.Code != knit.CodeUnresponsive {
		close(stop)
		wg.Wait()
		t.Fatalf("scribbling call: %v, want WORKER_CRASHED or WORKER_UNRESPONSIVE", err)
	}
	bad := ke.Lane
	end := rec.await(t, "scribbling lane killed", func(e knit.Event) bool { return e.Lane == bad && ended(e) })
	if end.Code != knit.CodeWorkerCrashed && end.Code != knit.CodeUnresponsive {
		t.Errorf("scribbling lane ended %s (%s), want killed by the host", end.Code, end.Reason)
	}
	t.Logf("scribbling lane %d ended %s (%s)", bad, end.Code, end.Reason)
	rec.await(t, "scribbling lane back", func(e knit.Event) bool {
		return e.Lane == bad && e.To == knit.StateReady && e.Incarnation > end.Incarnation
	})
	// Round robin: these reach every lane, the restarted one included.
	for i := range 30 {
		if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 2}); err != nil || sum != int64(i)+2 {
			t.Errorf("after the restart: %d, %v", sum, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("served %d calls; failed with a lane's end: %v", served.Load(), failedOn)
	for lane, n := range failedOn {
		if lane != bad {
			t.Errorf("%d calls failed with the end of lane %d, which did not scribble", n, lane)
		}
	}
	for lane := range 3 {
		for _, e := range rec.events(lane) {
			if lane != bad && ended(e) {
				t.Errorf("innocent lane %d ended: %+v", lane, e)
			}
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	base.check(t)
}

// forgeModes are the ways forgeOwn breaks the protocol with results for its own call. All
// but "outcome" make the host kill the lane as corrupt.
var forgeModes = []string{"tag", "offset", "arena-end", "length", "inline-length", "function", "unserved",
	"other-task", "generation", "abort-bit", "abort-range", "duplicate", "outcome"}

// TestHostileForgedOwnResults: a lane writes results for its own call with a bad tag, offset
// or length, an unknown or unserved function, another task, the wrong generation, an abort
// bit it does not hold, an unknown outcome, or twice. The lane is killed as corrupt, its
// caller gets a coded error or a value that lane returned for that very call, calls queued
// behind it are served, and the other lane is untouched.
func TestHostileForgedOwnResults(t *testing.T) {
	base := takeBaseline(t)
	rec := newRecorder()
	// The default Liveness: nothing here waits for the heartbeat, and a short one on a loaded
	// machine killed the innocent lane as unresponsive (301 ms without a beat).
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), OnEvent: rec.record,
		Balancer: knit.FirstIdle, Restart: eager, Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) }) // a failure must not leave lanes to later tests
	for _, mode := range forgeModes {
		for _, cancellable := range []bool{false, true} {
			mark := rec.mark()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if cancellable { // the call holds an abort bit
				ctx, cancel = context.WithCancel(ctx)
			}
			f := forgeOwn.Go(ctx, p, mode)
			// Calls queued on the forging lane behind it, and calls on the other lane.
			var adds []*knit.Future[int64]
			for i := range 8 {
				adds = append(adds, add.Go(context.Background(), p, [2]int64{int64(i), 100}))
			}
			v, err := settle(t, mode+" forging call", f)
			cancel()
			var ke *knit.Error
			switch {
			case err == nil && (v == 42 || v == 666 && mode == "duplicate"):
				// its lane's own answer for this call
			case err == nil:
				t.Errorf("%s: forging call returned %d", mode, v)
			case errors.As(err, &ke) && ke.Code == knit.CodeWorkerCrashed:
			default:
				t.Errorf("%s: forging call: %v, want WORKER_CRASHED", mode, err)
			}
			e := rec.awaitFrom(t, mark, mode+": forging lane killed", ended)
			for i, a := range adds {
				sum, err := settle(t, mode+" add", a)
				var ke *knit.Error
				switch {
				case err == nil && sum == int64(i)+100:
				case err == nil && sum == 666 && mode == "other-task":
					// The forged result named an add call the forging lane held (record
					// ids are per task): a lane answers the calls it holds as it likes.
				case errors.As(err, &ke) && ke.Code == knit.CodeWorkerCrashed && ke.Lane == e.Lane && ke.Started:
					// it had started on the forging lane when the host killed it
				default:
					t.Errorf("%s: add %d: %d, %v", mode, i, sum, err)
				}
			}
			if mode == "outcome" {
				if err == nil || !strings.Contains(err.Error(), "lane broke the protocol") {
					t.Errorf("%s: forging call: %v, want WORKER_CRASHED, lane broke the protocol", mode, err)
				}
			} else if e.Code != knit.CodeWorkerCrashed || !strings.Contains(e.Reason, "corrupt ring") {
				t.Errorf("%s: forging lane ended %s (%s), want WORKER_CRASHED, corrupt ring", mode, e.Code, e.Reason)
			}
			rec.awaitFrom(t, mark, mode+": forging lane back", func(x knit.Event) bool {
				return x.Lane == e.Lane && x.To == knit.StateReady && x.Incarnation > e.Incarnation
			})
			for _, x := range rec.events(1 - e.Lane) {
				if ended(x) {
					t.Errorf("%s: the innocent lane ended: %+v", mode, x)
				}
			}
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	base.check(t)
}

// TestHostileDoorbellStorm: a lane rings the host's completion eventfd, wakes every futex word
// of its region, flips the completion arm word and rewrites its ring words, as fast as it can.
// The other lane serves calls meanwhile, no call settles before its lane answers it, the
// storming call gets its own answer, and no lane is killed.
func TestHostileDoorbellStorm(t *testing.T) {
	for _, spin := range []time.Duration{0, -1} { // the default, and callers that park at once
		t.Run("spin="+spin.String(), func(t *testing.T) {
			base := takeBaseline(t)
			rec := newRecorder()
			p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), OnEvent: rec.record,
				Liveness: time.Second, Balancer: knit.FirstIdle, CallerSpin: spin, Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			fifos := [2]string{dir + "/started", dir + "/gate"}
			for _, f := range fifos {
				if err := syscall.Mkfifo(f, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f := storm.Go(context.Background(), p, fifos) // lane 0: FirstIdle
			fifoRead(t, fifos[0], "the storming call starting")
			for i := range 200 { // on lane 1, the idle one
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 7}); err != nil || sum != int64(i)+7 {
					t.Fatalf("add %d during the storm: %d, %v", i, sum, err)
				}
			}
			if !f.Pending() {
				v, err := f.Wait()
				t.Fatalf("the storming call settled before its lane answered: %d, %v", v, err)
			}
			fifoWrite(t, fifos[1], "opening the storming call's gate")
			if v, err := settle(t, "the storming call", f); err != nil || v != 42 {
				t.Fatalf("storming call: %d, %v; want its own 42", v, err)
			}
			for i := range 20 { // both lanes again
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i)+1 {
					t.Fatalf("add %d after the storm: %d, %v", i, sum, err)
				}
			}
			for lane := range 2 {
				for _, e := range rec.events(lane) {
					if ended(e) {
						t.Errorf("lane %d ended: %+v", lane, e)
					}
				}
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			base.check(t)
		})
	}
}

// TestHostileFrozenSpare: a spare stopped (SIGSTOP) while it waits is never assigned — the
// restart spawns or takes another — and is killed; a spare that freezes once taken, before
// it reports ready, is given up within Liveness (WORKER_STARTUP_FAILED) and the next restart
// brings the lane back. Nothing is left.
func TestHostileFrozenSpare(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		base := takeBaseline(t)
		rec := newRecorder()
		// The default Liveness: a restart on a loaded machine may take longer than a short one
		// to report ready, and this test asserts that no restart fails.
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), OnEvent: rec.record,
			Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		knit.AwaitSpares(p)
		spares := p.Stats().Spares
		if len(spares) != 1 {
			t.Fatalf("spares %v, want one", spares)
		}
		frozen := spares[0]
		if err := syscall.Kill(frozen, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitState(t, frozen, "stopped", func(s byte) bool { return s == 'T' })
		if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation >= 1 })
		if pid := p.Stats().Lanes[0].PID; pid == frozen {
			t.Fatalf("the restart took the frozen spare %d", frozen)
		}
		if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
			t.Fatalf("after the restart: %d, %v", sum, err)
		}
		for _, e := range rec.events(0) {
			if e.To == knit.StateStartupFailed {
				t.Errorf("a restart failed: %+v", e)
			}
		}
		waitState(t, frozen, "killed and reaped", func(s byte) bool { return s == 0 })
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		base.check(t)
	})
	t.Run("taken", func(t *testing.T) {
		base := takeBaseline(t)
		rec := newRecorder()
		marker := t.TempDir() + "/froze"
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), OnEvent: rec.record,
			Liveness: 300 * time.Millisecond, Process: knit.ProcessConfig{Env: append([]string{"KNIT_TEST_SPARE_FREEZE=" + marker}, quickExit...)}},
			moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		knit.AwaitSpares(p)
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("the spare did not take the freezing part: %v", err)
		}
		// No deadline: the call waits for a lane through the failed restart.
		f := add.Go(context.Background(), p, [2]int64{2, 3})
		if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if sum, err := settle(t, "the call across restarts", f); err != nil && !errors.Is(err, knit.ErrWorkerCrashed) || err == nil && sum != 5 {
			t.Fatalf("call across the restarts: %d, %v", sum, err)
		}
		e := rec.await(t, "frozen spare given up", func(e knit.Event) bool { return e.To == knit.StateStartupFailed })
		if e.Code != knit.CodeStartupFailed || e.Incarnation != 1 {
			t.Errorf("the restart on the frozen spare ended %+v, want WORKER_STARTUP_FAILED of incarnation 1", e)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation >= 2 })
		if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
			t.Fatalf("after the restarts: %d, %v", sum, err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		base.check(t)
	})
}

// waitState waits, within a bound, until process pid's state (the letter in /proc/PID/stat;
// 0 once it is gone) satisfies ok.
func waitState(t *testing.T, pid int, what string, ok func(byte) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state byte
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
				state = b[i+2]
			}
		}
		if ok(state) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not %s (state %q)", pid, what, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// Strangers at a lane's rendezvous (SharedMemory Named, issue 29): whoever connects first,
// only the lane gets its region, and the host waits for it.

// gatedPrefix is a Prefix that prints "spawned" (the rendezvous exists by then: it is made
// before the lane is spawned) and starts the lane only once a line can be read from the
// FIFO fifo: a test connects to the rendezvous meanwhile.
func gatedPrefix(t *testing.T) (prefix []string, open func()) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	open = func() {
		once.Do(func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // blocks until the prefix reads
			if err != nil {
				t.Error(err)
				return
			}
			f.WriteString("go\n")
			f.Close()
		})
	}
	return []string{"sh", "-c", `echo spawned; read -r _ < "$0"; exec "$@"`, fifo}, open
}

// TestNamedStrangerConnectsFirst: a process that is not the lane (here the test itself)
// connects to a lane's rendezvous before the lane does, with a key of its own making. It
// receives nothing, the host logs the refusal at Warn, and the lane, connecting after, gets
// its region: NewPool succeeds and the pool serves.
func TestNamedStrangerConnectsFirst(t *testing.T) {
	spawned, refusedCh := make(chan struct{}), make(chan struct{})
	var once, refusedOnce sync.Once
	// Hooks run after the observer core has kept the entry.
	hook := zap.Hooks(func(e zapcore.Entry) error {
		switch {
		case e.Message == "lane stdout":
			once.Do(func() { close(spawned) })
		case strings.Contains(e.Message, "refused a peer"):
			refusedOnce.Do(func() { close(refusedCh) })
		}
		return nil
	})
	core, logs := observer.New(zap.WarnLevel)
	prefix, release := gatedPrefix(t)
	type result struct {
		p   *knit.Pool
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: zap.New(zapcore.NewTee(core, observerCore()), hook),
			Process: knit.ProcessConfig{SharedMemory: knit.Named, Spares: -1, Prefix: prefix}}, add)
		done <- result{p, err}
	}()
	defer release() // should the test fail before: NewPool's lane must not wait for ever
	<-spawned
	names := shmNames(t)
	if len(names) != 1 {
		t.Fatalf("rendezvous names %v, want one", names)
	}
	if files, err := shm.Collect(filepath.Base(names[0]), strings.Repeat("5a", 32), 2); err == nil {
		for _, f := range files {
			f.Close()
		}
		t.Fatal("a stranger collected the lane's region")
	}
	select {
	case <-refusedCh:
	case r := <-done:
		t.Fatalf("NewPool returned before the refusal was logged: %v", r.err)
	}
	refusal := logs.FilterMessageSnippet("refused a peer").All()[0].ContextMap()
	if refusal["peer_pid"] != int64(os.Getpid()) || !strings.Contains(fmt.Sprint(refusal["error"]), "not lane process") {
		t.Fatalf("the refusal logged %v", refusal)
	}
	release()
	r := <-done
	if r.err != nil {
		t.Fatalf("NewPool after a stranger was refused: %v", r.err)
	}
	if sum, err := add.Call(context.Background(), r.p, [2]int64{40, 2}); err != nil || sum != 42 {
		t.Fatalf("call: %d, %v", sum, err)
	}
	if err := r.p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t)
}

// TestHelperNamedNamespaceHost is not a test: TestNamedStrangerOutsidePidNamespace runs the
// test binary as a host in a pid namespace of its own, with one Named lane behind
// gatedPrefix's script (the FIFO's path in KNIT_TEST_GATE). It prints its log (JSON, Info and
// up), then "served <sum>" and "closed: <error>".
func TestHelperNamedNamespaceHost(t *testing.T) {
	fifo := os.Getenv("KNIT_TEST_GATE")
	if fifo == "" {
		t.Skip("helper process only")
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(os.Stdout), zap.InfoLevel))
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: log, Process: knit.ProcessConfig{
		SharedMemory: knit.Named, Spares: -1,
		Prefix: []string{"sh", "-c", `echo spawned; read -r _ < "$0"; exec "$@"`, fifo},
		// A host in a pid namespace of its own cannot tell other hosts' cgroups from dead
		// ones' (their pids mean nothing here): it must not sweep them.
		Limits: knit.Limits{Cgroup: knit.CgroupOff},
	}}, add)
	if err != nil {
		fmt.Println("NewPool:", err)
		return
	}
	sum, err := add.Call(context.Background(), p, [2]int64{40, 2})
	fmt.Println("served", sum, err)
	fmt.Println("closed:", p.Close(context.Background()))
}

// bootOf reads the boot record from process pid's environment (as root can: the stranger
// below may read the key of every process it can see).
func bootOf(pid int) (name, key string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", "", false
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, found := strings.CutPrefix(kv, "KNIT_BOOT="); found {
			var rec struct {
				Shm    string `json:"shm"`
				ShmKey string `json:"shm_key"`
			}
			if json.Unmarshal([]byte(v), &rec) == nil && rec.Shm != "" {
				return rec.Shm, rec.ShmKey, true
			}
		}
	}
	return "", "", false
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parent := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		me, _ := strconv.Atoi(strings.Split(s, "/")[2])
		if len(f) > 1 {
			parent[me], _ = strconv.Atoi(f[1])
		}
	}

	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestNamedStrangerOutsidePidNamespace is issue 29's case: the host runs in a pid namespace
// of its own (a container sharing /dev/shm with others of its user) and a stranger outside
// it — this test — connects to its lane's rendezvous first, the kernel reporting its pid as
// 0. The stranger is refused even with the lane's key (which, as root in the parent
// namespace, it reads from the lane's environment), and without it; the lane, connecting
// after, is served.
func TestNamedStrangerOutsidePidNamespace(t *testing.T) {

	unshare, err := exec.LookPath("unshare")
	if err == nil {
		err = exec.Command(unshare, "--pid", "--fork", "--mount-proc", "true").Run()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("unshare --pid --mount-proc cannot run here: %v", err)
		}
		t.Skipf("unshare --pid --mount-proc cannot run here (needs util-linux, and root or user namespaces): %v", err)
	}
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// --mount-proc: the host's /proc must show its own pid namespace, which its peer check
	// walks.
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child", "--mount-proc",
		exe, "-test.run=^TestHelperNamedNamespaceHost$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_TEST_GATE="+fifo)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	timeout := time.After(2 * time.Minute) // a regression fails instead of hanging
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the helper host ended before %s", what)
			}
			return l
		case <-timeout:
			t.Fatalf("the helper host said nothing of %s", what)
		}
		return ""
	}
	var said []string
	for l := next("its lane's spawn"); !strings.Contains(l, `"spawned"`); l = next("its lane's spawn") {
		said = append(said, l)
	}
	var name, key string
	for _, pid := range descendants(cmd.Process.Pid) {
		if n, k, ok := bootOf(pid); ok {
			name, key = n, k
		}
	}
	if name == "" || len(key) != 64 {
		t.Fatalf("no lane of the helper host carries a rendezvous (%q, %q)", name, key)
	}
	for _, k := range []string{strings.Repeat("5a", 32), key} {
		if files, err := shm.Collect(name, k, 2); err == nil {
			for _, f := range files {
				f.Close()
			}
			t.Fatalf("a stranger outside the host's pid namespace collected the lane's region (its key right: %v)", k == key)
		}
	}
	gate, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(gate, "go\n")
	gate.Close()
	refused := false
	for {
		l := next("serving")
		said = append(said, l)
		if strings.Contains(l, "refused a peer") && strings.Contains(l, `"peer_pid":0`) &&
			strings.Contains(l, "not visible here") {
			refused = true
		}
		if strings.HasPrefix(l, "served") || strings.HasPrefix(l, "NewPool:") {
			break
		}
	}
	if !strings.HasPrefix(said[len(said)-1], "served 42 <nil>") {
		t.Fatalf("the helper host:\n%s", strings.Join(said, "\n"))
	}
	if !refused {
		t.Errorf("the helper host logged no refusal of a peer with pid 0:\n%s", strings.Join(said, "\n"))
	}
	if l := next("Close"); l != "closed: <nil>" {
		t.Fatalf("the helper host: %s", l)
	}
}
