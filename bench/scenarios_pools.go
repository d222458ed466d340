//go:build linux

package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/alitto/pond/v2"
	"github.com/panjf2000/ants/v2"
)

// poolScenarios: rows 3 and 4 of the README — third-party goroutine pools,
// each bounded to poolWorkers workers like the channel pool. Each caller
// builds its task closure once and reuses it, so the rows measure the
// pool, not closure allocation.
func poolScenarios() []scenario {
	return []scenario{
		{name: "ants/v2: Submit round trip", inFlight: 1, setup: setupAntsRoundTrip},
		{name: fmt.Sprintf("ants/v2: pool of %d, %d in flight", poolWorkers, inFlightTarget), inFlight: inFlightTarget, setup: setupAntsThroughput},
		{name: "pond/v2: Submit+Wait round trip", inFlight: 1, setup: setupPondRoundTrip},
		{name: fmt.Sprintf("pond/v2: pool of %d, %d in flight", poolWorkers, inFlightTarget), inFlight: inFlightTarget, setup: setupPondThroughput},
	}
}

func newAntsPool() (*ants.Pool, func() error, error) {
	p, err := ants.NewPool(poolWorkers)
	if err != nil {
		return nil, nil, err
	}
	return p, func() error { return p.ReleaseTimeout(5 * time.Second) }, nil
}

// setupAntsRoundTrip: Submit a task that writes its result to a channel,
// then wait for it; one call in flight.
func setupAntsRoundTrip() (func(*testing.B), func() error, error) {
	p, cleanup, err := newAntsPool()
	if err != nil {
		return nil, nil, err
	}
	reply := make(chan uint64, 1)
	var in uint64
	task := func() { reply <- in + 1 }
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			in++
			if err := p.Submit(task); err != nil {
				fail(b, fmt.Errorf("ants Submit: %w", err))
				return
			}
			if got := <-reply; got != in+1 {
				fail(b, fmt.Errorf("ants: got %d, want %d", got, in+1))
				return
			}
		}
	}
	return body, cleanup, nil
}

// setupAntsThroughput: inFlightTarget goroutines each Submit and wait on
// their own result channel. ants' Submit blocks while all workers are busy.
func setupAntsThroughput() (func(*testing.B), func() error, error) {
	p, cleanup, err := newAntsPool()
	if err != nil {
		return nil, nil, err
	}
	body := func(b *testing.B) {
		runInFlight(b, func(pb *testing.PB) {
			reply := make(chan uint64, 1)
			var in uint64
			task := func() { reply <- in + 1 }
			for pb.Next() {
				in++
				if err := p.Submit(task); err != nil {
					fail(b, fmt.Errorf("ants Submit: %w", err))
					return
				}
				if got := <-reply; got != in+1 {
					fail(b, fmt.Errorf("ants: got %d, want %d", got, in+1))
					return
				}
			}
		})
	}
	return body, cleanup, nil
}

func newPondPool() (pond.ResultPool[uint64], func() error) {
	p := pond.NewResultPool[uint64](poolWorkers)
	return p, func() error { p.StopAndWait(); return nil }
}

// setupPondRoundTrip: Submit returns a future; Wait returns the task's
// result. One call in flight.
func setupPondRoundTrip() (func(*testing.B), func() error, error) {
	p, cleanup := newPondPool()
	var in uint64
	task := func() uint64 { return in + 1 }
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			in++
			got, err := p.Submit(task).Wait()
			if err != nil || got != in+1 {
				fail(b, fmt.Errorf("pond: got %d, %v; want %d", got, err, in+1))
				return
			}
		}
	}
	return body, cleanup, nil
}

// setupPondThroughput: inFlightTarget goroutines Submit and Wait. pond
// queues tasks beyond its worker limit instead of blocking the submitter.
func setupPondThroughput() (func(*testing.B), func() error, error) {
	p, cleanup := newPondPool()
	body := func(b *testing.B) {
		runInFlight(b, func(pb *testing.PB) {
			var in uint64
			task := func() uint64 { return in + 1 }
			for pb.Next() {
				in++
				got, err := p.Submit(task).Wait()
				if err != nil || got != in+1 {
					fail(b, fmt.Errorf("pond: got %d, %v; want %d", got, err, in+1))
					return
				}
			}
		})
	}
	return body, cleanup, nil
}
