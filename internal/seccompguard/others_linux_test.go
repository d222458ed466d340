//go:build linux

package seccompguard

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// runOthers runs the DenyOthers program for self in a BPF interpreter on a call nr with the
// given arguments' low halves; each high half holds junk, which must change nothing.
func runOthers(t *testing.T, vm *bpf.VM, nr uintptr, args ...uint32) uint32 {
	t.Helper()
	// The kernel loads seccomp_data's words in native order, x/net/bpf's VM in network
	// order: each word the program reads is written big-endian where it reads it.
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[nrOffset:], uint32(nr))
	for i, a := range args {
		binary.BigEndian.PutUint32(data[argLow(i):], a)
		binary.BigEndian.PutUint32(data[argLow(i)+4:], 0xdead0000|uint32(i))
	}
	got, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(got)
}

func TestOthersProgram(t *testing.T) {
	const self, other = 4242, 1
	raw := othersProgram(self)
	insts := make([]bpf.Instruction, len(raw))
	for i, r := range raw {
		insts[i] = bpf.RawInstruction{Op: r.Code, Jt: r.Jt, Jf: r.Jf, K: r.K}.Disassemble()
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	const allow, eperm = unix.SECCOMP_RET_ALLOW, unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	minus1 := ^uint32(0)
	for _, tc := range []struct {
		name string
		nr   uintptr
		args []uint32
		want uint32
	}{
		{"kill self", unix.SYS_KILL, []uint32{self, 9}, allow},
		{"kill other", unix.SYS_KILL, []uint32{other, 9}, eperm},
		{"kill group", unix.SYS_KILL, []uint32{0, 9}, eperm},
		{"kill all", unix.SYS_KILL, []uint32{minus1, 9}, eperm},
		{"tgkill own thread", unix.SYS_TGKILL, []uint32{self, 77, 23}, allow},
		{"tgkill other", unix.SYS_TGKILL, []uint32{other, other, 23}, eperm},
		{"rt_sigqueueinfo other", unix.SYS_RT_SIGQUEUEINFO, []uint32{other}, eperm},
		{"rt_tgsigqueueinfo other", unix.SYS_RT_TGSIGQUEUEINFO, []uint32{other, 1}, eperm},
		{"prlimit64 0", unix.SYS_PRLIMIT64, []uint32{0, unix.RLIMIT_NOFILE}, allow},
		{"prlimit64 self", unix.SYS_PRLIMIT64, []uint32{self, unix.RLIMIT_NOFILE}, allow},
		{"prlimit64 other", unix.SYS_PRLIMIT64, []uint32{other, unix.RLIMIT_CPU}, eperm},
		{"sched_setaffinity other", unix.SYS_SCHED_SETAFFINITY, []uint32{other}, eperm},
		{"sched_setaffinity self", unix.SYS_SCHED_SETAFFINITY, []uint32{0}, allow},
		{"sched_setscheduler other", unix.SYS_SCHED_SETSCHEDULER, []uint32{other}, eperm},
		{"sched_setparam other", unix.SYS_SCHED_SETPARAM, []uint32{other}, eperm},
		{"sched_setattr other", unix.SYS_SCHED_SETATTR, []uint32{other}, eperm},
		{"migrate_pages other", unix.SYS_MIGRATE_PAGES, []uint32{other}, eperm},
		{"move_pages other", unix.SYS_MOVE_PAGES, []uint32{other}, eperm},
		{"get_robust_list other", unix.SYS_GET_ROBUST_LIST, []uint32{other}, eperm},
		{"setpgid self leader", unix.SYS_SETPGID, []uint32{0, 0}, allow},
		{"setpgid into another group", unix.SYS_SETPGID, []uint32{0, other}, eperm},
		{"setpgid of another", unix.SYS_SETPGID, []uint32{other, 0}, eperm},
		{"setpriority self", unix.SYS_SETPRIORITY, []uint32{unix.PRIO_PROCESS, 0, 5}, allow},
		{"setpriority other", unix.SYS_SETPRIORITY, []uint32{unix.PRIO_PROCESS, other, 5}, eperm},
		{"setpriority group", unix.SYS_SETPRIORITY, []uint32{unix.PRIO_PGRP, 0, 5}, eperm},
		{"setpriority user", unix.SYS_SETPRIORITY, []uint32{unix.PRIO_USER, 0, 5}, eperm},
		{"ioprio_set self", unix.SYS_IOPRIO_SET, []uint32{ioprioWhoProcess, self, 0}, allow},
		{"ioprio_set other", unix.SYS_IOPRIO_SET, []uint32{ioprioWhoProcess, other, 0}, eperm},
		{"ioprio_set group", unix.SYS_IOPRIO_SET, []uint32{2, 0, 0}, eperm},
		{"fcntl F_SETOWN", unix.SYS_FCNTL, []uint32{3, unix.F_SETOWN, other}, eperm},
		{"fcntl F_SETSIG", unix.SYS_FCNTL, []uint32{3, unix.F_SETSIG, 9}, eperm},
		{"fcntl F_SETOWN_EX", unix.SYS_FCNTL, []uint32{3, unix.F_SETOWN_EX, 0}, eperm},
		{"fcntl F_GETFL", unix.SYS_FCNTL, []uint32{3, unix.F_GETFL}, allow},
		{"fcntl F_SETFD", unix.SYS_FCNTL, []uint32{3, unix.F_SETFD, 1}, allow},
		{"ioctl FIOSETOWN", unix.SYS_IOCTL, []uint32{3, fioSetOwn}, eperm},
		{"ioctl SIOCSPGRP", unix.SYS_IOCTL, []uint32{3, unix.SIOCSPGRP}, eperm},
		{"ioctl TIOCSPGRP", unix.SYS_IOCTL, []uint32{3, unix.TIOCSPGRP}, eperm},
		{"ioctl TIOCSTI", unix.SYS_IOCTL, []uint32{3, unix.TIOCSTI}, eperm},
		{"ioctl FIONREAD", unix.SYS_IOCTL, []uint32{3, 0x541b /* FIONREAD */}, allow},
		{"read", unix.SYS_READ, []uint32{other, 0, 0}, allow},
		{"getpid", unix.SYS_GETPID, nil, allow},
	} {
		if got := runOthers(t, vm, tc.nr, tc.args...); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

// Installed in a child process of the test, the filter keeps the child from acting on its
// parent through every call it covers, while the same calls on the child itself work. The
// child makes raw system calls with the high half of each argument set, as the kernel
// ignores it. Without the filter (the last run) the same calls on the parent succeed: the
// child runs as the test's user, which may act on its own processes.
func TestDenyOthersInChild(t *testing.T) {
	if os.Getenv("KNIT_OTHERS_CHILD") != "" {
		othersChild(os.Getenv("KNIT_OTHERS_CHILD") == "filter")
		return
	}
	if !OthersSupported() {
		t.Skipf("no process filter for this architecture")
	}
	run := func(mode string) map[string]string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDenyOthersInChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "KNIT_OTHERS_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child (%s): %v\n%s", mode, err, out)
		}
		got := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "probe ") {
				got[strings.TrimPrefix(k, "probe ")] = v
			}
		}
		if len(got) == 0 {
			t.Fatalf("child (%s) reported nothing:\n%s", mode, out)
		}
		return got
	}
	filtered := run("filter")
	for probe, want := range map[string]string{
		"prlimit64 parent": "EPERM", "prlimit64 parent, high bits": "EPERM", "prlimit64 self": "ok",
		"setpriority parent": "EPERM", "setpriority self": "ok",
		"sched_setaffinity parent": "EPERM", "sched_setaffinity self": "ok",
		"ioprio_set parent":           "EPERM",
		"setpgid into parent's group": "EPERM",
		"fcntl F_SETOWN parent":       "EPERM", "fcntl F_SETOWN, high bits": "EPERM", "fcntl F_SETSIG": "EPERM",
		"fcntl F_GETFL":   "ok",
		"ioctl FIOSETOWN": "EPERM",
		"kill parent":     "EPERM", "kill self": "ok", "tgkill self": "ok",
	} {
		if got := filtered[probe]; got != want {
			t.Errorf("filtered child, %s: %q, want %q", probe, got, want)
		}
	}
	// The probes can fail: unfiltered, the same child acts on its parent.
	unfiltered := run("none")
	for _, probe := range []string{"prlimit64 parent", "setpriority parent", "fcntl F_SETOWN parent", "ioctl FIOSETOWN",
		"kill parent", "setpgid into parent's group", "ioprio_set parent", "sched_setaffinity parent"} {
		if got := unfiltered[probe]; got != "ok" {
			t.Errorf("unfiltered child, %s: %q, want ok", probe, got)
		}
	}
}

// othersChild reads what its parent's limit, nice value, affinity, I/O priority and group
// are, installs the filter (when filter is set) and reports each probe as "probe NAME=ERRNO"
// or "=ok". The probes leave the parent as it was: they set the values it has.
func othersChild(filter bool) {
	self, parent := os.Getpid(), os.Getppid()
	var lim unix.Rlimit
	if err := unix.Prlimit(parent, unix.RLIMIT_CORE, nil, &lim); err != nil {
		panic(err)
	}
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, parent) // 20 - nice
	if err != nil {
		panic(err)
	}
	own, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		panic(err)
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(parent, &set); err != nil {
		panic(err)
	}
	ioprio, _, e := unix.RawSyscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(parent), 0)
	if e != 0 {
		panic(e)
	}
	pgid, err := unix.Getpgid(parent)
	if err != nil {
		panic(err)
	}
	mine, err := unix.Getpgid(0)
	if err != nil {
		panic(err)
	}
	if filter {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			panic(err)
		}
		if err := DenyOthers(self); err != nil {
			panic(err)
		}
	}
	report := func(name string, errno unix.Errno) {
		v := "ok"
		if errno != 0 {
			v = unix.ErrnoName(errno)
		}
		fmt.Printf("probe %s=%s\n", name, v)
	}
	const high = 1 << 32
	prlimit := func(pid uintptr) unix.Errno {
		_, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, pid, unix.RLIMIT_CORE, uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
		return e
	}
	report("prlimit64 parent", prlimit(uintptr(parent)))
	report("prlimit64 parent, high bits", prlimit(uintptr(parent)|high))
	if err := unix.Prlimit(0, unix.RLIMIT_CORE, nil, &lim); err != nil {
		panic(err)
	}
	report("prlimit64 self", prlimit(uintptr(self)))

	_, _, e = unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, uintptr(parent), uintptr(20-prio))
	report("setpriority parent", e)
	_, _, e = unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, 0, uintptr(20-own))
	report("setpriority self", e)

	report("sched_setaffinity parent", errnoOf(unix.SchedSetaffinity(parent, &set)))
	report("sched_setaffinity self", errnoOf(unix.SchedSetaffinity(0, &set)))

	_, _, e = unix.RawSyscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(parent), ioprio)
	report("ioprio_set parent", e)

	_, _, e = unix.RawSyscall(unix.SYS_SETPGID, 0, uintptr(pgid), 0)
	report("setpgid into parent's group", e)
	if e == 0 && pgid != mine {
		_ = unix.Setpgid(0, 0) // its own group again
	}

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		panic(err)
	}
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETOWN, uintptr(parent))
	report("fcntl F_SETOWN parent", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETOWN|high, uintptr(parent))
	report("fcntl F_SETOWN, high bits", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETSIG, uintptr(unix.SIGURG))
	report("fcntl F_SETSIG", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_GETFL, 0)
	report("fcntl F_GETFL", e)
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	owner := int32(parent)
	_, _, e = unix.RawSyscall(unix.SYS_IOCTL, uintptr(sp[0]), fioSetOwn, uintptr(unsafe.Pointer(&owner)))
	report("ioctl FIOSETOWN", e)

	report("kill parent", errnoOf(unix.Kill(parent, 0)))
	report("kill self", errnoOf(unix.Kill(self, 0)))
	report("tgkill self", errnoOf(unix.Tgkill(self, unix.Gettid(), 0)))
	os.Stdout.WriteString("pid " + strconv.Itoa(self) + " done\n")
}

func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.EINVAL
}
