package knit_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit"
)

// Recycling (MaxCallsPerLane, MaxLaneMemory): lanes are replaced under load without losing a
// call, running one twice, or dipping below the capacity the pool should have. Runs are
// counted per call id: in memory for goroutine lanes, in the mapped counters file of the
// settlement tasks (tasks_test.go) for process lanes. The load and its checks, which the
// Resize tests share, are in helpers_test.go.

// checkRecycles checks every recycle in events: the replacement of lane L's incarnation i
// is ready before i begins to stop, and nothing crashed or restarted. It returns how many
// recycles there were.
func checkRecycles(t *testing.T, events []knit.Event) int {
	t.Helper()
	recycles := 0
	for k, e := range events {
		switch e.To {
		case knit.StateCrashed, knit.StateExited, knit.StateRestarting, knit.StateCrashLoopBackoff, knit.StateStartupFailed, knit.StateDead:
			t.Errorf("event %d: %+v: a recycle is not a failure", k, e)
		}
		if e.To != knit.StateRecycling {
			continue
		}
		recycles++
		readyAt, stopAt := -1, -1
		for j := k + 1; j < len(events); j++ {
			f := events[j]
			if f.Lane != e.Lane {
				continue
			}
			if readyAt < 0 && f.Incarnation > e.Incarnation && f.To == knit.StateReady {
				readyAt = j
			}
			if stopAt < 0 && f.Incarnation == e.Incarnation && f.To == knit.StateStopping {
				stopAt = j
			}
		}
		if stopAt >= 0 && (readyAt < 0 || readyAt > stopAt) {
			t.Errorf("lane %d incarnation %d began to stop (event %d) before its replacement was ready (event %d)",
				e.Lane, e.Incarnation, stopAt, readyAt)
		}
	}
	return recycles
}

// A goroutine lane is recycled after MaxCallsPerLane under steady load from 8 goroutines:
// no call fails, none is lost or runs twice, the replacement is always ready before the
// recycled lane stops, and the pool never has fewer than its 2 lanes serving.
//
// The load runs until two recycled incarnations have stopped, not for a fixed number of
// calls: a recycled lane serves until its replacement is ready, and a request made while
// one boots is dropped, so how many calls an incarnation serves depends on how fast the
// supervisor boots one (on a loaded machine, 20 000 calls sometimes saw one recycle).
func TestRecycleMaxCallsGoroutine(t *testing.T) {
	const ids = 2_000_000 // a cap: a pool that never recycles fails the test once they run out
	runs := memRuns(ids)
	w := newLifeWatch()
	p, err := knit.NewPool(knit.Config{Lanes: 2, MaxCallsPerLane: 1000, Logger: quiet(), OnEvent: w.on}, counted)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	w.arm(true)
	ld := startLoad(8, ids, func(id int) (int, error) { return counted.Call(context.Background(), p, id) })
	w.await(knit.StateStopping, 2, ld.out)
	n := ld.finish(t)
	w.arm(false)
	checkRuns(t, runs, n)
	events, least := w.snapshot()
	recycles := checkRecycles(t, events)
	stats := 0
	for _, l := range p.Stats().Lanes {
		stats += l.Recycles
	}
	t.Logf("%d calls, %d recycles (Stats: %d), fewest lanes serving: %d", n, recycles, stats, least)
	// The load ran until two incarnations stopped: each must have been a recycle, counted
	// alike in events and Stats (a pool that never recycles ran out of ids and fails here).
	if recycles < 2 || stats != recycles {
		t.Errorf("%d recycles in events, %d in Stats: want the same, at least 2 (%d calls, 1000 per lane)", recycles, stats, n)
	}
	if least < 2 {
		t.Errorf("only %d lanes served at one point: recycling dipped capacity", least)
	}
}

// A process lane is recycled after MaxCallsPerLane under load: a spare takes over (no call
// waits for a process start, and capacity never dips), no call fails, none runs twice.
//
// As in TestRecycleMaxCallsGoroutine, the load runs until three recycled incarnations have
// stopped (ids is a cap), not for a fixed number of calls.
func TestRecycleMaxCallsProcess(t *testing.T) {
	perLane := 2_000
	if testing.Short() {
		perLane = 700
	}
	ids := 100 * perLane
	path, runs := fileRuns(t, ids)
	w := newLifeWatch()
	core, logs := observer.New(zapcore.DebugLevel)
	p := newProcessPool(t, knit.Config{Lanes: 2, MaxCallsPerLane: perLane, Logger: zap.New(core), OnEvent: w.on,
		Process: knit.ProcessConfig{Env: []string{envRuns + "=" + path}}}, chaosOnce)
	knit.AwaitSpares(p) // the first recycle finds the spare ready
	w.arm(true)
	ld := startLoad(8, int64(ids), func(id int) (int, error) { return chaosOnce.Call(context.Background(), p, chaosCall{ID: id}) })
	w.await(knit.StateStopping, 3, ld.out)
	n := ld.finish(t)
	w.arm(false)
	checkRuns(t, runs, n)
	events, least := w.snapshot()
	recycles := checkRecycles(t, events)
	spares := logs.FilterMessage("spare process assigned").Len()
	t.Logf("%d calls, %d recycles, %d from a spare, fewest lanes serving: %d", n, recycles, spares, least)
	if recycles < 3 {
		t.Errorf("%d recycles, want at least 3 (%d calls, %d per lane)", recycles, n, perLane)
	}
	if spares == 0 {
		t.Error("no replacement took a spare")
	}
	if least < 2 {
		t.Errorf("only %d lanes served at one point: recycling dipped capacity", least)
	}
	for _, e := range events {
		if e.To == knit.StateRecycling && !strings.Contains(e.Reason, "MaxCallsPerLane") {
			t.Errorf("recycle reason %q does not name MaxCallsPerLane", e.Reason)
		}
	}
}

// A process lane whose resident memory grows past MaxLaneMemory is recycled (a planned
// replacement, not a crash), counted in Stats, and the pool serves on. Liveness is the
// default: with 600 ms, a race-built lane touching 192 MiB beside CI's other test binaries
// once went 800 ms without a heartbeat and was killed as unresponsive.
func TestRecycleMaxLaneMemory(t *testing.T) {
	w := newLifeWatch()
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), OnEvent: w.on,
		Process: knit.ProcessConfig{MaxLaneMemory: 160 << 20}}, grow, add)
	if _, err := grow.Call(context.Background(), p, 192); err != nil {
		t.Fatal(err)
	}
	// The watchdog samples the lane's RSS at its next tick: wait for the recycle to finish.
	ended := make(chan knit.Event, 1)
	var once sync.Once
	sub := p.Events()
	go func() {
		for e := range sub {
			if e.Incarnation == 0 && e.To == knit.StateClosed {
				once.Do(func() { ended <- e })
			}
		}
	}()
	<-ended
	got, err := add.Call(context.Background(), p, [2]int64{2, 3})
	if err != nil || got != 5 {
		t.Fatalf("call after the recycle: %d, %v", got, err)
	}
	events, _ := w.snapshot()
	if n := checkRecycles(t, events); n != 1 {
		t.Errorf("%d recycles, want 1", n)
	}
	for _, e := range events {
		if e.To == knit.StateRecycling && !strings.Contains(e.Reason, "MaxLaneMemory") {
			t.Errorf("recycle reason %q does not name MaxLaneMemory", e.Reason)
		}
	}
	st := p.Stats().Lanes[0]
	if st.Recycles != 1 || st.Restarts != 0 || st.Incarnation == 0 || st.State != knit.StateReady {
		t.Errorf("lane after the recycle: %+v", st)
	}
}
