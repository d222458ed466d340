package knit_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

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

// hostSecret is a word of the host's that a lane reading its memory would find, and one
// writing it would change.
var hostSecret atomic.Uint64

// hostState is everything of the host's the probes touch.
func hostState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, r := range []int{unix.RLIMIT_CPU, unix.RLIMIT_AS, unix.RLIMIT_NOFILE, unix.RLIMIT_DATA, unix.RLIMIT_CORE} {
		var l unix.Rlimit
		if err := unix.Prlimit(0, r, nil, &l); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "rlimit %d: %d/%d; ", r, l.Cur, l.Max)
	}
	prio, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
	pgid, _ := unix.Getpgid(0)
	var set unix.CPUSet
	_ = unix.SchedGetaffinity(0, &set)
	ioprio, _, _ := unix.RawSyscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
	oom, _ := os.ReadFile("/proc/self/oom_score_adj")
	fmt.Fprintf(&b, "priority %d, pgid %d, cpus %d, ioprio %d, oom_score_adj %s", prio, pgid, set.Count(), ioprio,
		strings.TrimSpace(string(oom)))
	return b.String()
}

// hostProbes are the attacks on this process, each with what a lane that may act on its
// host reports (ok) and what a lane kept off it reports.
func hostProbes(t *testing.T) []struct {
	name    string
	probe   hostProbe
	allowed string // what the probe reports unsandboxed
	denied  string // and under the seccomp preset
} {
	t.Helper()
	host := os.Getpid()
	var limits []hostProbe
	for _, r := range []int{unix.RLIMIT_CPU, unix.RLIMIT_AS, unix.RLIMIT_NOFILE, unix.RLIMIT_DATA} {
		var l unix.Rlimit
		if err := unix.Prlimit(0, r, nil, &l); err != nil {
			t.Fatal(err)
		}
		limits = append(limits, hostProbe{Op: "prlimit", PID: host, Vals: []int64{int64(r), int64(l.Cur), int64(l.Max)}})
	}
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0) // 20 - nice
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := unix.Getpgid(0)
	if err != nil {
		t.Fatal(err)
	}
	secret := hostSecret.Load()
	addr := uint64(uintptr(unsafe.Pointer(&hostSecret)))
	type row = struct {
		name            string
		probe           hostProbe
		allowed, denied string
	}
	rows := []row{
		{"prlimit64 RLIMIT_CPU", limits[0], "ok", "EPERM"},
		{"prlimit64 RLIMIT_AS", limits[1], "ok", "EPERM"},
		{"prlimit64 RLIMIT_NOFILE", limits[2], "ok", "EPERM"},
		{"prlimit64 RLIMIT_DATA", limits[3], "ok", "EPERM"},
		{"setpriority", hostProbe{Op: "setpriority", PID: host, Vals: []int64{int64(20 - prio)}}, "ok", "EPERM"},
		{"sched_setaffinity", hostProbe{Op: "affinity", PID: host}, "ok", "EPERM"},
		{"ioprio_set", hostProbe{Op: "ioprio", PID: host}, "ok", "EPERM"},
		{"setpgid into the host's group", hostProbe{Op: "setpgid", PID: host, Vals: []int64{int64(pgid)}}, "ok", "EPERM"},
		{"F_SETOWN and F_SETSIG on a pipe", hostProbe{Op: "setown", PID: host}, "ok ok", "EPERM EPERM"},
		{"pidfd_open", hostProbe{Op: "pidfd", PID: host}, "ok", "EPERM"},
		{"/proc/<host>/mem read", hostProbe{Op: "memread", PID: host, Addr: addr}, "ok " + strconv.FormatUint(secret, 10), "EACCES"},
		// Unsandboxed, it writes what is there; sandboxed, something else.
		{"/proc/<host>/mem write", hostProbe{Op: "memwrite", PID: host, Addr: addr, Value: secret}, "ok", "EACCES"},
		{"/proc/<host>/oom_score_adj write", hostProbe{Op: "oomadj", PID: host}, "ok", "EACCES"},
	}
	return rows
}

// needScope skips a test of the seccomp preset where the kernel lacks what the required
// preset needs (Landlock ABI 2), saying why.
func needScope(t *testing.T) {
	t.Helper()
	if abi := landlockABI(); abi < 2 {
		t.Skipf("this kernel's Landlock ABI is %d (uname -r: %s): the required seccomp preset needs 2 for its process scope",
			abi, kernelRelease())
	}
}

// TestSandboxLaneCannotTouchHost: under the seccomp preset, alone and with Landlock, every
// probe fails; the host's limits, priorities, group and memory are as they were; the lane
// serves on, never restarted. Unsandboxed, the same lane binary succeeds at every probe (it
// sets the values the host has): the probes can fail.
func TestSandboxLaneCannotTouchHost(t *testing.T) {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	hostSecret.Store(binary.NativeEndian.Uint64(seed[:]) | 1)
	for _, preset := range []struct {
		name     string
		sandbox  knit.Sandbox
		landlock bool
	}{
		{"seccomp", knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}}, false},
		{"landlock and seccomp", knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired},
			Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/"}}}, true},
		{"none", knit.Sandbox{}, false},
	} {
		t.Run(preset.name, func(t *testing.T) {
			if preset.sandbox.Seccomp.Mode != knit.SandboxOff {
				needScope(t)
			}
			if preset.landlock {
				needLandlock(t)
			}
			p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Sandbox: preset.sandbox}},
				hostAttack, add)
			before, secret := hostState(t), hostSecret.Load()
			for _, row := range hostProbes(t) {
				want := row.denied
				if !preset.sandbox.Enabled() {
					want = row.allowed
				} else if row.probe.Op == "memwrite" {
					row.probe.Value = ^secret
				}
				got, err := hostAttack.Call(context.Background(), p, row.probe)
				if err != nil {
					t.Fatalf("%s: %v", row.name, err)
				}
				if got != want {
					t.Errorf("%s: %s, want %s", row.name, got, want)
				}
			}
			for i := range 50 {
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i)+1 {
					t.Fatalf("call %d after the attacks: %d, %v", i, sum, err)
				}
			}
			if after := hostState(t); after != before {
				t.Errorf("the host changed:\nbefore %s\nafter  %s", before, after)
			}
			if got := hostSecret.Load(); got != secret {
				t.Errorf("the host's memory changed: %#x, was %#x", got, secret)
			}
			if s := p.Stats().Lanes[0]; s.Incarnation != 0 || s.Restarts != 0 {
				t.Errorf("the lane was restarted: %+v", s)
			}
		})
	}
}

// TestSandboxLandlockAlone: Landlock alone filters no system call. Its domain keeps the lane
// off the host's memory even where the policy lets the lane read /proc (the kernel refuses
// ptrace-mode access to a process outside the domain); it does not keep the lane from the
// host's limits, which only the seccomp preset denies (docs/process-lanes.md, threat model).
// Its nice value, affinity and I/O priority the lane may change only when the host holds no
// capability the lane lacks (the kernel's capability checks refuse a process renicing one
// more privileged): an unprivileged host, not a root one. The probes set the values the
// host has.
func TestSandboxLandlockAlone(t *testing.T) {
	needLandlock(t)
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Sandbox: knit.Sandbox{
		Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/"}},
	}}}, hostAttack, add)
	before := hostState(t)
	want := map[string]string{
		"/proc/<host>/mem read": "EACCES", "/proc/<host>/mem write": "EACCES",
		"/proc/<host>/oom_score_adj write": "EACCES", // not beneath Writable
		// What only the seccomp preset denies.
		"prlimit64 RLIMIT_NOFILE": "ok", "setpgid into the host's group": "ok", "pidfd_open": "ok",
		"F_SETOWN and F_SETSIG on a pipe": "ok ok",
	}
	var host [2]unix.CapUserData // version 3: two words
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &host[0]); err != nil {
		t.Fatal(err)
	}
	if host[0].Permitted != 0 || host[1].Permitted != 0 {
		want["setpriority"], want["sched_setaffinity"] = "EPERM", "EPERM"
	} else {
		want["setpriority"], want["sched_setaffinity"] = "ok", "ok"
	}
	for _, row := range hostProbes(t) {
		w, ok := want[row.name]
		if !ok {
			continue
		}
		got, err := hostAttack.Call(context.Background(), p, row.probe)
		if err != nil || got != w {
			t.Errorf("%s: %q, %v; want %s", row.name, got, err, w)
		}
	}
	if after := hostState(t); after != before {
		t.Errorf("the host changed:\nbefore %s\nafter  %s", before, after)
	}
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 2}); err != nil || sum != 4 {
		t.Fatalf("after the probes: %d, %v", sum, err)
	}
}

// TestSandboxLaneCannotReachOtherLane: a lane opening another lane's region through
// /proc/<pid>/fd/3, as any process of their user may between unsandboxed lanes, is refused
// under each layer: the other lane is not dumpable, and under Landlock outside the lane's
// domain.
func TestSandboxLaneCannotReachOtherLane(t *testing.T) {
	for _, preset := range []struct {
		name    string
		sandbox knit.Sandbox
	}{
		{"seccomp", knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}}},
		{"landlock", knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/"}, Writable: []string{"/proc"}}}},
		{"none", knit.Sandbox{}},
	} {
		t.Run(preset.name, func(t *testing.T) {
			if preset.sandbox.Seccomp.Mode != knit.SandboxOff {
				needScope(t)
			}
			if preset.sandbox.Landlock.Mode != knit.SandboxOff {
				needLandlock(t)
			}
			p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), Process: knit.ProcessConfig{Sandbox: preset.sandbox}},
				hostAttack, add)
			lanes := p.Stats().Lanes
			probe := hostProbe{Op: "otherlane", Vals: []int64{int64(lanes[0].PID), int64(lanes[1].PID)}}
			want := "EACCES"
			if !preset.sandbox.Enabled() {
				want = "ok"
			}
			for range 4 { // whichever lane runs it
				if got, err := hostAttack.Call(context.Background(), p, probe); err != nil || got != want {
					t.Fatalf("opening the other lane's region: %q, %v; want %s", got, err, want)
				}
			}
		})
	}
}

// TestSandboxDropsPrivileges: under any layer the lane holds no permitted or effective
// capability, has no_new_privs set and is not dumpable; a program it runs (Landlock lets it)
// gains none, though a root lane's exec would otherwise get every capability of its
// bounding set. Unsandboxed, a lane of root holds the capabilities it was given.
func TestSandboxDropsPrivileges(t *testing.T) {
	root := os.Geteuid() == 0
	for _, preset := range []struct {
		name    string
		sandbox knit.Sandbox
	}{
		{"seccomp", knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}}},
		// os/exec opens /dev/null for the program's missing standard input.
		{"landlock", knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired, ReadOnly: []string{"/"}, Writable: []string{os.DevNull}}}},
		{"none", knit.Sandbox{}},
	} {
		t.Run(preset.name, func(t *testing.T) {
			if preset.sandbox.Seccomp.Mode != knit.SandboxOff {
				needScope(t)
			}
			if preset.sandbox.Landlock.Mode == knit.SandboxRequired {
				needLandlock(t)
			}
			p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{Sandbox: preset.sandbox}},
				hostAttack, add)
			got, err := hostAttack.Call(context.Background(), p, hostProbe{Op: "privileges"})
			if err != nil {
				t.Fatal(err)
			}
			if !preset.sandbox.Enabled() {
				if (root && strings.Contains(got, "CapEff=0000000000000000")) || !strings.Contains(got, "NoNewPrivs=0") {
					t.Fatalf("an unsandboxed lane: %s", got)
				}
				return
			}
			if want := "CapPrm=0000000000000000 CapEff=0000000000000000 NoNewPrivs=1 dumpable=0"; got != want {
				t.Fatalf("%s, want %s", got, want)
			}
			if preset.sandbox.Seccomp.Mode == knit.SandboxOff {
				got, err := hostAttack.Call(context.Background(), p, hostProbe{Op: "execcaps"})
				if want := "CapPrm: 0000000000000000 CapEff: 0000000000000000"; err != nil || got != want {
					t.Fatalf("a program the lane ran: %q, %v; want %s", got, err, want)
				}
			}
		})
	}
}
