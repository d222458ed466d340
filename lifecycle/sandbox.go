package lifecycle

import (
	"errors"
	"fmt"
	"path/filepath"
)

// SandboxMode says whether a sandbox layer is applied, and what a lane does when the kernel
// cannot apply all of it.
type SandboxMode int

// Sandbox modes.
const (
	// SandboxOff applies nothing (the default).
	SandboxOff SandboxMode = iota
	// SandboxBestEffort applies what the kernel supports; what it cannot enforce is logged
	// once, when the pool starts (and at Debug by each lane that starts).
	SandboxBestEffort
	// SandboxRequired makes a lane that cannot apply the whole layer fail to start
	// (WORKER_STARTUP_FAILED, saying why), so NewPool fails instead of serving unconfined.
	SandboxRequired
)

func (m SandboxMode) String() string {
	switch m {
	case SandboxOff:
		return "off"
	case SandboxBestEffort:
		return "best effort"
	case SandboxRequired:
		return "required"
	}
	return fmt.Sprintf("SandboxMode(%d)", int(m))
}

// Sandbox is knit.Sandbox as a lane's boot record carries it; knit.Sandbox documents its
// layers and the privileges a sandboxed lane drops. The lane applies it itself, after it
// has mapped its region and before it serves its first call (a spare when it becomes a
// lane).
type Sandbox struct {
	Landlock Landlock `json:"landlock"`
	Seccomp  Seccomp  `json:"seccomp"`
}

// Landlock is knit.Landlock (documented there) in a boot record.
type Landlock struct {
	Mode         SandboxMode `json:"mode,omitempty"`
	ReadOnly     []string    `json:"ro,omitempty"`
	Writable     []string    `json:"rw,omitempty"`
	AllowNetwork bool        `json:"net,omitempty"`
}

// Seccomp is knit's seccomp preset: filters, installed on every thread of the lane, that
// make these system calls fail with EPERM: fork, vfork, execve, execveat, clone without
// CLONE_THREAD (the Go runtime's threads use clone with it, and keep working); ptrace,
// process_vm_readv/writev, pidfd_open, pidfd_getfd, pidfd_send_signal, kcmp,
// process_madvise, process_mrelease; mount and the new mount API, umount2, pivot_root,
// chroot; unshare, setns; kexec_load, kexec_file_load, reboot, init_module, finit_module,
// delete_module; bpf, perf_event_open, userfaultfd; keyctl, add_key, request_key; swapon,
// swapoff, acct, quotactl; io_uring_setup/enter/register (io_uring runs operations that
// seccomp never sees); name_to_handle_at, open_by_handle_at; tkill.
//
// And every call through which a process acts on another, unless it names the lane itself:
// signals (kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo reach the lane's pid only, not
// its group nor -1); limits and scheduling (prlimit64, setpriority, sched_setaffinity,
// sched_setscheduler, sched_setparam, sched_setattr, ioprio_set, migrate_pages,
// move_pages, get_robust_list take pid 0 or the lane's; setpriority and ioprio_set never a
// group or a user); setpgid (the lane cannot join another process group, the host's
// included); and asking the kernel to signal another process or act on a terminal: fcntl
// F_SETOWN, F_SETOWN_EX, F_SETSIG, the ioctls FIOSETOWN, SIOCSPGRP, TIOCSPGRP and TIOCSTI.
// The lane's own threads count as other processes there (sched_setaffinity on a thread id
// fails). So a lane can neither kill its host nor lower its limits, renice it or take its
// process group.
//
// Where the kernel has Landlock ABI 2 (Linux 5.19) and the Landlock layer is off, the preset
// also puts the lane in a Landlock domain of its own that denies every write beneath /proc
// and /sys and allows writes elsewhere (with the Landlock layer on, its domain does that
// work, and its policy decides what the lane may write): it keeps the lane off other processes' /proc/<pid>/mem, environ and fd
// (ptrace-mode access to a process outside the domain), off /proc/<host>/oom_score_adj, off
// the cgroup filesystems (a lane cannot make, or move into, a cgroup outside its own) and
// off sysfs. Without it a required preset fails the lane; a best-effort one goes on
// without, logged as downgraded.
//
// clone3 fails with ENOSYS, so that C libraries fall back to clone, whose flags the filter
// can check. Any system call through a foreign ABI (32-bit x86 on amd64, x32) fails with
// ENOSYS.
type Seccomp struct {
	Mode SandboxMode `json:"mode,omitempty"`
}

// Enabled reports whether any layer is on.
func (s Sandbox) Enabled() bool {
	return s.Landlock.Mode != SandboxOff || s.Seccomp.Mode != SandboxOff
}

// Check refuses a sandbox configuration no lane could apply: unknown modes, relative or
// empty paths.
func (s Sandbox) Check() error {
	for _, m := range []SandboxMode{s.Landlock.Mode, s.Seccomp.Mode} {
		if m < SandboxOff || m > SandboxRequired {
			return fmt.Errorf("sandbox: unknown mode %d", int(m))
		}
	}
	for _, paths := range [][]string{s.Landlock.ReadOnly, s.Landlock.Writable} {
		for _, p := range paths {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("sandbox: Landlock path %q is not absolute", p)
			}
		}
	}
	return nil
}

// errSandboxUnsupported is the cause of every failure to apply a required layer.
var errSandboxUnsupported = errors.New("not supported here")
