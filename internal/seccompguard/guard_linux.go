//go:build linux

package seccompguard

import "golang.org/x/sys/unix"

// Offset of the arch field in struct seccomp_data.
const archOffset = 4

// DenyForeignArch installs, on every thread of the process (SECCOMP_FILTER_FLAG_TSYNC), a
// filter that lets calls through the native audit architecture native pass to the filters
// installed next to it and makes every other one fail with ENOSYS. The caller must have set
// no_new_privs (or hold CAP_SYS_ADMIN).
func DenyForeignArch(native uint32) error {
	return install(program(native))
}

// program is the guard's classic BPF program.
func program(native uint32) []unix.SockFilter {
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: archOffset},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: native},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
}
