//go:build !linux

package lifecycle

import (
	"fmt"
	"runtime"

	"go.uber.org/zap"
)

// SandboxDowngrades: outside Linux a best-effort layer is not applied at all.
func SandboxDowngrades(s Sandbox) []string {
	if s.Enabled() {
		return []string{fmt.Sprintf("sandbox not applied: Landlock and seccomp exist only on Linux, not %s", runtime.GOOS)}
	}
	return nil
}

// applySandbox fails for a required layer: Landlock and seccomp exist only on Linux.
func applySandbox(s *Sandbox, log *zap.Logger) error {
	if s == nil || !s.Enabled() {
		return nil
	}
	if err := s.Check(); err != nil {
		return err
	}
	if s.Landlock.Mode == SandboxRequired || s.Seccomp.Mode == SandboxRequired {
		return fmt.Errorf("sandbox required: %w: Landlock and seccomp exist only on Linux, not %s",
			errSandboxUnsupported, runtime.GOOS)
	}
	log.Debug("sandbox not applied (best effort): Landlock and seccomp exist only on Linux")
	return nil
}
