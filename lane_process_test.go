package knit_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
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
)

// Process lanes (lane_process.go): calls, payloads, errors, lane ends, startup failures, shared
// memory, spares, crash reports, and what a pool leaves behind.

func TestProcessCalls(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2})
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	addConcurrently(t, p, n, 16)
	var done uint64
	for _, l := range p.Stats().Lanes {
		done += l.Completed
		if l.PID == 0 || l.PID == os.Getpid() {
			t.Fatalf("lane %d has pid %d", l.Lane, l.PID)
		}
	}
	if done != uint64(n) {
		t.Fatalf("lanes completed %d, want %d", done, n)
	}
}

func TestProcessPayloadTiers(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	for _, size := range []int{0, 1, 24, 25, 512, 513, 64 << 10, 2 << 20} {
		in := bytes.Repeat([]byte{byte(size)}, size)
		for i := range in {
			in[i] ^= byte(i)
		}
		out, err := echo.Call(context.Background(), p, in)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("%d bytes: got %d bytes, %v", size, len(out), err)
		}
	}
	// Over the per-call maximum: refused before anything is published.
	big := make([]byte, 4<<20+1)
	if _, err := echo.Call(context.Background(), p, big); !errors.Is(err, knit.ErrPayloadTooLarge) {
		t.Fatalf("over the maximum: %v", err)
	}
}

func TestProcessPayloadLimits(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Payload: knit.Payload{Arena: 64 << 10, MaxCall: 1000}})
	if _, err := echo.Call(context.Background(), p, make([]byte, 1001)); !errors.Is(err, knit.ErrPayloadTooLarge) {
		t.Fatalf("over MaxCall: %v", err)
	}
	if out, err := echo.Call(context.Background(), p, make([]byte, 1000)); err != nil || len(out) != 1000 {
		t.Fatalf("at MaxCall: %d, %v", len(out), err)
	}
}

func TestProcessErrors(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	ctx := context.Background()
	_, err := fail.Call(ctx, p, "bad input")
	if !errors.Is(err, knit.ErrTaskError) || !strings.Contains(err.Error(), "bad input") {
		t.Fatalf("task error: %v", err)
	}
	_, err = boom.Call(ctx, p, "kaboom")
	if !errors.Is(err, knit.ErrTaskPanic) || !strings.Contains(err.Error(), "kaboom") {
		t.Fatalf("panic: %v", err)
	}
	if _, err := coded.Call(ctx, p, 0); !errors.Is(err, knit.ErrOverloaded) || !strings.Contains(err.Error(), "try later") {
		t.Fatalf("coded task error did not keep its code: %v", err)
	}
	msg, err := nestedPool.Call(ctx, p, 0)
	if err != nil || !strings.Contains(msg, "inside a knit lane") {
		t.Fatalf("NewPool in a lane: %q, %v", msg, err)
	}
	if sum, err := add.Call(ctx, p, [2]int64{2, 3}); err != nil || sum != 5 {
		t.Fatalf("lane did not keep serving: %d, %v", sum, err)
	}
}

func TestProcessCancelReachesLane(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	ctx, cancel := context.WithCancel(context.Background())
	f := sleepy.Go(ctx, p, 0)
	cancel()
	if _, err := f.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	// The lane was interrupted through its abort bit: it serves the next call.
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil || sum != 2 {
		t.Fatalf("after cancel: %d, %v", sum, err)
	}
}

func TestProcessEnvironmentScrubbed(t *testing.T) {
	t.Setenv("KNIT_TEST_PASSED", "yes")
	t.Setenv("SECRET_TOKEN", "hunter2")
	t.Setenv("ALLOWED", "ok")
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{Env: []string{"ALLOWED", "SET=1"}}})
	env, err := environ.Call(context.Background(), p, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(env, "\n")
	for _, want := range []string{"KNIT_TEST_PASSED=yes", "ALLOWED=ok", "SET=1", "KNIT_LANE=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("lane environment lacks %s", want)
		}
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KNIT_") && name != "ALLOWED" && name != "SET" && name != "PATH" && name != "GORACE" {
			t.Errorf("lane environment carries %s", name)
		}
	}
}

// held starts calls that stay in the lane until it dies.
func held(ctx context.Context, p *knit.Pool, n int) []*knit.Future[int] {
	var futs []*knit.Future[int]
	for range n {
		futs = append(futs, sleepy.Go(ctx, p, 0))
	}
	return futs
}

// runningCall starts a running call and returns once it runs on its lane.
func runningCall(t *testing.T, ctx context.Context, p *knit.Pool) *knit.Future[int] {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "running")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	f := running.Go(ctx, p, fifo)
	fifoRead(t, fifo, "a running call starting") // returns once the task has written
	return f
}

// expectRedispatched checks that calls queued behind a call that ended its lane did not
// fail with the lane's code (they had not started: they ran again on the restarted lane),
// then cancels them.
func expectRedispatched(t *testing.T, cancel context.CancelFunc, futs []*knit.Future[int]) {
	t.Helper()
	for i, f := range futs {
		select {
		case <-f.Done():
			_, err := f.Wait()
			t.Errorf("call %d, which had not started, settled with %v; want it run again", i, err)
		default:
		}
	}
	cancel()
	for i, f := range futs {
		// Cancelled, on the restarted lane; or, if its context ended before the dead lane's
		// calls were sorted, failed with the lane's code — as a call that had not started.
		_, err := f.Wait()
		var ke *knit.Error
		if !errors.Is(err, context.Canceled) && (!errors.As(err, &ke) || ke.Started) {
			t.Errorf("call %d settled with %v after its cancellation", i, err)
		}
	}
}

// A SIGKILL costs only the call that was running: it fails with WORKER_CRASHED naming the
// signal (Started), the calls behind it run again on the restarted lane.
func TestProcessKilledMidCall(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1}, running, sleepy, add)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := runningCall(t, ctx, p)
	futs := held(ctx, p, 40)
	pid := p.Stats().Lanes[0].PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err := first.Wait()
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed || !strings.Contains(err.Error(), "SIGKILL") || !ke.Started {
		t.Fatalf("the running call settled with %v, want WORKER_CRASHED naming SIGKILL, started", err)
	}
	// The calls that had not started wait on the restarted lane until they are cancelled.
	expectRedispatched(t, cancel, futs)
	// The supervisor restarts the lane; the next call waits for it.
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil || sum != 5 {
		t.Fatalf("call after the restart: %d, %v", sum, err)
	}
	if s := p.Stats().Lanes[0]; s.Incarnation != 1 || s.PID == pid || s.PID == 0 {
		t.Fatalf("lane after the restart: %+v (killed pid %d)", s, pid)
	}
}

func TestProcessLaneEnds(t *testing.T) {
	cases := []struct {
		name string
		call func(p *knit.Pool) *knit.Future[int]
		code knit.Code
		want string
	}{
		{"os.Exit(3)", func(p *knit.Pool) *knit.Future[int] { return exit3.Go(context.Background(), p, 3) },
			knit.CodeWorkerExited, "exit status 3"},
		{"unrecoverable panic", func(p *knit.Pool) *knit.Future[int] { return goPanic.Go(context.Background(), p, "lost") },
			knit.CodeWorkerCrashed, "panic: lost"},
		{"memory fault", func(p *knit.Pool) *knit.Future[int] { return fault.Go(context.Background(), p, 0) },
			knit.CodeWorkerCrashed, "fault"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ending := tc.call(p)
			others := held(ctx, p, 5) // queued behind the call that ends the lane
			_, err := ending.Wait()
			var ke *knit.Error
			if !errors.As(err, &ke) || ke.Code != tc.code || !strings.Contains(err.Error(), tc.want) || !ke.Started {
				t.Fatalf("err = %v, want %s mentioning %q, started", err, tc.code, tc.want)
			}
			expectRedispatched(t, cancel, others)
			if _, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil {
				t.Fatalf("call after the restart: %v", err)
			}
		})
	}
}

func TestProcessStartupFailures(t *testing.T) {
	cases := []struct {
		name string
		cfg  knit.Config
		want string
	}{
		{"fingerprint mismatch", knit.Config{Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_VARIANT=mismatch"}}}, "fingerprint mismatch"},
		{"unknown task", knit.Config{Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_VARIANT=missing"}}}, `unknown task "test.variant"`},
		{"panic during init", knit.Config{Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_VARIANT=initpanic"}}}, "init failed on purpose"},
		{"mapping failure", knit.Config{Process: knit.ProcessConfig{Prefix: []string{"sh", "-c", `exec "$@" 3<&-`, "sh"}}}, "knit/shm"},
		{"not a knit lane", knit.Config{Process: knit.ProcessConfig{Command: []string{"true"}}}, "exited before ready: exit status 0"},
		{"startup timeout", knit.Config{StartupTimeout: 50 * time.Millisecond, Process: knit.ProcessConfig{Command: []string{"sleep", "60"}}}, "not ready within"},
		{"no such binary", knit.Config{Process: knit.ProcessConfig{Command: []string{filepath.Join(t.TempDir(), "nothing")}}}, "spawn"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Runtime, cfg.Lanes, cfg.Logger = knit.Process, 2, quiet()
			p, err := knit.NewPool(cfg, variant, add)
			if err == nil {
				p.Close(context.Background())
				t.Fatal("NewPool succeeded")
			}
			if !errors.Is(err, knit.ErrWorkerStartupFailed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want WORKER_STARTUP_FAILED mentioning %q", err, tc.want)
			}
		})
	}
}

func TestProcessNamedSharedMemory(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Process: knit.ProcessConfig{SharedMemory: knit.Named}})
	if out, err := echo.Call(context.Background(), p, bytes.Repeat([]byte("x"), 5000)); err != nil || len(out) != 5000 {
		t.Fatalf("echo over a named mapping: %d, %v", len(out), err)
	}
	knit.AwaitSpares(p) // a spare's rendezvous lives until it has connected
	if names := shmNames(t); len(names) != 0 {
		t.Fatalf("named mappings still linked while the pool runs: %v", names)
	}
}

func TestProcessPrefix(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{Prefix: []string{"nice", "-n", "5"}}})
	if sum, err := add.Call(context.Background(), p, [2]int64{20, 22}); err != nil || sum != 42 {
		t.Fatalf("through a prefix: %d, %v", sum, err)
	}
}

func TestProcessGroupDiesWithLane(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Env: []string{"PATH"}}})
	pid, err := spawnChild.Call(context.Background(), p, 0)
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(pidfd)
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A pidfd becomes readable when its process exits: wait for that event.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("the lane's child %d outlived the lane (poll %d, %v)", pid, n, err)
		}
		break
	}
}

func TestProcessCloseLeavesNothing(t *testing.T) {
	before := shmNames(t)
	for _, mode := range []knit.SharedMemoryMode{knit.Inherit, knit.Named} {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Process: knit.ProcessConfig{SharedMemory: mode}}, add)
		if err != nil {
			t.Fatal(err)
		}
		pids := []int{}
		for _, l := range p.Stats().Lanes {
			pids = append(pids, l.PID)
		}
		if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		for _, pid := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				t.Errorf("lane process %d still exists after Close (zombie or alive)", pid)
			}
		}
		if s := p.Stats(); s.Lanes[0].State != knit.StateClosed || s.Lanes[0].Completed+s.Lanes[1].Completed != 1 {
			t.Errorf("stats after Close: %+v", s.Lanes)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(maps, []byte("knit-lane")) || bytes.Contains(maps, []byte("/dev/shm/knit-")) {
		t.Error("a lane region is still mapped after Close")
	}
	if after := shmNames(t); len(after) > len(before) {
		t.Errorf("named mappings left in /dev/shm: %v", after)
	}
	if kids := children(t); len(kids) > 0 {
		t.Errorf("child processes left after Close: %v", kids)
	}
}

func TestProcessStartsQuickly(t *testing.T) {
	// Not a timing assertion: a pool of 4 process lanes comes up and serves.
	p := newProcessPool(t, knit.Config{Lanes: 4})
	var futs []*knit.Future[int64]
	for i := range 4 {
		futs = append(futs, add.Go(context.Background(), p, [2]int64{int64(i), 0}))
	}
	for i, f := range futs {
		if v, err := f.Wait(); err != nil || v != int64(i) {
			t.Fatalf("call %d: %d, %v", i, v, err)
		}
	}
}

// TestProcessCorruptResultKillsLane plays a broken lane: it maps a live lane's region from
// outside (through /proc), publishes a result slot naming a function that does not exist and
// rings the host's doorbell. The host must kill that lane with a clear error, settle what it
// held, and keep running.
func TestProcessCorruptResultKillsLane(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), Balancer: knit.FirstIdle})
	stuck := sleepy.Go(context.Background(), p, 0) // lane 0 is busy and publishes nothing
	pid := p.Stats().Lanes[0].PID
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/3", pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mp, err := shm.MapFile(f)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	region, err := fastpath.OpenRegion(mp.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	// Once the call runs, the lane's end fails it; before, it would run again on lane 1
	// and sleep there for good.
	for region.Running().Load()&1 == 0 {
		time.Sleep(time.Millisecond)
	}
	forge := region.Returns().Producer()
	slot, ok := forge.Reserve()
	if !ok {
		t.Fatal("no free result slot to forge")
	}
	forge.Slot(slot).SetFn(60_000)
	forge.Publish(slot)
	// Ring the completion doorbell, an eventfd only reachable by copying it out of the lane.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	bell, err := unix.PidfdGetfd(pidfd, 4, 0)
	if err != nil {
		t.Skipf("pidfd_getfd: %v", err)
	}
	defer unix.Close(bell)
	if _, err := unix.Write(bell, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	_, err = stuck.Wait()
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed || ke.Lane != 0 || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("held call settled with %v, want WORKER_CRASHED for a corrupt ring on lane 0", err)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("the other lane stopped serving: %d, %v", sum, err)
	}
}

// TestCloseAfterBurstAcknowledged: Close right after a burst of calls on two process lanes
// sees both lanes acknowledge their stop request. (A reaper idling while another lingered
// over every lane's results missed its own lane's acknowledgement, and Close reported the
// lane as killed.)
func TestCloseAfterBurstAcknowledged(t *testing.T) {
	for k := range 3 {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		f := add.Go(context.Background(), p, [2]int64{1, 1})
		for i := range 200 {
			if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 7}); err != nil || sum != int64(i)+7 {
				t.Fatalf("add %d: %d, %v", i, sum, err)
			}
		}
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("pool %d: Close: %v", k, err)
		}
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
	// Error() is one line a client may see (TestCrashErrorKeepsStackOut checks the fields).
	if msg := err.Error(); !strings.Contains(msg, "fatal error: fault") || strings.Contains(msg, ".go:") {
		t.Errorf("crash error is not one line without source paths: %q", msg)
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

// TestNamedLaneBehindClosingWrapper: a Named lane behind a wrapper that closes inherited
// descriptors boots, serves and restarts (from a spare behind the same wrapper), though the
// Go runtime holds some of fds 3 to 5 in it by then (its cgroup files, its netpoller): the
// lane serves from wherever its descriptors came instead of closing the runtime's files to
// put them on 3 to 5 (replacing the netpoller's epoll descriptor is fatal at its next poll).
// Its region is still sealed against resizing.
func TestNamedLaneBehindClosingWrapper(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{
		SharedMemory: knit.Named,
		Prefix:       []string{"sh", "-c", `exec 3>&- 4>&- 5>&- 6>&-; exec "$@"`, "sh"},
	}}, add, truncOwnRegion)
	events := p.Events()
	check := func(when string) {
		t.Helper()
		if sum, err := add.Call(context.Background(), p, [2]int64{40, 2}); err != nil || sum != 42 {
			t.Fatalf("%s: call: %d, %v", when, sum, err)
		}
		if got, err := truncOwnRegion.Call(context.Background(), p, 0); err != nil || got != unix.EPERM.Error() {
			t.Fatalf("%s: ftruncate of the lane's region: %q, %v; want %q", when, got, err, unix.EPERM.Error())
		}
	}
	check("first boot")
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for e := range events {
		if e.Lane == 0 && e.Incarnation == 1 && e.To == knit.StateReady {
			break
		}
	}
	check("after the restart")
}

// A process lane's region is unmapped once it has ended. A caller whose spin outlived the
// lane reads whether the lane was woken (slowWake), and a node submitting a call reads
// whether it polls (polling): both must find the region gone, not read it (TestChaos
// crashed the host with a fault in slowWake).
func TestEndedLaneWakeStateIsNotRead(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	if got, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil || got != 5 {
		t.Fatalf("add: %v, %v", got, err)
	}
	slow, polling := knit.ReadsOfAnEndedLane(p, 0)
	if !slow || polling {
		t.Fatalf("an ended lane: slowWake %v, polling %v; want true, false", slow, polling)
	}
}
