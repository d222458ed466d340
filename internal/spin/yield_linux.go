//go:build linux

package spin

import "golang.org/x/sys/unix"

// Yield gives the CPU to another runnable thread of any process (sched_yield). A spinner in a
// process with nothing else to run calls it so that, on a machine with fewer cores than
// spinners, the process that would produce its work gets the core.
func Yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
