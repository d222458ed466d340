// Package privs takes from a process what it could use against other processes of its
// user: capabilities (which let root bypass permission checks, ptrace's among them), the
// ability to gain privileges again through exec (no_new_privs), and being dumpable (which
// lets processes of the same user open its /proc/<pid>/mem, environ and fd). A sandboxed
// lane calls it on itself before its seccomp filter goes on (lifecycle).
//
// Capabilities and no_new_privs are per thread in Linux: every function here that changes
// them does so on every thread of the process at once, through libpsx (which, in a binary
// linked with cgo, has each thread make the call; without cgo it is
// syscall.AllThreadsSyscall). Threads started later inherit the result.
package privs

import "errors"

// ErrUnsupported is returned where Linux's mechanisms do not exist.
var ErrUnsupported = errors.New("knit/privs: requires Linux")

// Thread is what /proc reports of one thread's privileges.
type Thread struct {
	TID                                      int
	Inheritable, Permitted, Effective, Bound uint64
	Ambient                                  uint64
	NoNewPrivs                               bool
}
