//go:build linux

package main

import (
	"fmt"
	"testing"
)

// sink keeps the direct-call result observable so the loop is not removed.
var sink uint64

//go:noinline
func incDirect(x uint64) uint64 { return x + 1 }

// inProcScenarios: rows 1 and 2 of the README — a plain function call and
// goroutine hand-offs over channels.
func inProcScenarios() []scenario {
	return []scenario{
		{
			name:     "direct call",
			inFlight: 1,
			setup: func() (func(*testing.B), func() error, error) {
				body := func(b *testing.B) {
					var v uint64
					for i := 0; i < b.N; i++ {
						v = incDirect(v)
					}
					sink = v
				}
				return body, noCleanup, nil
			},
		},
		{
			name:     "chan: unbuffered round trip",
			inFlight: 1,
			setup:    setupChanRoundTrip,
		},
		{
			name:     fmt.Sprintf("chan: pool of %d workers, %d in flight", poolWorkers, inFlightTarget),
			inFlight: inFlightTarget,
			setup:    setupChanPool,
		},
	}
}

func noCleanup() error { return nil }

// setupChanRoundTrip: one worker goroutine; request and reply travel on two
// unbuffered channels, one call in flight.
func setupChanRoundTrip() (func(*testing.B), func() error, error) {
	req := make(chan uint64)
	resp := make(chan uint64)
	go func() {
		for v := range req {
			resp <- v + 1
		}
		close(resp)
	}()
	var seq uint64
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			seq++
			req <- seq
			if got := <-resp; got != seq+1 {
				fail(b, fmt.Errorf("chan round trip: got %d, want %d", got, seq+1))
				return
			}
		}
	}
	cleanup := func() error {
		close(req)
		<-resp
		return nil
	}
	return body, cleanup, nil
}

type chanJob struct {
	v     uint64
	reply chan uint64
}

// setupChanPool: poolWorkers goroutines read jobs from one buffered channel
// (capacity inFlightTarget); every caller goroutine owns a reply channel.
func setupChanPool() (func(*testing.B), func() error, error) {
	jobs := make(chan chanJob, inFlightTarget)
	done := make(chan struct{})
	for w := 0; w < poolWorkers; w++ {
		go func() {
			for j := range jobs {
				j.reply <- j.v + 1
			}
			done <- struct{}{}
		}()
	}
	body := func(b *testing.B) {
		runInFlight(b, func(pb *testing.PB) {
			reply := make(chan uint64, 1)
			var v uint64
			for pb.Next() {
				jobs <- chanJob{v: v, reply: reply}
				if got := <-reply; got != v+1 {
					fail(b, fmt.Errorf("chan pool: got %d, want %d", got, v+1))
					return
				}
				v++
			}
		})
	}
	cleanup := func() error {
		close(jobs)
		for w := 0; w < poolWorkers; w++ {
			<-done
		}
		return nil
	}
	return body, cleanup, nil
}
