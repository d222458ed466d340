// Package pgroup puts a lane process in a process group of its own, tied to the host's life,
// and signals that group whole. It knows nothing of lanes: a pid and a signal.
package pgroup

import "syscall"

// Signal sends sig to the whole process group that pid leads: the process and the children
// it has not moved to groups of their own. A pid of 0 or less names no group: nothing is
// sent (signalling group 0 would reach the caller's own).
func Signal(pid int, sig syscall.Signal) error {
	if pid <= 0 {
		return syscall.ESRCH
	}
	return syscall.Kill(-pid, sig)
}
