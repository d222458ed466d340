package knit_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Futures on process lanes wake no reaper until someone blocks on one (Wait once its spin
// has run out, or Done); a future nobody waits on is drained by whoever looks next, by a
// reaper once its lane holds more calls than its return ring has slots, or by the reaper's
// safety net. These tests drive every way of waiting with a spin so short that it always
// runs out, so each wait must be served by a reaper woken for it: a lost wake-up hangs a
// wait, which the watchdog reports.

// settleWithin fails the test if wait does not return within a minute (a hang guard, not
// a timing claim).
func settleWithin(t *testing.T, p *knit.Pool, what string, wait func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s: not settled after a minute (lost wake-up?); lanes: %+v", what, p.Stats().Lanes)
	}
}

func TestProcessFuturesWakeNoLostWakeUp(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, CallerSpin: time.Nanosecond})
	ctx := context.Background()
	rounds := 2000
	if testing.Short() {
		rounds = 300
	}
	want := func(f *knit.Future[int64], n int64) error {
		if v, err := f.Wait(); err != nil || v != n+1 {
			return fmt.Errorf("call %d: %d, %v", n, v, err)
		}
		return nil
	}
	settleWithin(t, p, "Wait, one at a time", func() error {
		for i := range int64(rounds) {
			if err := want(add.Go(ctx, p, [2]int64{i, 1}), i); err != nil {
				return err
			}
		}
		return nil
	})
	settleWithin(t, p, "select on Done, 8 at a time", func() error {
		for i := int64(0); i < int64(rounds); i += 8 {
			var fs [8]*knit.Future[int64]
			for k := range fs {
				fs[k] = add.Go(ctx, p, [2]int64{i + int64(k), 1})
			}
			for k, f := range fs {
				<-f.Done()
				if err := want(f, i+int64(k)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	settleWithin(t, p, "polling Pending", func() error {
		for i := range int64(rounds / 10) {
			f := add.Go(ctx, p, [2]int64{i, 1})
			for f.Pending() {
				runtime.Gosched()
			}
			if err := want(f, i); err != nil {
				return err
			}
		}
		return nil
	})
	settleWithin(t, p, "a burst nobody waits on, then Wait newest first", func() error {
		fs := make([]*knit.Future[int64], 300) // more than both lanes' rings hold
		for i := range fs {
			fs[i] = add.Go(ctx, p, [2]int64{int64(i), 1})
		}
		for i := len(fs) - 1; i >= 0; i-- {
			if err := want(fs[i], int64(i)); err != nil {
				return err
			}
		}
		return nil
	})
}

// A result nobody asks for is still drained: the lane's in-flight count falls to zero.
func TestProcessFutureNobodyWaitsOnSettles(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1})
	f := add.Go(context.Background(), p, [2]int64{1, 1})
	settleWithin(t, p, "in-flight count back to zero", func() error {
		for p.Stats().Lanes[0].InFlight != 0 {
			time.Sleep(time.Millisecond) // polling a count: nothing to synchronise on
		}
		return nil
	})
	if v, err := f.Wait(); err != nil || v != 2 {
		t.Fatalf("Wait = %d, %v", v, err)
	}
}
