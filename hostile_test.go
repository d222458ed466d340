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
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// Hostile lanes (docs/process-lanes.md, "Threat model"): each task below misbehaves on
// purpose, from inside a real lane process.

var (
	// freeze stops its own lane process (SIGSTOP): the lane neither ends nor answers. The
	// stop can take effect a while after kill returns (the signal waits in the process's
	// pending set for a thread to act on it: seen after 100+ µs here), so the task never
	// returns: returning would publish a result before the lane froze.
	freeze = knit.Define("test.hostile.freeze", func(context.Context, int) (int, error) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		select {}
	})
	// closeBell closes the completion doorbell's descriptor and replaces it with /dev/null,
	// then answers: its results are published, but the host is never rung for them.
	closeBell = knit.Define("test.hostile.closebell", func(context.Context, int) (int, error) {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return 0, err
		}
		defer null.Close()
		if err := syscall.Dup2(int(null.Fd()), 4); err != nil {
			return 0, err
		}
		return 7, nil
	})
	// forgeOther writes results into its own lane's return ring for calls it does not hold:
	// every record id below 64 of the victim task, in every generation below 8, with 666.
	forgeOther = knit.Define("test.hostile.forge", func(_ context.Context, victim uint32) (int, error) {
		f := os.NewFile(3, "region")
		mp, err := shm.MapFile(f)
		if err != nil {
			return 0, err
		}
		r, err := fastpath.OpenRegion(mp.Bytes())
		if err != nil {
			return 0, err
		}
		ret := r.Returns().Producer()
		forged := []byte{0x19, 0x02, 0x9a} // CBOR 666
		for id := uint32(0); id < 64; id++ {
			for gen := uint32(0); gen < 8; gen++ {
				i, ok := ret.Reserve()
				for !ok {
					i, ok = ret.Reserve()
				}
				buf, err := ret.Put(i, len(forged))
				if err != nil {
					return 0, err
				}
				copy(buf, forged)
				s := ret.Slot(i)
				s.SetFn(victim)
				s.SetCall(id, gen)
				s.SetAbort(0)
				s.SetFlags(0)
				ret.Publish(i)
			}
		}
		return 0, nil
	})
	// victim waits for its gate (a FIFO) and returns its input.
	victim = knit.Define("test.hostile.victim", func(_ context.Context, gate string) (int, error) {
		if _, err := os.ReadFile(gate); err != nil {
			return 0, err
		}
		return 42, nil
	})
	// overrun ignores its context and never returns.
	overrun = knit.Define("test.hostile.overrun", func(context.Context, int) (int, error) {
		select {}
	}, knit.HardTimeout(300*time.Millisecond))
)

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
