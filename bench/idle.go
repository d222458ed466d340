//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// idleWindow is how long the idle rows watch a pool doing nothing: 1s
// (issue 9's definition) unless -idle says otherwise; the smoke test
// shortens it. -short keeps 1s: whatever a pool does after its last call
// (a spin, a timer) is a fixed cost, which a shorter window inflates.
var idleWindow = time.Second

// clockTicksPerSec is USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat. Linux fixes it at 100 on every architecture Go supports
// (it is not the kernel's HZ), and reading sysconf(_SC_CLK_TCK) would need
// cgo.
const clockTicksPerSec = 100

// idleResult is what an idle row measured: the CPU time the host process
// and every lane and spare process of the pool used while the pool was idle.
type idleResult struct {
	// WindowNs is the wall time between the two samples.
	WindowNs int64 `json:"window_ns"`
	// CPUPercent is the CPU time of all the processes, as a percentage of
	// one core over the window, from the precise source (Source).
	CPUPercent float64 `json:"cpu_percent_of_core"`
	// HostPercent and LanesPercent split CPUPercent between the host and
	// the lane and spare processes.
	HostPercent  float64 `json:"host_percent_of_core"`
	LanesPercent float64 `json:"lanes_percent_of_core"`
	// TicksPercent is the same total from utime+stime in /proc/<pid>/stat,
	// in clock ticks of 10ms: over 1s one tick is 1% of a core, so this
	// figure is coarse; it is kept as a cross-check.
	TicksPercent float64 `json:"ticks_percent_of_core"`
	// Source is "cpuclock" when CPUPercent comes from each process's CPU-time
	// clock (clock_gettime on the clock clock_getcpuclockid(3) names: the
	// nanosecond run time of all its threads, exited ones included), "stat"
	// when that clock cannot be read and the ticks are all there is.
	//
	// Runs before 2026-12-02 summed the threads' /proc/<pid>/task/*/schedstat
	// ("schedstat"), which the kernel brings up to date only at ticks and
	// switches, so it lags for a running thread: the host reads its own right
	// after ~10 ms spent reading the other processes' /proc files, and that
	// reading was billed to the idle window (0.2-1.6 % of a core for the host
	// in reruns of one build; perf over a window showed about 0.1 %).
	Source string `json:"source"`
	// HostPID, LanePIDs and SparePIDs are the processes measured (no lane
	// PIDs for goroutine lanes).
	HostPID   int   `json:"host_pid"`
	LanePIDs  []int `json:"lane_pids,omitempty"`
	SparePIDs []int `json:"spare_pids,omitempty"`
}

// cpuSample is one process's CPU time at one moment.
type cpuSample struct {
	ticks   uint64 // utime+stime from /proc/<pid>/stat
	ns      uint64 // the process CPU-time clock
	precise bool   // ns is valid
}

// sampleCPU reads pid's CPU time.
func sampleCPU(pid int) (cpuSample, error) {
	var s cpuSample
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	if s.ticks, err = parseStatTicks(string(data)); err != nil {
		return s, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	s.ns, err = processClockNs(pid)
	switch {
	case err == nil:
		s.precise = true
	case errors.Is(err, errProcessGone):
		return s, err
	default:
		// No such clock here (EINVAL): the ticks are all there is.
	}
	return s, nil
}

// parseStatTicks returns utime+stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may contain spaces and parentheses, so fields are counted from the last
// ')'.
func parseStatTicks(line string) (uint64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, errors.New("no ')' in stat line")
	}
	f := strings.Fields(line[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("stat line has %d fields after the name", len(f))
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return utime + stime, nil
}

// processClockNs reads the CPU-time clock of process pid, the clock
// clock_getcpuclockid(3) returns: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
// in the kernel's encoding. The kernel adds the current slice of a thread
// that is running, which a thread's schedstat does not.
func processClockNs(pid int) (uint64, error) {
	const cpuclockSched = 2
	var ts unix.Timespec
	err := unix.ClockGettime(^int32(pid)<<3|cpuclockSched, &ts)
	switch {
	case err == nil:
		return uint64(ts.Nano()), nil
	case errors.Is(err, unix.ESRCH):
		return 0, fmt.Errorf("process %d: %w", pid, errProcessGone)
	default:
		return 0, fmt.Errorf("CPU clock of process %d: %w", pid, err)
	}
}

var errProcessGone = errors.New("process is gone")

// idleProcs names the processes of an idle measurement.
type idleProcs struct {
	host   int
	lanes  []int
	spares []int
}

func (p idleProcs) all() []int {
	return append(append([]int{p.host}, p.lanes...), p.spares...)
}

// measureIdle samples the CPU time of procs, sleeps for window and samples
// again. sameProcs is called after the second sample and must report an
// error if the set of processes changed meanwhile (a lane restarted, a spare
// was taken): their CPU time would then be partly lost.
func measureIdle(procs idleProcs, window time.Duration, sameProcs func() error) (*idleResult, error) {
	pids := procs.all()
	before := make([]cpuSample, len(pids))
	// The host (pids[0]) samples itself last before the window and first after it, so
	// that its reading of the other processes' /proc files is not billed to the pool.
	for i := len(pids) - 1; i >= 0; i-- {
		s, err := sampleCPU(pids[i])
		if err != nil {
			return nil, err
		}
		before[i] = s
	}
	t0 := time.Now()
	time.Sleep(window)
	after := make([]cpuSample, len(pids))
	for i, pid := range pids {
		s, err := sampleCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("after the idle window: %w", err)
		}
		after[i] = s
	}
	wall := time.Since(t0)
	if err := sameProcs(); err != nil {
		return nil, err
	}
	res := &idleResult{WindowNs: wall.Nanoseconds(), HostPID: procs.host, LanePIDs: procs.lanes, SparePIDs: procs.spares, Source: "cpuclock"}
	pct := func(ns float64) float64 { return 100 * ns / float64(wall.Nanoseconds()) }
	var ticks uint64
	for i := range pids {
		ticks += after[i].ticks - before[i].ticks // process-wide: never decreases
		if !before[i].precise || !after[i].precise {
			res.Source = "stat"
		}
	}
	res.TicksPercent = pct(float64(ticks) * 1e9 / clockTicksPerSec)
	if res.Source == "stat" {
		res.CPUPercent = res.TicksPercent
		host := after[0].ticks - before[0].ticks
		res.HostPercent = pct(float64(host) * 1e9 / clockTicksPerSec)
		res.LanesPercent = res.CPUPercent - res.HostPercent
		return res, nil
	}
	for i := range pids {
		d := 0.0
		if after[i].ns > before[i].ns { // a process clock never goes back
			d = float64(after[i].ns - before[i].ns)
		}
		if i == 0 {
			res.HostPercent = pct(d)
		} else {
			res.LanesPercent += pct(d)
		}
	}
	res.CPUPercent = res.HostPercent + res.LanesPercent
	return res, nil
}
