//go:build linux

package seccompguard

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data: the system call number, then (after arch and the
// instruction pointer) six 64-bit arguments.
const (
	nrOffset   = 0
	argsOffset = 16
)

// FIOSETOWN is the socket ioctl that does what fcntl(F_SETOWN) does (asm-generic/sockios.h;
// x/sys/unix does not name it).
const fioSetOwn = 0x8901

// OthersSupported reports whether DenyOthers knows this architecture's constants and
// argument layout (little-endian, asm-generic ioctl numbers).
func OthersSupported() bool {
	switch runtime.GOARCH {
	case "amd64", "arm64", "riscv64", "loong64", "ppc64le", "386", "arm":
		return true
	}
	return false
}

// DenyOthers installs, on every thread of the process (SECCOMP_FILTER_FLAG_TSYNC), a filter
// that makes the system calls through which a process acts on another one fail with EPERM,
// unless they name the caller itself (pid self, or 0 where 0 means the caller):
//
//   - signals: kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo reach pid self only (not 0,
//     the process group, nor -1, every process);
//   - resources and scheduling: prlimit64, sched_setaffinity, sched_setscheduler,
//     sched_setparam, sched_setattr, migrate_pages, move_pages, get_robust_list take pid 0 or
//     self; setpriority and ioprio_set only for a single process (not a group or a user),
//     0 or self;
//   - process groups: setpgid only with pid and pgid each 0 or self, so the caller cannot
//     join another group (its host's) nor move another process;
//   - signal owners: fcntl F_SETOWN, F_SETOWN_EX and F_SETSIG, and the ioctls FIOSETOWN and
//     SIOCSPGRP, which would have the kernel signal another process when a descriptor is
//     ready; and the terminal ioctls TIOCSPGRP and TIOCSTI, which change the foreground
//     group of, or type input into, a terminal the host may read.
//
// A process's own threads count as other processes here (sched_setaffinity on a thread id
// fails): the filter knows only the process id, which it is built with, and which cannot
// change once the lane may neither fork nor exec.
//
// Each argument is compared on its low 32 bits: the kernel reads these arguments as int or
// unsigned int and ignores the high half, so a caller setting it cannot slip past. The
// caller must have set no_new_privs (or hold CAP_SYS_ADMIN).
func DenyOthers(self int) error {
	if !OthersSupported() {
		return fmt.Errorf("knit/seccompguard: no process filter for %s", runtime.GOARCH)
	}
	return install(othersProgram(uint32(self)))
}

func install(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	switch {
	case errno != 0:
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	case r != 0: // TSYNC names a thread it could not synchronise
		return fmt.Errorf("seccomp: thread %d could not take the filter", r)
	}
	return nil
}

// A check is one system call's rule: the call is allowed when every arg condition holds
// (each argument's low half is one of its values), or, for a deny rule, refused when any
// listed argument holds one of its values.
type check struct {
	nr   uintptr
	args []argIn
	deny bool // refuse when args[0] matches (a single argument), allow otherwise
}

type argIn struct {
	arg    int
	values []uint32
}

// othersRules are DenyOthers' rules for a process whose pid is self.
func othersRules(self uint32) []check {
	selfOnly := func(nr uintptr) check { return check{nr: nr, args: []argIn{{0, []uint32{self}}}} }
	selfOrZero := func(nr uintptr, args ...int) check {
		c := check{nr: nr}
		for _, a := range args {
			c.args = append(c.args, argIn{a, []uint32{0, self}})
		}
		return c
	}
	rules := []check{
		selfOnly(unix.SYS_KILL), selfOnly(unix.SYS_TGKILL),
		selfOnly(unix.SYS_RT_SIGQUEUEINFO), selfOnly(unix.SYS_RT_TGSIGQUEUEINFO),
		selfOrZero(unix.SYS_PRLIMIT64, 0),
		selfOrZero(unix.SYS_SCHED_SETAFFINITY, 0), selfOrZero(unix.SYS_SCHED_SETSCHEDULER, 0),
		selfOrZero(unix.SYS_SCHED_SETPARAM, 0), selfOrZero(unix.SYS_SCHED_SETATTR, 0),
		selfOrZero(unix.SYS_MIGRATE_PAGES, 0), selfOrZero(unix.SYS_MOVE_PAGES, 0),
		selfOrZero(unix.SYS_GET_ROBUST_LIST, 0),
		selfOrZero(unix.SYS_SETPGID, 0, 1),
		{nr: unix.SYS_SETPRIORITY, args: []argIn{{0, []uint32{unix.PRIO_PROCESS}}, {1, []uint32{0, self}}}},
		{nr: unix.SYS_IOPRIO_SET, args: []argIn{{0, []uint32{ioprioWhoProcess}}, {1, []uint32{0, self}}}},
		{nr: unix.SYS_FCNTL, deny: true, args: []argIn{{1, []uint32{unix.F_SETOWN, unix.F_SETOWN_EX, unix.F_SETSIG}}}},
		{nr: unix.SYS_IOCTL, deny: true, args: []argIn{{1, []uint32{fioSetOwn, unix.SIOCSPGRP, unix.TIOCSPGRP, unix.TIOCSTI}}}},
	}
	return rules
}

// ioprioWhoProcess is IOPRIO_WHO_PROCESS (linux/ioprio.h).
const ioprioWhoProcess = 1

// othersProgram compiles the rules: for each, a block that is entered when the call number
// matches and ends in a return; calls no rule names are allowed (the preset's other filters
// decide them).
func othersProgram(self uint32) []unix.SockFilter {
	var prog []unix.SockFilter
	ld := func(off uint32) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off}
	}
	ret := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k} }
	const (
		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	for _, r := range othersRules(self) {
		var body []unix.SockFilter
		if r.deny {
			// Load the argument; each matching value jumps to the refusal at the end.
			a := r.args[0]
			body = append(body, ld(argLow(a.arg)))
			for i, v := range a.values {
				// Instructions after this one up to the refusal: the other compares and
				// the allow.
				toDeny := uint8(len(a.values) - i)
				body = append(body, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: toDeny, K: v})
			}
			body = append(body, ret(allow), ret(eperm))
		} else {
			// Each argument must equal one of its values: a match skips to the next
			// argument's load; falling through every compare reaches the refusal.
			var blocks [][]unix.SockFilter
			for _, a := range r.args {
				blk := []unix.SockFilter{ld(argLow(a.arg))}
				for i, v := range a.values {
					// A match jumps past the rest of this argument's compares and its
					// refusal.
					past := uint8(len(a.values) - i)
					blk = append(blk, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: past, K: v})
				}
				blk = append(blk, ret(eperm))
				blocks = append(blocks, blk)
			}
			for _, b := range blocks {
				body = append(body, b...)
			}
			body = append(body, ret(allow))
		}
		// Enter the block when the number matches; skip it otherwise.
		prog = append(prog, ld(nrOffset),
			unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: uint8(len(body)), K: uint32(r.nr)})
		prog = append(prog, body...)
	}
	return append(prog, ret(allow))
}

// argLow is the offset of argument i's low 32 bits in struct seccomp_data (the supported
// architectures are little-endian).
func argLow(i int) uint32 { return uint32(argsOffset + 8*i) }
