package knit_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

// A sandboxed lane turns on its host: every way a process of the host's user acts on another
// through a pid (issue 29). The probes set what the host has already (its own limits, nice
// value, affinity, I/O priority, OOM score), so that an attack that gets through changes
// nothing; whether the kernel let it through is what each reports.

// hostProbe is one attack: Op on process PID; Addr and Value for the memory ops, Vals for
// the others.
type hostProbe struct {
	Op    string
	PID   int
	Addr  uint64
	Value uint64
	Vals  []int64
}

// hostAttack runs a hostProbe in the lane and reports the errno it failed with, or "ok"
// (with what it read, for memread).
var hostAttack = knit.Define("test.sandbox.host", func(_ context.Context, in hostProbe) (string, error) {
	return attackHost(in)
})

const ioprioWhoProcess = 1 // linux/ioprio.h

func attackHost(in hostProbe) (string, error) {
	pid := uintptr(in.PID)
	arg := func(i int) int64 {
		if i < len(in.Vals) {
			return in.Vals[i]
		}
		return 0
	}
	switch in.Op {
	case "prlimit": // Vals: resource, soft, hard
		lim := unix.Rlimit{Cur: uint64(arg(1)), Max: uint64(arg(2))}
		_, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, pid, uintptr(arg(0)), uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
		return errnoOf(errnoErr(e)), nil
	case "setpriority": // Vals: nice
		_, _, e := unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, pid, uintptr(arg(0)))
		return errnoOf(errnoErr(e)), nil
	case "affinity":
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(in.PID, &set); err != nil {
			return "", err
		}
		return errnoOf(unix.SchedSetaffinity(in.PID, &set)), nil
	case "ioprio":
		prio, _, e := unix.RawSyscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, pid, 0)
		if e != 0 {
			return "", e
		}
		_, _, e = unix.RawSyscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, pid, prio)
		return errnoOf(errnoErr(e)), nil
	case "setpgid": // Vals: the group to join
		err := unix.Setpgid(0, int(arg(0)))
		if err == nil {
			_ = unix.Setpgid(0, 0) // its own group again
		}
		return errnoOf(err), nil
	case "setown": // have the kernel signal PID when a pipe of the lane's is ready
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return "", err
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		_, _, e1 := unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETOWN, pid)
		// SIGURG, which the Go runtime takes in its stride, rather than SIGKILL.
		_, _, e2 := unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETSIG, uintptr(unix.SIGURG))
		return errnoOf(errnoErr(e1)) + " " + errnoOf(errnoErr(e2)), nil
	case "memread", "memwrite":
		mode := os.O_RDONLY
		if in.Op == "memwrite" {
			mode = os.O_RDWR
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", in.PID), mode, 0)
		if err != nil {
			return errnoOf(err), nil
		}
		defer f.Close()
		var b [8]byte
		if in.Op == "memwrite" {
			binary.NativeEndian.PutUint64(b[:], in.Value)
			_, err = f.WriteAt(b[:], int64(in.Addr))
			return errnoOf(err), nil
		}
		if _, err := f.ReadAt(b[:], int64(in.Addr)); err != nil {
			return errnoOf(err), nil
		}
		return "ok " + strconv.FormatUint(binary.NativeEndian.Uint64(b[:]), 10), nil
	case "oomadj": // a file of the host's that its user may write without ptrace access
		path := fmt.Sprintf("/proc/%d/oom_score_adj", in.PID)
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		return errnoOf(os.WriteFile(path, b, 0)), nil
	case "otherlane": // Vals: the pool's two lane pids; open the other one's region
		other := int(arg(0))
		if other == os.Getpid() {
			other = int(arg(1))
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/3", other), os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		return errnoOf(err), nil
	case "privileges": // what the lane holds: "CapPrm CapEff NoNewPrivs dumpable"
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return "", err
		}
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && (k == "CapPrm" || k == "CapEff" || k == "NoNewPrivs") {
				out = append(out, k+"="+strings.TrimSpace(v))
			}
		}
		d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		if err != nil {
			return "", err
		}
		return strings.Join(append(out, "dumpable="+strconv.Itoa(d)), " "), nil
	case "execcaps": // what a program the lane runs holds
		out, err := exec.Command("grep", "-E", "^Cap(Prm|Eff)", "/proc/self/status").Output()
		return strings.Join(strings.Fields(string(out)), " "), err
	case "pidfd":
		fd, err := unix.PidfdOpen(in.PID, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoOf(err), nil
	}
	return "", fmt.Errorf("unknown host probe %q", in.Op)
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
