package knit_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// Hostile lanes: tasks that attack the host from inside a lane process on purpose. Each test
// asserts that the host survives, the right code, and that nothing leaks (processes, /dev/shm
// names; goroutines through TestMain's goleak).

// hostileText is what a hostile lane writes where the host will read it: a terminal escape
// sequence, a newline that would forge a log line, a byte that is not UTF-8, and bulk.
var hostileText = "\x1b[2J\x1b[31mforged\nWARN\tknit.lifecycle\tfake line\xff" + strings.Repeat("z", 2000)

var (
	// truncRegion resizes the lane's own region file: on an unsealed file, a size of 0 made
	// the host's next access to the region fault with SIGBUS.
	truncRegion = knit.Define("test.hostile.truncate", func(_ context.Context, size int64) (string, error) {
		return fmt.Sprint(unix.Ftruncate(lifecycle.FDRegion, size)), nil
	})
	// spew writes lines to stderr as fast as it can.
	spew = knit.Define("test.hostile.spew", func(_ context.Context, lines int) (int, error) {
		w := bufio.NewWriterSize(os.Stderr, 64<<10)
		line := strings.Repeat("x", 100) + "\n"
		for range lines {
			w.WriteString(line)
		}
		return lines, w.Flush()
	})
	// scribble rewrites the lane's control block — boot word, fatal message, magic, all of
	// it — after the lane was ready, then exits with the given status.
	scribble = knit.Define("test.hostile.scribble", func(_ context.Context, status int) (int, error) {
		r, err := laneRegion()
		if err != nil {
			return 0, err
		}
		r.SetFatal(hostileText)
		r.Boot().Store(fastpath.BootFailed)
		ctrl := r.Bytes()[:1024]
		for i := range ctrl {
			ctrl[i] ^= 0xa5
		}
		os.Exit(status)
		return 0, nil
	})
	// runByName runs a program found through PATH.
	runByName = knit.Define("test.hostile.path", func(_ context.Context, name string) (string, error) {
		out, err := exec.Command(name, "-c", "echo found").Output()
		return strings.TrimSpace(string(out)), err
	})
	// hog allocates n bytes in 1 MiB pieces and keeps them until it returns. In pieces, not in
	// one slice: under RLIMIT_DATA the kernel lets the Go heap map one allocation however large
	// over address space the runtime reserved (see TestProcessPrefixMemoryLimit); growing
	// piece by piece, the runtime maps more metadata, which the limit refuses.
	hog = knit.Define("test.hostile.hog", func(_ context.Context, n int) (int, error) {
		var kept [][]byte
		total := 0
		for total < n {
			b := make([]byte, min(1<<20, n-total))
			kept = append(kept, b)
			total += len(b)
		}
		return total, nil
	})
	hostileTasks = []knit.Definition{add, truncRegion, spew, scribble, runByName, hog, fault}
)

// laneRegion maps the lane's own region a second time, as any code in a lane can.
func laneRegion() (*fastpath.Region, error) {
	fd, err := unix.Dup(lifecycle.FDRegion)
	if err != nil {
		return nil, err
	}
	mp, err := shm.MapFile(os.NewFile(uintptr(fd), "region"))
	if err != nil {
		return nil, err
	}
	return fastpath.OpenRegion(mp.Bytes())
}

// A lane that fails its boot with a hostile message: with KNIT_TEST_HOSTILE_BOOT in its
// environment, it leaves hostileText in its region's fatal area and on stderr, before
// knit.Main runs.
func init() {
	if os.Getenv("KNIT_TEST_HOSTILE_BOOT") == "" || os.Getenv(lifecycle.EnvBoot) == "" {
		return
	}
	r, err := laneRegion()
	if err != nil {
		os.Exit(1)
	}
	r.SetFatal(hostileText)
	fmt.Fprintln(os.Stderr, hostileText)
	os.Exit(lifecycle.ExitBoot)
}

// checkNoLeaks fails t if child processes or /dev/shm names of this process are left.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	if kids := children(t); len(kids) > 0 {
		t.Errorf("child processes left: %v", kids)
	}
	if names := shmNames(t); len(names) > 0 {
		t.Errorf("/dev/shm names left: %v", names)
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

// TestNamedBehindWrapperThatClosesFDs: with SharedMemory Named, a lane behind a wrapper that
// closes every inherited descriptor still gets its region, through the rendezvous.
func TestNamedBehindWrapperThatClosesFDs(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), Process: knit.ProcessConfig{
		SharedMemory: knit.Named,
		Prefix:       []string{"sh", "-c", `exec "$@" 3<&- 4<&- 5<&-`, "sh"},
	}}, hostileTasks...)
	if sum, err := add.Call(context.Background(), p, [2]int64{40, 2}); err != nil || sum != 42 {
		t.Fatalf("call: %d, %v", sum, err)
	}
	if got, err := truncRegion.Call(context.Background(), p, 0); err != nil || got != unix.EPERM.Error() {
		t.Fatalf("ftruncate in the lane: %q, %v", got, err)
	}
	// The spare connects through a rendezvous too; a restart takes it.
	knit.AwaitSpares(p)
	if names := shmNames(t); len(names) != 0 {
		t.Fatalf("rendezvous names outlived the boot: %v", names)
	}
	spares := p.Stats().Spares
	if len(spares) != 1 {
		t.Fatalf("spares %v, want one behind the wrapper", spares)
	}
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for e := range p.Events() {
		if e.Lane == 0 && e.Incarnation == 1 && e.To == knit.StateReady {
			break
		}
	}
	if pid := p.Stats().Lanes[0].PID; pid != spares[0] {
		t.Fatalf("the restart did not take spare %d (lanes %+v)", spares[0], p.Stats().Lanes)
	}
	for range 4 { // round robin: both lanes
		if got, err := truncRegion.Call(context.Background(), p, 0); err != nil || got != unix.EPERM.Error() {
			t.Fatalf("ftruncate after the restart: %q, %v", got, err)
		}
	}
}

// TestHelperNamedHost is not a test: TestSweepAfterHostKilled runs the test binary as a host
// that is killed while its Named lane boots. The lane's prefix prints a line (the rendezvous
// exists by then: it is made before the lane is spawned) and never starts the lane.
func TestHelperNamedHost(t *testing.T) {
	if os.Getenv("KNIT_TEST_NAMED_HOST") == "" {
		t.Skip("helper process only")
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(os.Stdout), zap.InfoLevel))
	_, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: log, StartupTimeout: time.Hour,
		Process: knit.ProcessConfig{SharedMemory: knit.Named, Prefix: []string{"sh", "-c", "echo lane-spawned; exec sleep 3600", "sh"}}}, add)
	t.Fatalf("NewPool returned: %v", err)
}

// startHelperHost runs this test binary's test helper as a child host, with env set
// ("NAME=value"), and returns it and its stdout. The child dies with the test (Pdeathsig).
func startHelperHost(t *testing.T, helper, env string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// TestSweepAfterHostKilled kills a host (SIGKILL) while its Named lanes boot, when its
// rendezvous names exist, and checks that the next process pool removes them.
func TestSweepAfterHostKilled(t *testing.T) {
	cmd, out := startHelperHost(t, "TestHelperNamedHost", "KNIT_TEST_NAMED_HOST=1")
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "lane-spawned") {
	}
	pattern := fmt.Sprintf("/dev/shm/knit-%d-*", cmd.Process.Pid)
	left, _ := filepath.Glob(pattern)
	if len(left) == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the helper host has no rendezvous name (%s) while its lane boots", pattern)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if now, _ := filepath.Glob(pattern); len(now) != 1 {
		t.Fatalf("names of the killed host %v: the test needs its one rendezvous left behind", now)
	}
	// The next process pool sweeps them.
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{SharedMemory: knit.Named}}, add)
	if now, _ := filepath.Glob(pattern); len(now) > 0 {
		t.Fatalf("names of the dead host left after NewPool: %v", now)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if removed, err := knit.SweepSharedMemory(); err != nil || len(removed) > 0 {
		t.Fatalf("a second sweep found %v, %v", removed, err)
	}
	checkNoLeaks(t)
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

// TestProcessCrashReport: a segmentation fault in a lane gives an error naming the signal and
// the faulting goroutine's frames — not another goroutine's — on one line, and console log
// lines with no raw newline; the goroutine dump is logged at Debug only.
func TestProcessCrashReport(t *testing.T) {
	obs, logs := observer.New(zap.DebugLevel)
	var console bytes.Buffer
	var consoleMu sync.Mutex
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	core := zapcore.NewTee(obs, zapcore.NewCore(enc, zapcore.AddSync(lockedWriter{&consoleMu, &console}), zap.DebugLevel))
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: zap.New(core)}, hostileTasks...)
	_, err := fault.Call(context.Background(), p, 0)
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed {
		t.Fatalf("err = %v, want WORKER_CRASHED", err)
	}
	msg := err.Error()
	for _, want := range []string{"fatal error: fault", "[signal SIGSEGV", "[running]:", "process_test.go:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("crash error lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "abortWatch") || strings.Contains(msg, "\n") {
		t.Errorf("crash error is not the faulting goroutine on one line: %q", msg)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	warn, debug := 0, 0
	for _, e := range logs.FilterLoggerName("knit.lane").FilterMessage("lane stderr").All() {
		switch e.Level {
		case zap.WarnLevel:
			warn++
		case zap.DebugLevel:
			debug++
		}
	}
	if warn > 4 || debug < 10 {
		t.Errorf("lane stderr: %d Warn and %d Debug entries; want the dump at Debug", warn, debug)
	}
	consoleMu.Lock()
	defer consoleMu.Unlock()
	entryStart := regexp.MustCompile(`^\d{4}-\d\d-\d\dT`)
	for _, line := range strings.Split(strings.TrimSuffix(console.String(), "\n"), "\n") {
		if !entryStart.MatchString(line) || strings.ContainsRune(line, '\x1b') {
			t.Fatalf("a console log entry spans lines or carries an escape: %q", line)
		}
		if strings.Contains(line, "knit.lifecycle") && strings.Contains(line, `\n`) {
			t.Errorf("a lifecycle console line carries \\n sequences: %s", line)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestProcessKeepsPATH: a task runs a program by name with no Process.Env; the rest of the
// environment is scrubbed as before (TestProcessEnvironmentScrubbed).
func TestProcessKeepsPATH(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skipf("no sh on this host's PATH: %v", err)
	}
	p := newProcessPool(t, knit.Config{Lanes: 1}, hostileTasks...)
	if out, err := runByName.Call(context.Background(), p, "sh"); err != nil || out != "found" {
		t.Fatalf("exec.Command(\"sh\") in a lane: %q, %v", out, err)
	}
	t.Setenv("PATH", "/nonexistent")
	p2 := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Env: []string{"PATH=/nowhere"}}}, hostileTasks...)
	if _, err := runByName.Call(context.Background(), p2, "sh"); err == nil {
		t.Fatal("Process.Env PATH=/nowhere did not replace the host's PATH")
	}
}

// TestProcessPrefixMemoryLimit runs the memory limit docs/process-lanes.md recommends: lanes
// boot and serve under it, and a task whose heap grows past it ends its lane with
// WORKER_OUT_OF_MEMORY (the host serves on).
//
// hog grows the heap a MiB at a time. With one 1.5 GB slice this test failed now and then
// (3 of 16 probe rounds on kernel 6.18): Go reserves heap address space PROT_NONE and maps it
// read-write with MAP_FIXED, which the kernel checks against RLIMIT_DATA net of the pages it
// replaces, so the mapping of the slice always succeeded (strace), and the lane died only if
// something it mapped afterwards was refused. docs/process-lanes.md says so.
func TestProcessPrefixMemoryLimit(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skipf("prlimit is not installed: %v", err)
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a data limit meant for a lane")
	}
	prefix := []string{"prlimit", "--data=1000000000"} // the documented example
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Prefix: prefix}}, hostileTasks...)
	if sum, err := add.Call(context.Background(), p, [2]int64{20, 22}); err != nil || sum != 42 {
		t.Fatalf("under %v: %d, %v", prefix, sum, err)
	}
	if n, err := hog.Call(context.Background(), p, 100<<20); err != nil || n != 100<<20 {
		t.Fatalf("100 MB under %v: %d, %v", prefix, n, err)
	}
	_, err := hog.Call(context.Background(), p, 1500<<20)
	if !errors.Is(err, knit.ErrWorkerOutOfMemory) { // "out of memory" or "cannot allocate memory"
		t.Fatalf("1.5 GB under %v: %v, want WORKER_OUT_OF_MEMORY", prefix, err)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil || sum != 2 {
		t.Fatalf("after the crash: %d, %v", sum, err)
	}
}

// TestProcessSpareStoppedByClose: a spare still initialising when the pool closes is
// stopped quietly: no warning.
func TestProcessSpareStoppedByClose(t *testing.T) {
	obs, logs := observer.New(zap.DebugLevel)
	seen := make(chan struct{})
	var once sync.Once
	hook := zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "lane stdout" {
			once.Do(func() { close(seen) })
		}
		return nil
	})
	// The spare (KNIT_SPARE set) says so on stdout and never initialises; lanes start as usual.
	prefix := []string{"sh", "-c", `if [ -n "$KNIT_SPARE" ]; then echo spare waiting; exec sleep 3600; fi; exec "$@"`, "sh"}
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: zap.New(obs, hook),
		Process: knit.ProcessConfig{Prefix: prefix, Spares: 1}}, add)
	if err != nil {
		t.Fatal(err)
	}
	<-seen
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w := logs.FilterLevelExact(zap.WarnLevel).All(); len(w) > 0 {
		t.Fatalf("Close stopping a spare logged warnings: %v", w)
	}
	if logs.FilterMessageSnippet("spare").FilterLevelExact(zap.DebugLevel).Len() == 0 {
		t.Fatal("the stopped spare was not logged at Debug")
	}
	checkNoLeaks(t)
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
