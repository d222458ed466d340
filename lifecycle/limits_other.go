//go:build !linux

package lifecycle

import (
	"fmt"
	"runtime"

	"go.uber.org/zap"
)

// applyLimits refuses limits where knit does not apply them: a lane must not serve as if
// limited when it is not. Core dumps alone (the default) pass.
func applyLimits(l *BootLimits, _ uint32, _ *zap.Logger) error {
	if l == nil || (*l == BootLimits{Version: l.Version, Core: l.Core}) {
		return nil
	}
	return fmt.Errorf("resource limits are applied on Linux only, not %s", runtime.GOOS)
}
