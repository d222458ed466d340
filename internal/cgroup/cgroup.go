// Package cgroup puts knit's process lanes in cgroups of their own: one directory per pool
// (knit-<host pid>-<pool>), one per lane process under it, with the lane's limits (memory,
// pids, CPU bandwidth). It reads what the kernel counted there (out-of-memory kills) and
// kills everything in a lane's cgroup at once, descendants that left the lane's process
// group included.
//
// It drives cgroup v2 (a pure v2 host, or the unified hierarchy of a hybrid one) and cgroup
// v1 (the memory, pids, cpu and freezer hierarchies of a legacy or hybrid host) through
// github.com/containerd/cgroups/v3. It must never remove, kill in or change a cgroup it did
// not create, with two exceptions: what cgroup v2 requires to give a child cgroup controllers
// (enabling them in the cgroup.subtree_control of its ancestors), and Sweep, which removes
// the knit-<pid>-<pool> directories of knit hosts that have died.
package cgroup

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Version is a cgroup version.
type Version int

// Versions.
const (
	Auto Version = 0 // v2 on a pure v2 host, v1 on a hybrid or legacy one
	V1   Version = 1
	V2   Version = 2
)

func (v Version) String() string {
	switch v {
	case V1:
		return "cgroup v1"
	case V2:
		return "cgroup v2"
	}
	return "auto"
}

// Limits are what one lane's cgroup enforces; a zero field enforces nothing.
type Limits struct {
	Memory    int64  // bytes of memory (v2 memory.max, no swap; v1 memory.limit_in_bytes and memsw)
	Pids      int64  // processes and threads (pids.max)
	CPUQuota  int64  // microseconds of CPU time per CPUPeriod (v2 cpu.max; v1 cpu.cfs_quota_us)
	CPUPeriod uint64 // microseconds; 0: 100000
}

// Options say where a pool's cgroups go.
type Options struct {
	Version Version
	// Parent is the cgroup (a path inside the hierarchy, e.g. /system.slice/app.service/knit)
	// under which the pool's directory is created. Default: this process's own cgroup. On
	// v2, a parent that holds processes cannot give its children controllers (the "no
	// internal processes" rule): limits then need a delegated parent.
	Parent string
	// Mount is the v2 mount point (default /sys/fs/cgroup, or /sys/fs/cgroup/unified on a
	// hybrid host).
	Mount string
}

// ErrUnavailable wraps every reason the host cannot give its lanes cgroups.
var ErrUnavailable = errors.New("cgroups unavailable")

// KillTimeout bounds how long Kill waits for a cgroup's processes to be gone.
var KillTimeout = 10 * time.Second

// parseKV finds key's value in a "key value" per line file (memory.events, oom_control).
func parseKV(text, key string) (uint64, bool) {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || k != key {
			continue
		}
		var n uint64
		if _, err := fmt.Sscan(strings.TrimSpace(v), &n); err == nil {
			return n, true
		}
	}
	return 0, false
}
