//go:build linux

package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// ============================================================================
// knit rows — knit's own scenarios.
// ============================================================================
//
// knitScenarios is the only place knit's rows are added; allScenarios
// appends them after the peer baselines, so they share the run, the
// reference row and the table with them. Compare goroutine lanes with the
// chan/ants/pond/protoactor rows; process lanes (when they land) with "shm
// spin child: round trip" (the floor) and "shm futex child: round trip" (the
// cost of a kernel sleep/wake per message). A process lane that re-executes
// this binary adds its role to runChildIfRequested in child.go.
//
// Every knit pool has poolWorkers lanes, like the bounded peer pools. The
// task returns in+1, like every peer. Rows:
//
//   - knit goroutine lane: round trip — Task.Call with one call in flight;
//     Config.LaneSpin and CallerSpin zero (the default: a parked lane is
//     woken through the Go scheduler).
//   - knit goroutine lane: 1024 in flight — runInFlight goroutines each
//     making one blocking Task.Call after another.
//   - the same two with LaneSpin 50µs and CallerSpin 20µs ("spinning").
//
// The sweeps of issue 9 (default Config, both runtimes, windows, lane
// counts, idle CPU) are in knit_sweep.go; they reuse the bodies here, plus
// setupKnitWindow (one goroutine keeping a window of futures in flight).

// knitInc is the task of every knit row.
var knitInc = knit.Define("bench.inc", func(_ context.Context, in uint64) (uint64, error) {
	return in + 1, nil
})

const (
	knitLaneSpin   = 50 * time.Microsecond
	knitCallerSpin = 20 * time.Microsecond
)

func knitScenarios() []scenario {
	plain := knit.Config{Lanes: poolWorkers}
	spin := knit.Config{Lanes: poolWorkers, LaneSpin: knitLaneSpin, CallerSpin: knitCallerSpin}
	return []scenario{
		{name: "knit goroutine lane: round trip", inFlight: 1,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(plain) }},
		{name: fmt.Sprintf("knit goroutine lane: %d in flight", inFlightTarget), inFlight: inFlightTarget,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitInFlight(plain) }},
		{name: "knit goroutine lane, spinning: round trip", inFlight: 1,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(spin) }},
		{name: fmt.Sprintf("knit goroutine lane, spinning: %d in flight", inFlightTarget), inFlight: inFlightTarget,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitInFlight(spin) }},
		// Process lanes: this binary re-executed as the lane (main calls knit.Main first).
		// "awake" spins on both sides, as the unix-socket and go-plugin rows keep their
		// peers awake in a blocking read; "parked" lets both sleep between calls.
		{name: "knit process lane, awake: round trip", inFlight: 1,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(procAwake) }},
		{name: "knit process lane, parked: round trip", inFlight: 1,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(procParked) }},
		{name: fmt.Sprintf("knit process lane: %d in flight", inFlightTarget), inFlight: inFlightTarget,
			setup: func() (func(*testing.B), func() error, error) { return setupKnitInFlight(procOne) }},
	}
}

var (
	procAwake = knit.Config{Lanes: 1, Runtime: knit.Process,
		LaneSpin: 100 * time.Microsecond, CallerSpin: 100 * time.Microsecond}
	procParked = knit.Config{Lanes: 1, Runtime: knit.Process, LaneSpin: -1, CallerSpin: -1}
	procOne    = knit.Config{Lanes: 1, Runtime: knit.Process}
)

// knitPool is a pool with a stall watchdog: when calls are in flight and no
// lane completes one for knitStallAfter, it records the lanes' state and
// closes the pool, so the stuck calls fail and the row reports an error
// instead of hanging the run.
type knitPool struct {
	*knit.Pool
	stall        atomic.Pointer[string]
	done, exited chan struct{}
}

const knitStallAfter = 3 * time.Second

// newKnitPool starts a pool serving knitInc and the extra tasks.
func newKnitPool(cfg knit.Config, extra ...knit.Definition) (*knitPool, error) {
	p, err := knit.NewPool(cfg, append([]knit.Definition{knitInc}, extra...)...)
	if err != nil {
		return nil, err
	}
	kp := &knitPool{Pool: p, done: make(chan struct{}), exited: make(chan struct{})}
	go kp.watch()
	return kp, nil
}

func (kp *knitPool) watch() {
	defer close(kp.exited)
	tick := time.NewTicker(knitStallAfter / 3)
	defer tick.Stop()
	var last uint64
	quiet := 0
	for {
		select {
		case <-kp.done:
			return
		case <-tick.C:
		}
		st := kp.Stats()
		var completed uint64
		inflight := 0
		for _, l := range st.Lanes {
			completed += l.Completed + l.Failed
			inflight += l.InFlight
		}
		if completed != last || inflight == 0 {
			last, quiet = completed, 0
			continue
		}
		if quiet++; quiet < 3 {
			continue
		}
		msg := fmt.Sprintf("stall: no call completed for %v with calls in flight; lanes: %+v", knitStallAfter, st.Lanes)
		kp.stall.Store(&msg)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = kp.Close(ctx) // settles the stuck calls with ErrThreadClosed
		cancel()
		<-kp.done
		return
	}
}

// failure describes a failed call, with the watchdog's finding if any.
func (kp *knitPool) failure(err error) error {
	if s := kp.stall.Load(); s != nil {
		return fmt.Errorf("knit: %v (%s)", err, *s)
	}
	return fmt.Errorf("knit: %w", err)
}

func (kp *knitPool) cleanup() error {
	close(kp.done)
	<-kp.exited
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := kp.Close(ctx)
	if kp.stall.Load() != nil {
		return nil // the row already reports the stall
	}
	return err
}

// setupKnitRoundTrip: Task.Call with one call in flight.
func setupKnitRoundTrip(cfg knit.Config) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	var in uint64
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			in++
			got, err := knitInc.Call(ctx, kp.Pool, in)
			if err != nil {
				fail(b, kp.failure(err))
				return
			}
			if got != in+1 {
				fail(b, fmt.Errorf("knit: got %d, want %d", got, in+1))
				return
			}
		}
	}
	return body, kp.cleanup, nil
}

// setupKnitInFlight: runInFlight goroutines each make one blocking
// Task.Call after another.
func setupKnitInFlight(cfg knit.Config) (func(*testing.B), func() error, error) {
	return setupKnitGoroutines(cfg, inFlightTarget)
}

// setupKnitGoroutines: about n goroutines each make one blocking Task.Call
// after another.
func setupKnitGoroutines(cfg knit.Config, n int) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	body := func(b *testing.B) {
		runGoroutines(b, n, func(pb *testing.PB) {
			var in uint64
			for pb.Next() {
				in++
				got, err := knitInc.Call(ctx, kp.Pool, in)
				if err != nil {
					fail(b, kp.failure(err))
					return
				}
				if got != in+1 {
					fail(b, fmt.Errorf("knit: got %d, want %d", got, in+1))
					return
				}
			}
		})
	}
	return body, kp.cleanup, nil
}

// setupKnitWindow: one goroutine keeps a window of w futures in flight: it
// starts w calls with Task.Go, then repeatedly waits for the oldest and
// starts one more.
func setupKnitWindow(cfg knit.Config, w int) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	ring := make([]*knit.Future[uint64], w)
	var seq uint64 // the input of the last call started
	body := func(b *testing.B) {
		n := b.N
		first := seq + 1 // the input of call i is first+i
		for i := 0; i < min(w, n); i++ {
			seq++
			ring[i] = knitInc.Go(ctx, kp.Pool, seq)
		}
		for i := 0; i < n; i++ {
			slot := i % w
			got, err := ring[slot].Wait()
			ring[slot] = nil
			if err == nil && got != first+uint64(i)+1 {
				err = fmt.Errorf("got %d, want %d", got, first+uint64(i)+1)
			}
			if err != nil {
				fail(b, kp.failure(err))
				// Settle the rest of the window (the watchdog closes a
				// stalled pool, which settles them) before returning.
				for j := i + 1; j < min(i+w, n); j++ {
					_, _ = ring[j%w].Wait()
					ring[j%w] = nil
				}
				return
			}
			if i+w < n {
				seq++
				ring[slot] = knitInc.Go(ctx, kp.Pool, seq)
			}
		}
	}
	return body, kp.cleanup, nil
}
