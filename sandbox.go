package knit

import (
	"go.uber.org/zap"

	"github.com/knitgo/knit/lifecycle"
)

// Sandbox confines process lanes (ProcessConfig.Sandbox): a Landlock policy and a seccomp
// preset, each off, best effort or required, applied by each lane itself after it has
// mapped its region and before it serves its first call (a spare gets it when it becomes a
// lane). Goroutine lanes ignore it: they share the host's process. docs/process-lanes.md,
// "Containing untrusted or crashy code", says what each layer stops and what it does not.
//
// Whatever the layers, a lane with any of them on also sets no_new_privs, holds no
// capability on any thread — none effective, permitted, inheritable or ambient; the bounding
// set stays, and grants nothing at exec under no_new_privs — so a lane running as root keeps
// its uid, not the power to bypass permission and ptrace checks, raise limits or renice
// others; and it makes itself non-dumpable, so that other lanes of its user cannot open its
// /proc/<pid>/mem (it dumps no core either, whatever Limits.CoreDumps says).
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

// Seccomp is knit's seccomp preset: filters, installed on every thread of the lane, under
// which the system calls that create processes, act on any process but the lane itself
// (signals, limits, scheduling, process groups, another process's memory), change the
// system or escape the filter fail with EPERM, and writes beneath /proc and /sys are denied:
// a lane under it cannot kill its host, lower its limits, renice it or read its memory.
// lifecycle.Seccomp lists every call; docs/process-lanes.md says what stays allowed.
type Seccomp struct {
	Mode SandboxMode `json:"mode,omitempty"`
}

// SandboxMode says whether a sandbox layer applies and what happens when the kernel lacks it.
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

func (m SandboxMode) String() string { return lifecycle.SandboxMode(m).String() }

// MarshalText names the mode (JSON carries "required", not 2).
func (m SandboxMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Enabled reports whether any layer is on.
func (s Sandbox) Enabled() bool {
	return s.Landlock.Mode != SandboxOff || s.Seccomp.Mode != SandboxOff
}

// lane is the sandbox as a lane's boot record carries it.
func (s Sandbox) lane() lifecycle.Sandbox {
	l := s.Landlock
	return lifecycle.Sandbox{
		Landlock: lifecycle.Landlock{Mode: lifecycle.SandboxMode(l.Mode), ReadOnly: l.ReadOnly, Writable: l.Writable, AllowNetwork: l.AllowNetwork},
		Seccomp:  lifecycle.Seccomp{Mode: lifecycle.SandboxMode(s.Seccomp.Mode)},
	}
}

// checkSandbox refuses, at NewPool, a sandbox no lane could apply, and logs once what a
// best-effort layer will not enforce on this kernel.
func checkSandbox(cfg Config, caps lifecycle.Caps, log *zap.Logger) error {
	if !caps.Confined || !cfg.Process.Sandbox.Enabled() {
		return nil
	}
	for _, d := range lifecycle.SandboxDowngrades(cfg.Process.Sandbox.lane()) {
		log.Warn("sandbox downgraded (best effort)", zap.String("not_enforced", d))
	}
	return nil
}

// laneSandbox is the sandbox a lane's boot record carries (nil: none).
func laneSandbox(cfg Config) *lifecycle.Sandbox {
	if s := cfg.Process.Sandbox; s.Enabled() {
		l := s.lane()
		return &l
	}
	return nil
}
