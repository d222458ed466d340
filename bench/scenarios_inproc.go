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
	rows := []scenario{
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
			meta:     rowMeta{Impl: implChanUnbuffered, Shape: shapeRoundTrip, Lanes: 1},
			setup:    setupChanRoundTrip,
		},
		{
			name:     fmt.Sprintf("chan: pool of %d workers, %d in flight", poolWorkers, inFlightTarget),
			inFlight: inFlightTarget,
			meta:     rowMeta{Impl: implChanPool, Shape: shapeGoroutines, Lanes: poolWorkers, Window: inFlightTarget},
			setup:    setupChanPool,
		},
	}
	for _, w := range windowSweep {
		rows = append(rows, scenario{
			name:     fmt.Sprintf("chan: pool of %d workers, window %d", poolWorkers, w),
			inFlight: w,
			meta:     rowMeta{Impl: implChanPool, Shape: shapeWindow, Lanes: poolWorkers, Window: w},
			setup:    func() (func(*testing.B), func() error, error) { return setupChanPoolWindow(w) },
		})
	}
	return rows
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

// setupChanPoolWindow: the channel pool of setupChanPool driven by one
// goroutine that keeps a window of w jobs in flight. Every job carries the
// reply channel of its window slot, so the goroutine waits for the oldest
// job specifically; a slot's channel is reused only after its reply was
// taken, so capacity 1 never blocks a worker.
func setupChanPoolWindow(w int) (func(*testing.B), func() error, error) {
	jobs := make(chan chanJob, inFlightTarget)
	done := make(chan struct{})
	for range poolWorkers {
		go func() {
			for j := range jobs {
				j.reply <- j.v + 1
			}
			done <- struct{}{}
		}()
	}
	replies := make([]chan uint64, w)
	for i := range replies {
		replies[i] = make(chan uint64, 1)
	}
	var seq uint64 // the input of the last job started
	body := func(b *testing.B) {
		n := b.N
		first := seq + 1 // the input of call i is first+i
		for i := 0; i < min(w, n); i++ {
			seq++
			jobs <- chanJob{v: seq, reply: replies[i]}
		}
		for i := 0; i < n; i++ {
			slot := i % w
			if got, want := <-replies[slot], first+uint64(i)+1; got != want {
				fail(b, fmt.Errorf("chan pool window: got %d, want %d", got, want))
				// Take the replies still due so no stale one lands in a
				// slot's channel (the body does not run again once failed).
				for j := i + 1; j < min(i+w, n); j++ {
					<-replies[j%w]
				}
				return
			}
			if i+w < n {
				seq++
				jobs <- chanJob{v: seq, reply: replies[slot]}
			}
		}
	}
	cleanup := func() error {
		close(jobs)
		for range poolWorkers {
			<-done
		}
		return nil
	}
	return body, cleanup, nil
}
