//go:build unix && !linux

package pgroup

import "syscall"

// Attr makes a started process the leader of a new process group. (Only Linux can also
// tie it to the host's life.)
func Attr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
