package knit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Calls queued behind a call that runs on and on move to another lane once there is one
// (MoveQueuedAfter): they complete without waiting for it, its lane is not killed, and the
// long call goes on where it started.
func TestCallsMoveFromBehindALongCall(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, MoveQueuedAfter: 5 * time.Millisecond,
		Process: knit.ProcessConfig{Env: quickExit}}, running, add)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := runningCall(t, ctx, p)
	pid := p.Stats().Lanes[0].PID
	// With one lane nothing moves: they wait behind the long call, in the lane's ring and,
	// past its 32 slots, in the host's backlog.
	const n = 100
	queueBehindAndMove(t, p, n)
	select {
	case <-long.Done():
		_, err := long.Wait()
		t.Fatalf("the long call settled before its cancellation: %v", err)
	default:
	}
	if got := p.Stats().Lanes[0]; got.PID != pid || got.Crashes != 0 || got.Moved != n {
		t.Errorf("the long call's lane: pid %d → %d, %d crashes, %d calls moved (want %d)", pid, got.PID, got.Crashes, got.Moved, n)
	}
	cancel()
	if _, err := long.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the long call after its cancellation: %v, want CANCELED", err)
	}
}

// queueBehindAndMove queues n calls on a one-lane pool whose lane runs a long call, adds a
// second lane, and waits for every queued call to settle right (moved to the new lane).
func queueBehindAndMove(t *testing.T, p *knit.Pool, n int) {
	t.Helper()
	futs := make([]*knit.Future[int64], n)
	for i := range futs {
		futs[i] = add.Go(context.Background(), p, [2]int64{int64(i), 1})
	}
	if err := p.Resize(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	for i, f := range futs {
		if v, err := settle(t, fmt.Sprintf("call %d queued behind the long call", i), f); err != nil || v != int64(i+1) {
			t.Fatalf("call %d queued behind the long call: %d, %v", i, v, err)
		}
	}
}

// An idle pool's watchdog stops looking for long calls (it would wake the host 20 times a
// second for nothing), and the first call a lane takes after that starts the looks again:
// calls queued behind a long one still move.
func TestCallsMoveFromBehindALongCallAfterIdle(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, MoveQueuedAfter: 5 * time.Millisecond,
		Process: knit.ProcessConfig{Env: quickExit}}, running, add)
	if v, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || v != 3 {
		t.Fatalf("a first call: %d, %v", v, err)
	}
	if !knit.AwaitMoverIdle(p, time.Minute) {
		t.Fatal("the watchdog still looks for long calls a minute after the last call settled")
	}
	if err := p.Resize(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := runningCall(t, ctx, p)
	const n = 50
	queueBehindAndMove(t, p, n)
	if got := p.Stats().Lanes[0].Moved; got != n {
		t.Errorf("the long call's lane moved %d calls, want %d", got, n)
	}
	cancel()
	if _, err := long.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the long call after its cancellation: %v, want CANCELED", err)
	}
}

// A lane that stays on one long call has its queue taken back at every look, not once: calls
// that reached it while no other lane was free (here: while it was the only lane) move when
// one is. The second batch fills the slots the first left behind the fence and then the
// backlog (the fence is extended over the slots); the third finds every slot fenced and waits
// in the backlog alone (it moves without the gate).
func TestCallsMoveFromBehindALongCallAgain(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, MoveQueuedAfter: 5 * time.Millisecond,
		Process: knit.ProcessConfig{Env: quickExit}}, running, add)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := runningCall(t, ctx, p)
	moved := 0
	for round, n := range []int{10, 100, 50} {
		futs := make([]*knit.Future[int64], n)
		for i := range futs {
			futs[i] = add.Go(context.Background(), p, [2]int64{int64(i), int64(round)})
		}
		if err := p.Resize(context.Background(), 2); err != nil {
			t.Fatal(err)
		}
		for i, f := range futs {
			if v, err := settle(t, fmt.Sprintf("round %d, call %d queued behind the long call", round, i), f); err != nil || v != int64(i+round) {
				t.Fatalf("round %d, call %d queued behind the long call: %d, %v", round, i, v, err)
			}
		}
		if err := p.Resize(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		moved += n
		if got := p.Stats().Lanes[0]; got.Moved != uint64(moved) || got.Crashes != 0 {
			t.Fatalf("round %d: the long call's lane moved %d calls (want %d), %d crashes", round, got.Moved, moved, got.Crashes)
		}
	}
	cancel()
	if _, err := long.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the long call after its cancellation: %v, want CANCELED", err)
	}
}
