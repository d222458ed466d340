package knit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

// Sandboxed process lanes. Every probe runs inside the lane and reports the errno its
// operation failed with (errors.As through the wrapping os and os/exec add), or "ok".

// landlockABI is the kernel's Landlock ABI (0: none).
func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}

// needLandlock skips a test that needs Landlock ABI 4 (filesystem and TCP), saying why.
func needLandlock(t *testing.T) {
	t.Helper()
	if abi := landlockABI(); abi < 4 {
		t.Skipf("this kernel's Landlock ABI is %d (uname -r: %s); the policy tests need 4 — TestSandboxLandlockUnavailable covers what happens here",
			abi, kernelRelease())
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// bwrapPrefix is the documented bubblewrap recipe (docs/process-lanes.md), binding the
// test's directories at the same paths, and the lane binary's (go test builds it under
// /tmp, which the recipe replaces). Without bwrap the test skips, except under CI.
func bwrapPrefix(t testing.TB, binds ...string) []string {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bwrap is not installed: .ci/run installs bubblewrap")
		}
		t.Skip("bwrap is not installed (apt-get install bubblewrap)")
	}
	prefix := []string{bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
		"--unshare-all", "--die-with-parent"}
	// bwrap needs namespaces, which some containers refuse: say so rather than fail in a lane.
	if out, err := exec.Command(prefix[0], append(prefix[1:], "--", "true")...).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("bwrap cannot sandbox here: %v: %s", err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prefix = append(prefix, "--ro-bind", filepath.Dir(exe), filepath.Dir(exe))
	for _, b := range binds {
		prefix = append(prefix, "--bind", b, b)
	}
	return append(prefix, "--")
}

// sandboxDirs makes a read-only directory with a file, a writable directory and an outside
// directory with a file.
func sandboxDirs(t *testing.T) (ro, rw, outside string) {
	ro, rw, outside = t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{ro, outside} {
		if err := os.WriteFile(filepath.Join(d, "file"), []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ro, rw, outside
}

func probe(t *testing.T, p *knit.Pool, want string, op ...string) {
	t.Helper()
	got, err := sandboxProbe.Call(context.Background(), p, op)
	if err != nil {
		t.Fatalf("%v: %v", op, err)
	}
	if got != want {
		t.Errorf("%v: %s, want %s", op, got, want)
	}
}

// A lane under Landlock reads only beneath ReadOnly and Writable, writes only beneath
// Writable, and connects to no TCP port; everything else fails with EACCES. The same holds
// behind the bubblewrap prefix, which binds the directories writable: Landlock alone denies.
func TestSandboxLandlock(t *testing.T) {
	needLandlock(t)
	for _, wrapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "bwrap"}[wrapped], func(t *testing.T) {
			ro, rw, outside := sandboxDirs(t)
			cfg := knit.Config{Lanes: 1, Process: knit.ProcessConfig{Sandbox: knit.Sandbox{
				Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{ro}, Writable: []string{rw}},
			}}}
			if wrapped {
				cfg.Process.Prefix = bwrapPrefix(t, ro, rw, outside)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			p := newProcessPool(t, cfg, sandboxTasks...)
			probe(t, p, "ok", "read", filepath.Join(ro, "file"))
			probe(t, p, "ok", "write", filepath.Join(rw, "new"))
			probe(t, p, "ok", "read", filepath.Join(rw, "new"))
			probe(t, p, "EACCES", "write", filepath.Join(ro, "new"))
			probe(t, p, "EACCES", "write", filepath.Join(ro, "file"))
			probe(t, p, "EACCES", "read", filepath.Join(outside, "file"))
			probe(t, p, "EACCES", "write", filepath.Join(outside, "new"))
			probe(t, p, "EACCES", "threads", "read", filepath.Join(outside, "file"))
			probe(t, p, "ok", "threads", "read", filepath.Join(ro, "file"))
			if !wrapped { // bwrap --unshare-all gives the lane a network and pids of its own
				probe(t, p, "EACCES", "connect", ln.Addr().String())
				if landlockABI() >= 6 {
					probe(t, p, "EPERM", "signal", strconv.Itoa(os.Getpid()))
				}
			}
			if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the denied write left a file behind: %v", err)
			}
		})
	}
}

// A lane under the seccomp preset cannot make processes — exec.Command fails with EPERM, so
// does a raw fork, clone3 with ENOSYS — nor signal any process but itself, while the runtime
// still starts threads.
func TestSandboxSeccomp(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "bwrap"}[wrapped], func(t *testing.T) {
			cfg := knit.Config{Lanes: 1, Process: knit.ProcessConfig{Sandbox: knit.Sandbox{
				Seccomp: knit.Seccomp{Mode: knit.SandboxRequired},
			}}}
			if wrapped {
				cfg.Process.Prefix = bwrapPrefix(t)
			}
			p := newProcessPool(t, cfg, sandboxTasks...)
			truePath, err := exec.LookPath("true")
			if err != nil {
				t.Fatal(err)
			}
			probe(t, p, "EPERM", "exec", truePath)
			if runtime.GOARCH == "amd64" {
				probe(t, p, "EPERM", "fork")
			}
			probe(t, p, "ENOSYS", "clone3")
			probe(t, p, "ok", "threads")
			probe(t, p, "ENOSYS", "threads", "clone3")
			if !wrapped { // behind bwrap the host is in another pid namespace
				probe(t, p, "EPERM", "signal", strconv.Itoa(os.Getpid()))
			}
			probe(t, p, "EPERM", "signal", "-1")
			probe(t, p, "ok", "signal", "self")
			if sum, err := add.Call(context.Background(), p, [2]int64{40, 2}); err != nil || sum != 42 {
				t.Fatalf("a plain call on a seccomp lane: %d, %v", sum, err)
			}
		})
	}
	// The probes can fail: unconfined, the same lane binary runs them.
	p := newProcessPool(t, knit.Config{Lanes: 1}, sandboxTasks...)
	_, _, outside := sandboxDirs(t)
	probe(t, p, "ok", "exec", "/bin/true")
	probe(t, p, "EINVAL", "clone3")
	probe(t, p, "ok", "read", filepath.Join(outside, "file"))
	probe(t, p, "ok", "signal", strconv.Itoa(os.Getpid()))
}

// A sandboxed lane that crashes is restarted like any other, sandboxed again: its
// replacement is the spare, which collected its region over the Named rendezvous before it
// applied the sandbox.
func TestSandboxCrashRestart(t *testing.T) {
	sb := knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}}
	_, _, outside := sandboxDirs(t)
	if landlockABI() >= 4 {
		sb.Landlock = knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/usr"}}
	}
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(),
		Process: knit.ProcessConfig{Sandbox: sb, SharedMemory: knit.Named}}, sandboxTasks...)
	knit.AwaitSpares(p) // the restart below takes the spare
	pid := p.Stats().Lanes[0].PID
	_, err := fault.Call(context.Background(), p, 0)
	if !errors.Is(err, knit.ErrWorkerCrashed) || !strings.Contains(err.Error(), "fault") {
		t.Fatalf("fault on a sandboxed lane: %v, want WORKER_CRASHED naming the fault", err)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil || sum != 5 {
		t.Fatalf("call after the restart: %d, %v", sum, err)
	}
	if s := p.Stats().Lanes[0]; s.Incarnation != 1 || s.PID == pid {
		t.Fatalf("lane after the restart: %+v (crashed pid %d)", s, pid)
	}
	probe(t, p, "ENOSYS", "clone3")
	if sb.Landlock.Mode != knit.SandboxOff {
		probe(t, p, "EACCES", "read", filepath.Join(outside, "file"))
	}
}

// A lane that cannot apply a required layer fails to start, saying why, and NewPool fails
// with it.
func TestSandboxRequiredFails(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	_, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(),
		Process: knit.ProcessConfig{Sandbox: knit.Sandbox{
			Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{missing}},
		}}}, sandboxTasks...)
	if !errors.Is(err, knit.ErrWorkerStartupFailed) || !strings.Contains(err.Error(), "sandbox: Landlock path") ||
		!strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v, want WORKER_STARTUP_FAILED naming the missing path", err)
	}
	_, err = knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1,
		Process: knit.ProcessConfig{Sandbox: knit.Sandbox{
			Landlock: knit.Landlock{Mode: knit.SandboxRequired, Writable: []string{"relative"}},
		}}}, sandboxTasks...)
	if !errors.Is(err, knit.ErrInvalidArgument) || !strings.Contains(err.Error(), "not absolute") {
		t.Fatalf("err = %v, want INVALID_ARGUMENT for a relative path", err)
	}
}

// Where the kernel lacks Landlock (or ABI 4), a required policy fails the lane with the
// reason and a best-effort one serves, having logged the downgrade once.
func TestSandboxLandlockUnavailable(t *testing.T) {
	abi := landlockABI()
	sb := knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/usr"}}}
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(),
		Process: knit.ProcessConfig{Sandbox: sb}}, sandboxTasks...)
	switch {
	case abi >= 4 && err != nil:
		t.Fatalf("required Landlock on ABI %d: %v", abi, err)
	case abi >= 4:
		p.Close(context.Background())
	case !errors.Is(err, knit.ErrWorkerStartupFailed) || !strings.Contains(err.Error(), "Landlock required"):
		if p != nil {
			p.Close(context.Background())
		}
		t.Fatalf("required Landlock on ABI %d: %v, want WORKER_STARTUP_FAILED saying Landlock is required", abi, err)
	}

	core, logs := observer.New(zap.WarnLevel)
	sb.Landlock.Mode = knit.SandboxBestEffort
	p = newProcessPool(t, knit.Config{Lanes: 2, Logger: zap.New(core), Process: knit.ProcessConfig{Sandbox: sb}}, sandboxTasks...)
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil || sum != 2 {
		t.Fatalf("best-effort lane: %d, %v", sum, err)
	}
	downgrades := logs.FilterMessage("sandbox downgraded (best effort)").Len()
	if want := map[bool]int{true: 1, false: 0}[abi < 6]; downgrades != want {
		t.Fatalf("Landlock ABI %d: %d downgrade warnings for a pool of 2 lanes, want %d: %v", abi, downgrades, want, logs.All())
	}
	if exe, err := os.Executable(); err == nil && abi >= 1 { // the lane binary: outside /usr
		probe(t, p, "EACCES", "read", exe)
	}
}
