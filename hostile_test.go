package knit_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Hostile lanes (docs/process-lanes.md, "Threat model"): each test runs a task (tasks_test.go)
// that misbehaves on purpose, from inside a real lane process.

// A frozen lane is found by the watchdog: a call without a deadline settles, the lane is
// killed as unresponsive and restarted, and Close returns.
func TestFrozenLaneIsKilled(t *testing.T) {
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), OnEvent: rec.record, Liveness: 300 * time.Millisecond}, freeze, add)
	_, err := freeze.Call(context.Background(), p, 0) // no deadline
	if !errors.Is(err, knit.ErrWorkerUnresponsive) {
		t.Fatalf("call on a frozen lane: %v, want %s", err, knit.CodeUnresponsive)
	}
	e := rec.await(t, "frozen lane ended", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	if e.Code != knit.CodeUnresponsive {
		t.Errorf("frozen lane ended with %s (%s)", e.Code, e.Reason)
	}
	rec.await(t, "frozen lane back", func(x knit.Event) bool {
		return x.Lane == e.Lane && x.To == knit.StateReady && x.Incarnation > e.Incarnation
	})
	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
}

// Close with a busy frozen lane returns: the watchdog ends the lane it waits for.
func TestCloseWithFrozenLane(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: quiet(), Liveness: 300 * time.Millisecond}, freeze)
	if err != nil {
		t.Fatal(err)
	}
	f := freeze.Go(context.Background(), p, 0)
	_ = p.Close(context.Background())
	if _, err := f.Wait(); err == nil {
		t.Error("the frozen call succeeded")
	}
}

// A lane whose doorbell is gone still has its results collected (the watchdog polls the
// return rings).
func TestLostDoorbell(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Liveness: 300 * time.Millisecond, CallerSpin: -1}, closeBell)
	for range 3 {
		if v, err := closeBell.Call(context.Background(), p, 0); err != nil || v != 7 {
			t.Fatalf("call after the doorbell was replaced: %d, %v", v, err)
		}
	}
}

// A result a lane writes for a call it does not hold settles nothing: the forging lane is
// killed, the call's own lane answers it, and no caller sees a forged value.
func TestForgedResultForAnotherLanesCall(t *testing.T) {
	gate := t.TempDir() + "/gate"
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet(), OnEvent: rec.record, Balancer: knit.RoundRobin}, forgeOther, victim)
	v := victim.Go(context.Background(), p, gate) // held by one lane, waiting
	var forgeErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, forgeErr = forgeOther.Call(context.Background(), p, victimIndex(t, p)) })
	crashed := rec.await(t, "forging lane killed", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	if err := os.WriteFile(gate, []byte{1}, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := v.Wait()
	if err != nil || got != 42 {
		t.Fatalf("victim call: %d, %v (want its own lane's 42)", got, err)
	}
	wg.Wait()
	_ = forgeErr // the forger's own call settles with its lane's end
	for _, e := range rec.events(1 - crashed.Lane) {
		if e.To == knit.StateCrashed {
			t.Errorf("the innocent lane %d was killed: %v", 1-crashed.Lane, e)
		}
	}
}

// victimIndex is the victim task's registry index, as the lanes see it.
func victimIndex(t *testing.T, p *knit.Pool) uint32 {
	t.Helper()
	return knit.TaskIndex(victim)
}

// HardTimeout holds when the caller gives up first: the lane that keeps running the call
// is killed at the hard deadline, and the next calls are served.
func TestHardTimeoutAfterCallerGaveUp(t *testing.T) {
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), OnEvent: rec.record}, overrun, add)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := overrun.Call(ctx, p, 0); !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("overrunning call: %v", err)
	}
	e := rec.await(t, "lane killed at the hard deadline", func(e knit.Event) bool { return e.To == knit.StateCrashed })
	if e.Code != knit.CodeWorkerCrashed {
		t.Errorf("lane ended with %s (%s)", e.Code, e.Reason)
	}
	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
}
