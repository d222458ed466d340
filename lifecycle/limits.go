package lifecycle

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ExitCPULimit is the exit status of a lane that received SIGXCPU: it used up the CPU time
// its RLIMIT_CPU allows (BootLimits.CPU).
const ExitCPULimit = 80

// LimitsVersion is the version of BootLimits this lane speaks. A lane refuses to boot from a
// record of a later version: limits it cannot apply must not pass for applied.
const LimitsVersion = 1

// BootLimits are the resource limits a lane process applies to itself, in knit.Main, before
// it serves (the host's ProcessConfig.Limits, less what a cgroup enforces instead). A zero
// field sets nothing, except Core: a lane's core dumps are off unless Core is set.
type BootLimits struct {
	Version  uint32 `json:"v"`
	Data     int64  `json:"data,omitempty"`   // RLIMIT_DATA, bytes: the Go heap cannot grow far past it (docs/process-lanes.md: one huge allocation can)
	GoMemory int64  `json:"go_mem,omitempty"` // debug.SetMemoryLimit, bytes: the GC works harder below Data
	CPU      int64  `json:"cpu_s,omitempty"`  // RLIMIT_CPU, seconds of CPU time over the process's life
	Files    int64  `json:"nofile,omitempty"` // RLIMIT_NOFILE: open descriptors
	Procs    int64  `json:"nproc,omitempty"`  // RLIMIT_NPROC: processes and threads of the lane's user
	Core     bool   `json:"core,omitempty"`   // allow core dumps (default: RLIMIT_CORE 0)
}

// Bounds of what a boot record may ask: beyond them a value is a broken record, not a limit.
const (
	maxLimitBytes = 1 << 50 // 1 PiB
	maxLimitCPU   = 1 << 32 // seconds: 136 years
	maxLimitCount = 1 << 30 // descriptors, processes
)

// Check refuses limits a lane cannot mean to apply: an unknown version, a negative or
// absurd value.
func (l *BootLimits) Check() error {
	switch {
	case l.Version == 0 || l.Version > LimitsVersion:
		return fmt.Errorf("limits version %d, lane speaks %d", l.Version, LimitsVersion)
	case l.Data < 0 || l.Data > maxLimitBytes:
		return fmt.Errorf("data limit %d out of range", l.Data)
	case l.GoMemory < 0 || l.GoMemory > maxLimitBytes:
		return fmt.Errorf("Go memory limit %d out of range", l.GoMemory)
	case l.CPU < 0 || l.CPU > maxLimitCPU:
		return fmt.Errorf("CPU limit %d s out of range", l.CPU)
	case l.Files < 0 || l.Files > maxLimitCount:
		return fmt.Errorf("open-files limit %d out of range", l.Files)
	case l.Procs < 0 || l.Procs > maxLimitCount:
		return fmt.Errorf("process limit %d out of range", l.Procs)
	}
	return nil
}

// ParseBoot decodes a boot record and checks what the lane would apply from it. It never
// panics, whatever data holds.
func ParseBoot(data []byte) (Boot, error) {
	var b Boot
	if err := json.Unmarshal(data, &b); err != nil {
		return Boot{}, err
	}
	if b.Limits != nil {
		if err := b.Limits.Check(); err != nil {
			return Boot{}, fmt.Errorf("boot record: %w", err)
		}
	}
	return b, nil
}

// GoMemoryLimit is the Go runtime's soft memory limit for a lane whose hard memory limit is
// hard: an eighth below it, at least 16 MiB below, at most half of it. The runtime counts
// only what it manages, and the hard limit counts more (a cgroup: page cache, kernel
// memory; RLIMIT_DATA: heap the runtime has released but keeps mapped), so the GC must
// work before the hard limit, not at it.
func GoMemoryLimit(hard int64) int64 {
	if hard <= 0 {
		return 0
	}
	margin := max(hard/8, 16<<20)
	return max(hard-margin, hard/2)
}

// CPUSeconds is the RLIMIT_CPU value for a CPU-time limit: whole seconds, rounded up.
func CPUSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// outOfMemory reports whether a Go runtime failure line says the process ran out of memory
// ("fatal error: runtime: out of memory", "fatal error: runtime: cannot allocate memory",
// "fatal error: out of memory (stackalloc)", ...), or, under an RLIMIT_DATA memory limit and
// no process limit, that cgo could not create a thread ("runtime/cgo: pthread_create failed:
// Resource temporarily unavailable": glibc could not map the thread's stack). A panic value
// saying so is a task's text, not the runtime's: it does not count.
func (x Exit) outOfMemory(failure string) bool {
	if x.DataLimited && strings.HasPrefix(failure, "runtime/cgo: pthread_create failed") {
		return true
	}
	f, ok := strings.CutPrefix(failure, "fatal error: ")
	return ok && (strings.Contains(f, "out of memory") || strings.Contains(f, "cannot allocate memory"))
}

// mib renders a byte count for a message.
func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
