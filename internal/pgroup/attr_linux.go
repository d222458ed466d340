package pgroup

import "syscall"

// Attr makes a started process the leader of a new process group, killed (SIGKILL) when the
// thread that started it ends, which for a Go host means when the host process dies.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
