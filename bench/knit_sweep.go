//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// ============================================================================
// knit sweeps — issue 9's shapes, every pool with the DEFAULT Config (only
// Lanes and Runtime set), for both runtimes:
//
//   - "knit R, N lanes: sequential Call" for N in laneSweep: Task.Call with
//     one call in flight (latency vs lane count);
//   - "knit R, 2 lanes: window W" for W in windowSweep, and "knit R, N
//     lanes: window 1024" for N in laneSweep: one goroutine keeps W futures
//     in flight (Task.Go, wait for the oldest, start one more) —
//     throughput vs window and vs lane count;
//   - "knit R, 2 lanes: 1024 goroutines calling": runInFlight goroutines each
//     making one blocking Task.Call after another;
//   - "knit R, 4 lanes: idle CPU": the CPU time the host and every lane and
//     spare process use while a started pool does nothing (a measure row,
//     not a timed loop; see idle.go).
//
// The legacy rows of knitScenarios stay as they were (the plain goroutine
// rows there are the same configuration as "knit goroutine, 2 lanes: ..."),
// so earlier tables keep their rows.
// ============================================================================

// knitIdleLanes is the lane count of the idle rows.
const knitIdleLanes = 4

// knitIdleCalls is how many calls an idle row makes before it watches the
// pool, so every lane has served calls and gone idle.
const knitIdleCalls = 64

func knitSweepScenarios() []scenario {
	var rows []scenario
	seen := map[string]bool{}
	add := func(s scenario) {
		if !seen[s.name] {
			seen[s.name] = true
			rows = append(rows, s)
		}
	}
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		impl := implKnitGoroutine
		if rt == knit.Process {
			impl = implKnitProcess
		}
		cfg := func(lanes int) knit.Config { return knit.Config{Lanes: lanes, Runtime: rt} }
		label := func(lanes int) string {
			if lanes == 1 {
				return fmt.Sprintf("knit %s, 1 lane", rt)
			}
			return fmt.Sprintf("knit %s, %d lanes", rt, lanes)
		}
		for _, n := range laneSweep {
			add(scenario{name: label(n) + ": sequential Call", inFlight: 1,
				meta:  rowMeta{Impl: impl, Shape: shapeRoundTrip, Lanes: n},
				setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(cfg(n)) }})
		}
		window := func(n, w int) scenario {
			return scenario{name: fmt.Sprintf("%s: window %d", label(n), w), inFlight: w,
				meta:  rowMeta{Impl: impl, Shape: shapeWindow, Lanes: n, Window: w},
				setup: func() (func(*testing.B), func() error, error) { return setupKnitWindow(cfg(n), w) }}
		}
		for _, w := range windowSweep {
			add(window(poolWorkers, w))
		}
		for _, n := range laneSweep {
			add(window(n, inFlightTarget))
		}
		add(scenario{name: fmt.Sprintf("%s: %d goroutines calling", label(poolWorkers), inFlightTarget), inFlight: inFlightTarget,
			meta:  rowMeta{Impl: impl, Shape: shapeGoroutines, Lanes: poolWorkers, Window: inFlightTarget},
			setup: func() (func(*testing.B), func() error, error) { return setupKnitInFlight(cfg(poolWorkers)) }})
		add(scenario{name: label(knitIdleLanes) + ": idle CPU",
			meta:    rowMeta{Impl: impl, Shape: shapeIdle, Lanes: knitIdleLanes},
			measure: func(res *result) error { return measureKnitIdleChild(cfg(knitIdleLanes), res) }})
	}
	return rows
}

// measureKnitIdle starts a pool, makes knitIdleCalls calls, waits until its
// spare process (process lanes; one by default) has started so that its
// start-up is not counted, then measures the CPU time of the host and of
// every lane and spare process over idleWindow.
func measureKnitIdle(cfg knit.Config, res *result) (err error) {
	// Earlier rows leave garbage and a heap to give back to the OS: collect
	// and scavenge it now, or the runtime's background GC and scavenger
	// could do it during the window and bill it to the idle pool.
	debug.FreeOSMemory()
	p, err := knit.NewPool(cfg, knitInc) // no watchdog: its ticker would add host CPU
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if cerr := p.Close(ctx); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := uint64(1); i <= knitIdleCalls; i++ {
		got, err := knitInc.Call(ctx, p, i)
		if err != nil {
			return fmt.Errorf("knit: %w", err)
		}
		if got != i+1 {
			return fmt.Errorf("knit: got %d, want %d", got, i+1)
		}
	}
	procs := idleProcs{host: os.Getpid()}
	if cfg.Runtime == knit.Process {
		// The pool starts its spare once it is up; wait (bounded) until it
		// is ready. Polling here is outside the measured window.
		for deadline := time.Now().Add(10 * time.Second); len(p.Stats().Spares) == 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		st := p.Stats()
		for _, l := range st.Lanes {
			if l.PID == 0 {
				return fmt.Errorf("lane %d has no process (state %v)", l.Lane, l.State)
			}
			procs.lanes = append(procs.lanes, l.PID)
		}
		procs.spares = slices.Clone(st.Spares)
	}
	same := func() error {
		if cfg.Runtime != knit.Process {
			return nil
		}
		st := p.Stats()
		var lanes []int
		for _, l := range st.Lanes {
			lanes = append(lanes, l.PID)
		}
		if !slices.Equal(lanes, procs.lanes) || !slices.Equal(st.Spares, procs.spares) {
			return errors.New("the pool's processes changed during the idle window (a lane restarted or a spare was taken)")
		}
		return nil
	}
	idle, err := measureIdle(procs, idleWindow, same)
	if err != nil {
		return err
	}
	res.Idle = idle
	return nil
}
