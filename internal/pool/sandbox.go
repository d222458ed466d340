package pool

import (
	"github.com/knitgo/knit/lifecycle"
	"go.uber.org/zap"
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
