// Package hostguard is what a host can do for itself against the processes it starts,
// whatever their sandbox: put back the resource limits another process of its user lowered.
//
// A process of the host's user that is not sandboxed can always do anything to the host
// (ptrace it, write its memory through /proc/<pid>/mem, kill it): nothing in the host can
// prevent that, only the sandbox of the process (lifecycle's seccomp preset). What this
// package can undo is the damage that lasts: prlimit64 on the host. A lowered soft limit of
// RLIMIT_NOFILE leaves the host unable to open a file, or a lane to restart; of RLIMIT_AS or
// RLIMIT_DATA, unable to grow its heap; of RLIMIT_NPROC, unable to start a lane. The host
// checks its limits against what they were when it started (Snapshot.Restore), say at each
// watchdog tick, and raises what was lowered back.
//
// What it cannot undo: a hard limit lowered below what it was, without CAP_SYS_RESOURCE
// (the soft limit goes back as far as the new hard limit allows; Restore says what stays
// lowered); and RLIMIT_CPU lowered below the CPU time the host has used, for which the
// kernel kills the host (SIGKILL at the hard limit) at its next tick, before any check
// can run.
package hostguard

import (
	"errors"
	"fmt"
)

// ErrUnsupported is returned where there are no rlimits to guard.
var ErrUnsupported = errors.New("knit/hostguard: requires Linux")

// Limit is a soft and a hard resource limit.
type Limit struct{ Soft, Hard uint64 }

// Infinity is RLIM_INFINITY.
const Infinity = ^uint64(0)

func (l Limit) String() string { return fmt.Sprintf("%s/%s", limitText(l.Soft), limitText(l.Hard)) }

func limitText(v uint64) string {
	if v == Infinity {
		return "unlimited"
	}
	return fmt.Sprint(v)
}

// Change is one limit Restore found lowered: what it was at the snapshot, what Restore found,
// and what it is now; Err says why Now is still below Want.
type Change struct {
	Resource string
	Want     Limit
	Found    Limit
	Now      Limit
	Err      error `json:"-"`
}
