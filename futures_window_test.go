package knit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// One goroutine keeps a sliding window of futures on two process lanes, with no watchdog
// (Liveness < 0), whose periodic drain would otherwise hide a reaper that nobody wakes: a
// lingering reaper that let go of the spinner token woke only the reapers of lanes with a
// blocked Call, so a future on another lane, whose reaper had stood aside, was never drained
// and its Wait hung (with the watchdog on, for up to a second).
func TestProcessFutureWindowNoWatchdog(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Liveness: -1})
	ctx := context.Background()
	const window = 64
	n := 60_000
	if testing.Short() {
		n = 10_000
	}
	errc := make(chan error, 1)
	go func() {
		// Bursts: the window fills, then drains to empty, so that every burst starts with
		// idle reapers and lanes, as the first calls of a pool do.
		var ring [window]*knit.Future[int64]
		for i := 0; i < n; i += 2 * window {
			for j := range 2 * window {
				k := j % window
				if f := ring[k]; f != nil {
					if v, err := f.Wait(); err != nil || v != int64(i+j-window)+1 {
						errc <- fmt.Errorf("call %d: %d, %v", i+j-window, v, err)
						return
					}
					ring[k] = nil
				}
				if j < window {
					ring[k] = add.Go(ctx, p, [2]int64{int64(i + j), 1})
				}
			}
		}
		errc <- nil
	}()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the window stalled (a future nobody drains); lanes: %+v", p.Stats().Lanes)
	}
}

// Bursts larger than the lanes' rings hold (4 lanes × 32 slots): calls wait in backlogs,
// and each burst is waited for whole before the next starts. With the watchdog off, a
// backlog nobody flushes or a result nobody drains would hang the test.
func TestProcessFutureBurstsBeyondRingsNoWatchdog(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 4, Liveness: -1})
	ctx := context.Background()
	const burst = 200
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	fs := make([]*knit.Future[int64], burst)
	for r := range rounds {
		done := make(chan error, 1)
		go func() {
			for i := range fs {
				fs[i] = add.Go(ctx, p, [2]int64{int64(i), int64(r)})
			}
			for i, f := range fs {
				if v, err := f.Wait(); err != nil || v != int64(i+r) {
					done <- fmt.Errorf("round %d call %d: %d, %v", r, i, v, err)
					return
				}
			}
			done <- nil
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("round %d stalled; lanes: %+v", r, p.Stats().Lanes)
		}
	}
}
