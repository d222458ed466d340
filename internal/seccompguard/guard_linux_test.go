//go:build linux

package seccompguard

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const (
	auditArchX86_64  = 0xc000003e
	auditArchI386    = 0x40000003
	auditArchAArch64 = 0xc00000b7
)

// The program, run in a BPF interpreter on struct seccomp_data, lets the native
// architecture through and fails every other one with ENOSYS.
func TestProgram(t *testing.T) {
	raw := program(auditArchX86_64)
	insts := make([]bpf.Instruction, len(raw))
	for i, r := range raw {
		insts[i] = bpf.RawInstruction{Op: r.Code, Jt: r.Jt, Jf: r.Jf, K: r.K}.Disassemble()
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	for arch, want := range map[uint32]uint32{
		auditArchX86_64:  unix.SECCOMP_RET_ALLOW,
		auditArchI386:    unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS),
		auditArchAArch64: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS),
	} {
		// struct seccomp_data: nr, arch, instruction pointer, six arguments. The kernel
		// loads its words in native order, x/net/bpf's VM in network order.
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[0:], 57)
		binary.BigEndian.PutUint32(data[archOffset:], arch)
		got, err := vm.Run(data)
		if err != nil || uint32(got) != want {
			t.Errorf("arch %#x: %#x, %v; want %#x", arch, got, err, want)
		}
	}
}

// Installed in a child process, the guard reaches every thread (TSYNC) and lets the
// child's native calls through.
func TestDenyForeignArchAllThreads(t *testing.T) {
	if os.Getenv("KNIT_SECCOMPGUARD_CHILD") == "1" {
		guardChild()
		return
	}
	native := map[string]uint32{"amd64": auditArchX86_64, "arm64": auditArchAArch64}[runtime.GOARCH]
	if native == 0 {
		t.Skipf("no audit arch known to this test for %s", runtime.GOARCH)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDenyForeignArchAllThreads$")
	cmd.Env = append(os.Environ(), "KNIT_SECCOMPGUARD_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "filtered threads:") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "filtered threads:") && strings.Contains(line, "unfiltered") {
			t.Fatalf("child: %s", line)
		}
	}
}

// guardChild installs the guard with threads already running, then reports the seccomp
// mode of each of its threads.
func guardChild() {
	native := map[string]uint32{"amd64": auditArchX86_64, "arm64": auditArchAArch64}[runtime.GOARCH]
	release := make(chan struct{})
	var locked sync.WaitGroup // each goroutine holds a thread of its own before the filter
	for range 4 {             // threads that exist before the filter
		locked.Add(1)
		go func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
		}()
	}
	locked.Wait()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	if err := DenyForeignArch(native); err != nil {
		panic(err)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) < 5 {
		panic("cannot list threads")
	}
	var report []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			panic(err)
		}
		if strings.Contains(string(b), "Seccomp:\t2\n") {
			report = append(report, "filtered")
		} else {
			report = append(report, "unfiltered")
		}
	}
	close(release)
	os.Stdout.WriteString("filtered threads: " + strings.Join(report, " ") + "\n")
}
