//go:build linux

package lifecycle

import (
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// applyLimits applies a lane's limits to its own process, before it maps its region and
// serves. A limit above the process's current hard limit is lowered to it: an unprivileged
// process cannot raise a hard limit, and the stricter bound is still a bound.
func applyLimits(l *BootLimits, lane uint32, log *zap.Logger) error {
	if l == nil {
		return nil
	}
	set := func(res int, name string, cur, hard uint64) error {
		var old unix.Rlimit
		if err := unix.Prlimit(0, res, nil, &old); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hard, cur = min(hard, old.Max), min(cur, old.Max)
		// unix.Prlimit goes through syscall's: for RLIMIT_NOFILE the runtime then gives
		// the lane's own children this limit too, not the one it started with.
		if err := unix.Prlimit(0, res, &unix.Rlimit{Cur: cur, Max: hard}, nil); err != nil {
			return fmt.Errorf("%s %d: %w", name, cur, err)
		}
		return nil
	}
	if !l.Core {
		if err := set(unix.RLIMIT_CORE, "RLIMIT_CORE", 0, 0); err != nil {
			return err
		}
	}
	if l.Data > 0 {
		if err := set(unix.RLIMIT_DATA, "RLIMIT_DATA", uint64(l.Data), uint64(l.Data)); err != nil {
			return err
		}
	}
	if l.Files > 0 {
		if err := set(unix.RLIMIT_NOFILE, "RLIMIT_NOFILE", uint64(l.Files), uint64(l.Files)); err != nil {
			return err
		}
	}
	if l.Procs > 0 {
		if err := set(unix.RLIMIT_NPROC, "RLIMIT_NPROC", uint64(l.Procs), uint64(l.Procs)); err != nil {
			return err
		}
	}
	if l.CPU > 0 {
		// At the soft limit the kernel sends SIGXCPU, which the Go runtime ignores unless
		// asked: the lane says why it goes and exits with ExitCPULimit. Should it not get
		// there, the kernel kills it at the hard limit a second later.
		xcpu := make(chan os.Signal, 1)
		signal.Notify(xcpu, syscall.SIGXCPU)
		go func() {
			<-xcpu
			log.Error("CPU time limit used up: the lane ends", zap.Int64("limit_s", l.CPU))
			fmt.Fprintf(os.Stderr, "knit lane %d: CPU time limit of %ds used up\n", lane, l.CPU)
			os.Exit(ExitCPULimit)
		}()
		if err := set(unix.RLIMIT_CPU, "RLIMIT_CPU", uint64(l.CPU), uint64(l.CPU)+1); err != nil {
			return err
		}
	}
	if l.GoMemory > 0 {
		debug.SetMemoryLimit(l.GoMemory)
	}
	log.Debug("resource limits applied", zap.Int64("data", l.Data), zap.Int64("go_memory", l.GoMemory),
		zap.Int64("cpu_s", l.CPU), zap.Int64("files", l.Files), zap.Int64("procs", l.Procs), zap.Bool("core", l.Core))
	return nil
}
