package pool

import (
	"github.com/knitgo/knit/lifecycle"
	"go.uber.org/zap"
)

// Sandbox confines process lanes (ProcessConfig.Sandbox): a Landlock policy and a seccomp
// preset, each off, best effort or required. docs/process-lanes.md, "Containing untrusted
// or crashy code", says what each layer stops and what it does not.
type Sandbox = lifecycle.Sandbox

// Landlock is the filesystem and network policy of a Sandbox.
type Landlock = lifecycle.Landlock

// Seccomp is the system-call preset of a Sandbox.
type Seccomp = lifecycle.Seccomp

// SandboxMode says whether a sandbox layer applies and what happens when the kernel lacks it.
type SandboxMode = lifecycle.SandboxMode

// Sandbox modes.
const (
	// SandboxOff applies nothing (the default).
	SandboxOff = lifecycle.SandboxOff
	// SandboxBestEffort applies what the kernel supports and logs the rest once.
	SandboxBestEffort = lifecycle.SandboxBestEffort
	// SandboxRequired fails a lane that cannot apply the whole layer with
	// WORKER_STARTUP_FAILED, saying why.
	SandboxRequired = lifecycle.SandboxRequired
)

// checkSandbox refuses, at NewPool, a sandbox no lane could apply, and logs once what a
// best-effort layer will not enforce on this kernel.
func checkSandbox(cfg Config, log *zap.Logger) error {
	s := cfg.Process.Sandbox
	if cfg.Runtime != Process || !s.Enabled() {
		return nil
	}
	if err := s.Check(); err != nil {
		return &lifecycle.Error{Code: lifecycle.CodePoolUnavailable, Lane: -1, Message: "invalid Process.Sandbox", Cause: err}
	}
	for _, d := range lifecycle.SandboxDowngrades(s) {
		log.Warn("sandbox downgraded (best effort)", zap.String("not_enforced", d))
	}
	return nil
}

// laneSandbox is the sandbox a lane's boot record carries (nil: none).
func laneSandbox(cfg Config) *lifecycle.Sandbox {
	if s := cfg.Process.Sandbox; s.Enabled() {
		return &s
	}
	return nil
}
