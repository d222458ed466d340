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

// Sandbox confines a process lane: each layer is applied by the lane itself, from its boot
// record, after it has mapped its region and before it serves its first call. A spare gets
// it when it becomes a lane. Goroutine lanes ignore it: they share the host's process.
type Sandbox struct {
	// Landlock restricts the files the lane may open, its TCP connections and the
	// processes it may signal.
	Landlock Landlock `json:"landlock"`
	// Seccomp denies process creation and other dangerous system calls.
	Seccomp Seccomp `json:"seccomp"`
}

// Landlock is a Landlock policy: once applied, the lane may open files only beneath
// ReadOnly (read, list, execute) and Writable (also create, write, truncate, remove), may
// not bind or connect TCP sockets unless AllowNetwork, and may not signal processes or
// connect to abstract unix sockets outside its domain (the host, other lanes). Descriptors
// the lane holds already (its region, doorbells, stdout, stderr) keep working.
//
// Required needs Landlock ABI 3 (Linux 6.2: the whole filesystem policy, truncation
// included), and ABI 4 (Linux 6.7) when the network is denied. Rights of later ABIs
// (ioctl on devices: 5; signal and abstract socket scoping: 6) are applied when the kernel
// has them, in either mode.
type Landlock struct {
	Mode SandboxMode `json:"mode,omitempty"`
	// ReadOnly and Writable are absolute paths of directories (the rule covers everything
	// beneath) or files. A path that does not exist when the lane starts fails it.
	ReadOnly []string `json:"ro,omitempty"`
	Writable []string `json:"rw,omitempty"`
	// AllowNetwork leaves TCP bind and connect alone. Landlock does not cover UDP or raw
	// sockets before ABI 10, nor pathname unix sockets before ABI 9.
	AllowNetwork bool `json:"net,omitempty"`
}

// Seccomp is knit's seccomp preset: a filter, installed on every thread of the lane, that
// makes these system calls fail with EPERM: fork, vfork, execve, execveat, clone without
// CLONE_THREAD (the Go runtime's threads use clone with it, and keep working); ptrace,
// process_vm_readv/writev, pidfd_getfd; mount and the new mount API, umount2, pivot_root,
// chroot; unshare, setns; kexec_load, kexec_file_load, reboot, init_module, finit_module,
// delete_module; bpf, perf_event_open, userfaultfd; keyctl, add_key, request_key; swapon,
// swapoff, acct, quotactl; io_uring_setup/enter/register (io_uring runs operations that
// seccomp never sees); name_to_handle_at, open_by_handle_at; signals to any process but the
// lane itself (kill, tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo aimed elsewhere, tkill,
// pidfd_send_signal), so a lane cannot kill its host. clone3 fails with ENOSYS, so
// that C libraries fall back to clone, whose flags the filter can check. Any system call
// through a foreign ABI (32-bit x86 on amd64, x32) fails with ENOSYS.
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
