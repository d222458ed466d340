//go:build linux

package privs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// NoNewPrivs sets no_new_privs on every thread: from now on exec can grant nothing (no
// setuid, setgid or file capabilities, and root's exec gains no capability it lacks).
func NoNewPrivs() error {
	if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", e)
	}
	return nil
}

// DropCapabilities empties the effective, permitted and inheritable capability sets of every
// thread, and with them the ambient set (the kernel keeps no capability ambient that is not
// both permitted and inheritable). A process running as root keeps its uid, and with it the
// owner's rights over root's files; it loses everything a capability grants (bypassing
// permission and ptrace checks, raising limits, changing other processes' scheduling,
// mounts, raw I/O, the clock, the host name, ...).
//
// The bounding set stays: it only caps what exec may grant, and with no_new_privs set (call
// NoNewPrivs) and nothing permitted, exec grants nothing — root's exec of any file included
// (the kernel limits the new permitted set to the old one under no_new_privs). Emptying it
// would cost one all-thread round per capability (41 on Linux 6.x), each of which signals
// every thread: on a busy machine that added 100 to 200 ms to a lane's start.
func DropCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData // zero: nothing effective, permitted or inheritable
	if _, _, e := psx.Syscall3(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// Undumpable makes the process not dumpable (PR_SET_DUMPABLE 0): processes of its user
// without CAP_SYS_PTRACE can no longer open its /proc/<pid>/mem, environ, fd, maps... nor
// ptrace it, and its /proc files belong to root. It also dumps no core. It applies to the
// whole process and lasts until it execs.
func Undumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}

// Dumpable reports the process's dumpable setting (0: not dumpable, 1: dumpable, 2: only by
// root).
func Dumpable() (int, error) {
	r, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("prctl(PR_GET_DUMPABLE): %w", err)
	}
	return r, nil
}

// Threads reads every thread's capability sets and no_new_privs from
// /proc/self/task/*/status.
func Threads() ([]Thread, error) {
	files, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("knit/privs: listing threads: %v", err)
	}
	var out []Thread
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) { // the thread ended meanwhile
			continue
		}
		if err != nil {
			return nil, err
		}
		t, err := parseStatus(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// parseStatus reads the Pid (the thread's id, in a task's status), Cap* and NoNewPrivs
// lines of a status file.
func parseStatus(b []byte) (Thread, error) {
	var t Thread
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		hex := func(dst *uint64) error {
			n, err := strconv.ParseUint(v, 16, 64)
			*dst = n
			seen++
			return err
		}
		var err error
		switch k {
		case "Pid":
			t.TID, err = strconv.Atoi(v)
		case "CapInh":
			err = hex(&t.Inheritable)
		case "CapPrm":
			err = hex(&t.Permitted)
		case "CapEff":
			err = hex(&t.Effective)
		case "CapBnd":
			err = hex(&t.Bound)
		case "CapAmb":
			err = hex(&t.Ambient)
		case "NoNewPrivs":
			t.NoNewPrivs = v == "1"
		}
		if err != nil {
			return Thread{}, fmt.Errorf("%s %q: %w", k, v, err)
		}
	}
	if seen < 4 { // CapAmb is missing before Linux 4.3
		return Thread{}, errors.New("no capability lines")
	}
	return t, nil
}
