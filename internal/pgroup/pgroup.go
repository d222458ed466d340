// Package pgroup puts a lane process in a process group of its own, tied to the host's life,
// and signals that group whole. It knows nothing of lanes: a pid and a signal.
package pgroup

import "syscall"

// Attr makes a started process the leader of a new process group, killed (SIGKILL) when the
// thread that started it ends, which for a Go host means when the host process dies.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// Signal sends sig to the whole process group that pid leads: the process and the children
// it has not moved to groups of their own. A pid of 0 or less names no group: nothing is
// sent (signalling group 0 would reach the caller's own).
func Signal(pid int, sig syscall.Signal) error {
	if pid <= 0 {
		return syscall.ESRCH
	}
	return syscall.Kill(-pid, sig)
}
