// Package seccompguard installs the one seccomp filter knit writes by hand: a guard that
// makes every system call made through a foreign ABI (32-bit x86 on amd64, say) fail, so that
// a deny-list filter written for the native ABI cannot be bypassed through another. It must
// never decide which native calls are allowed: that is the preset's job (lifecycle).
package seccompguard

import "errors"

// ErrUnsupported is returned on platforms without seccomp.
var ErrUnsupported = errors.New("knit/seccompguard: seccomp requires Linux")
