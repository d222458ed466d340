// Package seccompguard installs the seccomp filters knit writes by hand, where a library's
// filter cannot say what is needed: a guard that makes every system call made through a
// foreign ABI (32-bit x86 on amd64, say) fail, so that a deny-list filter written for the
// native ABI cannot be bypassed through another (DenyForeignArch); and a filter that keeps a
// process from acting on any other through the calls that take a pid or name a signal's
// recipient (DenyOthers), which compares arguments on their low 32 bits as the kernel reads
// them. Which calls the sandbox preset denies outright stays the preset's job (lifecycle).
package seccompguard

import "errors"

// ErrUnsupported is returned on platforms without seccomp.
var ErrUnsupported = errors.New("knit/seccompguard: seccomp requires Linux")
