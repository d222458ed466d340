package knit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

// bounded is the context of a call in these tests: a lane that hangs instead of reaching its
// limit fails the test (at the deadline) rather than the whole suite at its timeout.
func bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newLimitsPool starts a pool of process lanes with limits, or skips the test, saying why,
// when it asks for cgroups this machine cannot give.
func newLimitsPool(t *testing.T, lanes int, l knit.Limits) *knit.Pool {
	t.Helper()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: lanes, Logger: quiet(),
		Process: knit.ProcessConfig{Limits: l}}, limitTasks...)
	if err != nil && l.Cgroup == knit.CgroupRequired && strings.Contains(err.Error(), "cgroups unavailable") {
		t.Skipf("this machine gives no cgroups: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// serving calls add until stop is closed and returns how many calls succeeded, or the first
// error: the other lanes, and the host, must serve on while one lane dies.
func serving(ctx context.Context, p *knit.Pool, stop <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				if n == 0 {
					done <- errors.New("no call was made")
				}
				close(done)
				return
			default:
			}
			if sum, err := add.Call(ctx, p, [2]int64{int64(n), 1}); err != nil || sum != int64(n)+1 {
				done <- fmt.Errorf("call %d: %d, %v", n, sum, err)
				return
			}
			n++
		}
	}()
	return done
}

// testOutOfMemory: a task allocating without bound on a lane limited to 256 MiB ends its lane
// WORKER_OUT_OF_MEMORY while the other lane and the host keep serving.
func testOutOfMemory(t *testing.T, task *knit.Task[int, int], l knit.Limits, mechanisms ...knit.LimitMechanism) {
	p := newLimitsPool(t, 2, l)
	if got := p.Stats().Limits; !slices.Contains(mechanisms, got) {
		t.Fatalf("Stats().Limits = %q, want one of %q", got, mechanisms)
	}
	stop := make(chan struct{})
	others := serving(bounded(t), p, stop)
	_, err := task.Call(bounded(t), p, 0)
	close(stop)
	if !errors.Is(err, knit.ErrWorkerOutOfMemory) || !strings.Contains(err.Error(), "memory limit 256 MiB") {
		t.Fatalf("hoarding under a 256 MiB limit: %v, want WORKER_OUT_OF_MEMORY", err)
	}
	t.Logf("the lane's end: %v", err)
	if err := <-others; err != nil {
		t.Fatalf("the other calls while a lane ran out of memory: %v", err)
	}
	if sum, err := add.Call(bounded(t), p, [2]int64{20, 22}); err != nil || sum != 42 {
		t.Fatalf("after the lane ran out of memory: %d, %v", sum, err)
	}
}

func TestLimitsOutOfMemoryRlimit(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a 256 MiB data limit (RLIMIT_DATA counts it): " +
			".ci/run runs the limits tests without -race too")
	}
	l := knit.Limits{Memory: 256 << 20, Cgroup: knit.CgroupOff}
	t.Run("heap", func(t *testing.T) { testOutOfMemory(t, hoardMem, l, knit.LimitsRlimits) })
	// The Go runtime cannot map heap, or cgo cannot map a new thread's stack
	// ("runtime/cgo: pthread_create failed"): either is out of memory.
	t.Run("heap and threads", func(t *testing.T) { testOutOfMemory(t, hoardThreads, l, knit.LimitsRlimits) })
}

func TestLimitsOutOfMemoryCgroup(t *testing.T) {
	testOutOfMemory(t, hoardMem, knit.Limits{Memory: 256 << 20, Cgroup: knit.CgroupRequired}, knit.LimitsCgroupV1, knit.LimitsCgroupV2)
}

// TestLimitsOpenFiles: a task opening files past the limit gets EMFILE as its own error; the
// lane serves on.
func TestLimitsOpenFiles(t *testing.T) {
	p := newLimitsPool(t, 1, knit.Limits{OpenFiles: 64, Cgroup: knit.CgroupOff})
	n, err := openFiles.Call(bounded(t), p, 100)
	if !errors.Is(err, knit.ErrTaskError) || !strings.Contains(err.Error(), syscall.EMFILE.Error()) {
		t.Fatalf("opening 100 files under a limit of 64: %d, %v; want TASK_ERROR %q", n, err, syscall.EMFILE.Error())
	}
	if n, err := openFiles.Call(bounded(t), p, 20); err != nil || n != 20 {
		t.Fatalf("20 files after that: %d, %v", n, err)
	}
	if ls := p.Stats().Lanes[0]; ls.Restarts != 0 || ls.Incarnation != 0 {
		t.Fatalf("the lane was restarted: %+v", ls)
	}
}

// TestLimitsCPUTime: a lane that uses up its CPU time ends WORKER_CPU_LIMIT; the others
// serve on.
func TestLimitsCPUTime(t *testing.T) {
	p := newLimitsPool(t, 2, knit.Limits{CPUTime: time.Second, Cgroup: knit.CgroupOff})
	stop := make(chan struct{})
	others := serving(bounded(t), p, stop)
	_, err := burnCPU.Call(bounded(t), p, 0)
	close(stop)
	if !errors.Is(err, knit.ErrWorkerCPULimit) || !strings.Contains(err.Error(), "CPU time limit of 1s") {
		t.Fatalf("burning CPU under a 1 s limit: %v, want WORKER_CPU_LIMIT", err)
	}
	if err := <-others; err != nil {
		t.Fatalf("the other calls while a lane used up its CPU time: %v", err)
	}
}

// waitGone waits for process pid to end: a pidfd becomes readable when it does.
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(pidfd)
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("setsid child %d outlived %s (poll %d, %v)", pid, what, n, err)
		}
		return
	}
}

// TestLimitsDescendantsDie: a child a task started in a session of its own dies with its
// lane's cgroup, when the lane dies and when the pool closes.
func TestLimitsDescendantsDie(t *testing.T) {
	for _, end := range []string{"its lane's exit", "Close"} {
		t.Run(end, func(t *testing.T) {
			p := newLimitsPool(t, 1, knit.Limits{Cgroup: knit.CgroupRequired})
			pid, err := startSetsid.Call(bounded(t), p, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(pid, syscall.SIGKILL) // should the test fail
			if sid, err := unix.Getsid(pid); err != nil || sid != pid {
				t.Fatalf("the child is not in a session of its own: sid %d, %v", sid, err)
			}
			if end == "Close" {
				if err := p.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else if _, err := exit3.Call(bounded(t), p, 3); !errors.Is(err, knit.ErrWorkerExited) {
				t.Fatalf("exit(3): %v", err)
			}
			waitGone(t, pid, end)
		})
	}
}

// knitCgroups lists the knit-<pid>-* cgroup directories of host pid, in every hierarchy (under
// this process's cgroups: where a host started as this one's child makes its own too).
func knitCgroups(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, root := range []string{"/sys/fs/cgroup/*", "/sys/fs/cgroup"} {
			dirs, _ := filepath.Glob(filepath.Join(root, parts[2], fmt.Sprintf("knit-%d-*", pid)))
			for _, d := range dirs {
				if !seen[d] {
					seen[d] = true
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// TestLimitsCgroupsRemoved: a lane's cgroup goes when it ends, and the pool's at Close,
// restarts and spares included.
func TestLimitsCgroupsRemoved(t *testing.T) {
	p := newLimitsPool(t, 2, knit.Limits{Memory: 512 << 20, Processes: 200, CPUs: 1, Cgroup: knit.CgroupRequired})
	if len(knitCgroups(t, os.Getpid())) == 0 {
		t.Fatal("no knit cgroup directory while the pool runs")
	}
	for range 3 { // three lane processes end and are replaced (from spares)
		if _, err := exit3.Call(bounded(t), p, 3); !errors.Is(err, knit.ErrWorkerExited) {
			t.Fatalf("exit(3): %v", err)
		}
	}
	if sum, err := add.Call(bounded(t), p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("after the restarts: %d, %v", sum, err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
		t.Fatalf("cgroup directories left after Close: %v", left)
	}
}

// TestLimitsRefused: limits that cannot mean anything fail NewPool.
func TestLimitsRefused(t *testing.T) {
	for _, l := range []knit.Limits{{Memory: -1}, {CPUTime: -time.Second}, {CPUs: -1}, {CPUs: 0.001}, {OpenFiles: -1}, {Processes: -2}, {Cgroup: 7}} {
		_, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Process: knit.ProcessConfig{Limits: l}}, add)
		if !errors.Is(err, knit.ErrInvalidArgument) || !strings.Contains(err.Error(), "Limits") {
			t.Errorf("%+v: %v", l, err)
		}
	}
}

// TestLimitsApplied: a lane applies its limits to itself before it serves, a lane started
// directly and one made from a spare alike; where a cgroup enforces memory and processes,
// it leaves them to the cgroup.
func TestLimitsApplied(t *testing.T) {
	limit := func(limits, name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `\s+(\S+)\s+(\S+)`).FindStringSubmatch(limits)
		if m == nil {
			t.Fatalf("no %q in %s", name, limits)
		}
		return m[1] + " " + m[2]
	}
	for _, mode := range []knit.CgroupMode{knit.CgroupOff, knit.CgroupRequired} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			l := knit.Limits{CPUTime: 89500 * time.Millisecond, OpenFiles: 128, Processes: 5000, Cgroup: mode}
			if mode == knit.CgroupRequired || !raceEnabled { // race-built lanes do not fit RLIMIT_DATA
				l.Memory = 512 << 20
			}
			p := newLimitsPool(t, 1, l)
			for i, how := range []string{"started directly", "from a spare"} {
				if i == 1 {
					if _, err := exit3.Call(bounded(t), p, 3); !errors.Is(err, knit.ErrWorkerExited) {
						t.Fatalf("exit(3): %v", err)
					}
				}
				got, err := laneLimits.Call(bounded(t), p, 0)
				if err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				want := map[string]string{
					"Max cpu time":       "90 91",
					"Max open files":     "128 128",
					"Max core file size": "0 0",
					"Max data size":      "536870912 536870912",
					"Max processes":      "5000 5000",
				}
				if l.Memory == 0 {
					delete(want, "Max data size")
				}
				if mode == knit.CgroupRequired { // the cgroup's memory.max and pids.max instead
					want["Max data size"] = limit(readLimits(t), "Max data size")
					want["Max processes"] = limit(readLimits(t), "Max processes")
				}
				for name, w := range want {
					if g := limit(got[0], name); g != w {
						t.Errorf("%s: %s: %q, want %q", how, name, g, w)
					}
				}
				if l.Memory > 0 && got[1] != "469762048" { // 512 MiB less an eighth
					t.Errorf("%s: Go memory limit %s, want 448 MiB", how, got[1])
				}
			}
		})
	}
}

// readLimits is the host's own /proc/self/limits.
func readLimits(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLimitsFallback: where the host cannot make cgroups (here: a parent that does not
// exist), CgroupAuto falls back to rlimits, says so once, and the limits still hold;
// CgroupRequired fails NewPool instead.
func TestLimitsFallback(t *testing.T) {
	obs, logs := observer.New(zap.WarnLevel)
	l := knit.Limits{OpenFiles: 64, CPUs: 0.5, CgroupParent: "/knit-no-such-parent"}
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: zap.New(obs),
		Process: knit.ProcessConfig{Limits: l}}, limitTasks...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if got := p.Stats().Limits; got != knit.LimitsRlimits {
		t.Fatalf("Stats().Limits = %q, want rlimits", got)
	}
	if _, err := openFiles.Call(bounded(t), p, 100); !errors.Is(err, knit.ErrTaskError) {
		t.Fatalf("100 files under a limit of 64, without a cgroup: %v", err)
	}
	warned := logs.FilterMessageSnippet("no cgroup").All()
	if len(warned) != 1 || !strings.Contains(warned[0].Message, "CPUs is not enforced") ||
		!strings.Contains(fmt.Sprint(warned[0].ContextMap()["error"]), "knit-no-such-parent") {
		t.Fatalf("want one warning naming the reason and what is lost, got %v", warned)
	}
	l.Cgroup = knit.CgroupRequired
	_, err = knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Limits: l}}, add)
	if !errors.Is(err, knit.ErrPoolUnavailable) || !strings.Contains(err.Error(), "CgroupRequired") {
		t.Fatalf("CgroupRequired without cgroups: %v", err)
	}
}

// TestHelperCgroupHost is not a test: TestLimitsSweepAfterHostKilled runs the test binary as
// a host with cgroups whose lane starts a setsid child; it prints the child's pid and waits to
// be killed.
func TestHelperCgroupHost(t *testing.T) {
	if os.Getenv("KNIT_TEST_CGROUP_HOST") == "" {
		t.Skip("helper process only")
	}
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(),
		Process: knit.ProcessConfig{Limits: knit.Limits{Cgroup: knit.CgroupRequired}}}, limitTasks...)
	if err != nil {
		fmt.Println("no-cgroups:", err)
		return
	}
	pid, err := startSetsid.Call(bounded(t), p, 0)
	fmt.Printf("setsid-child=%d %v\n", pid, err)
	select {}
}

// TestLimitsSweepAfterHostKilled: a host killed with SIGKILL leaves its cgroups, with the
// setsid child of its lane still running in one; the next pool with cgroups kills the child
// and removes them.
func TestLimitsSweepAfterHostKilled(t *testing.T) {
	cmd, out := startHelperHost(t, "TestHelperCgroupHost", "KNIT_TEST_CGROUP_HOST=1")
	defer cmd.Wait()
	defer cmd.Process.Kill()
	child := 0
	for sc := bufio.NewScanner(out); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "no-cgroups:") {
			t.Skipf("this machine gives no cgroups: %s", line)
		}
		if _, err := fmt.Sscanf(line, "setsid-child=%d", &child); err == nil {
			break
		}
	}
	if child <= 0 {
		t.Fatal("the helper host printed no child pid")
	}
	defer syscall.Kill(child, syscall.SIGKILL) // should the test fail
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	left := knitCgroups(t, cmd.Process.Pid)
	if len(left) == 0 {
		t.Fatal("the killed host left no cgroup: the test needs one")
	}
	if err := syscall.Kill(child, 0); err != nil {
		t.Fatalf("the setsid child is gone before the sweep (%v): the test needs it alive", err)
	}
	p := newLimitsPool(t, 1, knit.Limits{Cgroup: knit.CgroupRequired})
	waitGone(t, child, "the sweep of its dead host's cgroup")
	if now := knitCgroups(t, cmd.Process.Pid); len(now) > 0 {
		t.Fatalf("cgroups of the dead host left after NewPool: %v", now)
	}
	_ = p.Close(context.Background())
}

// A lane, or a child of it in a session of its own, tries to leave its cgroup for one it
// makes beside it in the pool's directory (issue 29).

// laneCgroupDirs are the directories of this process's knit cgroup, one per hierarchy.
func laneCgroupDirs() ([]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "/knit-") {
			continue
		}
		// v1: mounted at /sys/fs/cgroup/<controllers>; v2 (no controllers listed): the
		// unified mount, or its place on a hybrid host.
		roots := []string{filepath.Join("/sys/fs/cgroup", parts[1])}
		if parts[1] == "" {
			roots = []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
		}
		for _, r := range roots {
			if d := filepath.Join(r, parts[2]); isDir(d) {
				dirs = append(dirs, d)
				break
			}
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no knit cgroup in %q", b)
	}
	return dirs, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// newCgroupPool starts a pool of one process lane in a cgroup, or skips, saying why, where
// the machine gives none (except under CI, where it fails).
func newCgroupPool(t *testing.T, sb knit.Sandbox) *knit.Pool {
	t.Helper()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{
		Sandbox: sb,
		Limits:  knit.Limits{Memory: 128 << 20, Processes: 64, Cgroup: knit.CgroupRequired},
	}}, leaveCgroup, add)
	if err != nil && strings.Contains(err.Error(), "cgroups unavailable") && os.Getenv("CI") != "true" {
		t.Skipf("this machine gives no cgroups: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// cgroupOf is process pid's /proc/<pid>/cgroup.
func cgroupOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return string(b)
}

// startEscaper has the lane start escapeScript and returns its pid and what it printed.
func startEscaper(t *testing.T, p *knit.Pool) (int, string) {
	t.Helper()
	got, err := leaveCgroup.Call(context.Background(), p, true)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(got)
	pid, err := strconv.Atoi(f[0])
	if err != nil || len(f) != 2 {
		t.Fatalf("the lane said %q", got)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Fatalf("the child is not in a session of its own: sid %d, %v", sid, err)
	}
	return pid, f[1]
}

// TestCgroupEscapeDiesAtClose: unsandboxed, a lane running as root may make cgroups beside
// its own and move a child there (a lane of another user, in a delegated hierarchy, too):
// the child still dies at Close, and no directory is left.
func TestCgroupEscapeDiesAtClose(t *testing.T) {
	p := newCgroupPool(t, knit.Sandbox{})
	pid, said := startEscaper(t, p)
	if os.Geteuid() == 0 && said != "escaped" {
		t.Fatalf("an unsandboxed root lane's child could not leave its cgroup (%s): the test needs it to", said)
	}
	t.Logf("the child %s: %s", said, strings.ReplaceAll(cgroupOf(pid), "\n", " "))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "Close")
	if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
		t.Fatalf("cgroup directories left after Close: %v", left)
	}
}

// TestCgroupSandboxedCannotLeave: under Landlock (even reading all of /) a lane's child
// cannot write the cgroup filesystem; under the seccomp preset, which lets the lane start
// no child, the lane itself cannot (its process scope denies writes beneath /sys). Each
// stays in its cgroup and dies at Close.
func TestCgroupSandboxedCannotLeave(t *testing.T) {
	t.Run("landlock, a setsid child", func(t *testing.T) {
		needLandlock(t)
		// os/exec opens /dev/null for the child's missing standard input, read-write.
		p := newCgroupPool(t, knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired,
			ReadOnly: []string{"/"}, Writable: []string{os.DevNull}}})
		pid, said := startEscaper(t, p)
		if said != "refused" || strings.Contains(cgroupOf(pid), "/escape.") {
			t.Fatalf("the child %s: %s", said, cgroupOf(pid))
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid, "Close")
	})
	t.Run("seccomp, the lane", func(t *testing.T) {
		needScope(t)
		p := newCgroupPool(t, knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}})
		lane := p.Stats().Lanes[0].PID
		got, err := leaveCgroup.Call(context.Background(), p, false)
		if err != nil || got != "EACCES" {
			t.Fatalf("the lane leaving its cgroup: %q, %v; want EACCES", got, err)
		}
		if strings.Contains(cgroupOf(lane), "/escape.") {
			t.Fatalf("the lane left its cgroup: %s", cgroupOf(lane))
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
			t.Fatalf("cgroup directories left after Close: %v", left)
		}
	})
}

// TestCgroupDefaultConfig: with the default Config, where the host can make a cgroup, each
// lane gets one with no limit, so that a grandchild in a session of its own dies with its
// lane. It skips (fails under CI) where the pool gave its lane none.
func TestCgroupDefaultConfig(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, startSetsid, exit3, add)
	lane := p.Stats().Lanes[0].PID
	if !strings.Contains(cgroupOf(lane), fmt.Sprintf("/knit-%d-", os.Getpid())) {
		msg := fmt.Sprintf("the default Config gave lane %d no cgroup: %s", lane, strings.ReplaceAll(cgroupOf(lane), "\n", " "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	pid, err := startSetsid.Call(context.Background(), p, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL) // should the test fail
	if _, err := exit3.Call(context.Background(), p, 3); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("exit(3): %v", err)
	}
	waitGone(t, pid, "its lane's exit")
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
		t.Fatalf("cgroup directories left after Close: %v", left)
	}
}
