package fastpath

import (
	"testing"
	"time"
)

// TestChanBellRingBetweenCheckAndWait rings a parking consumer in the window a lost wake-up
// needs: after it cleared its awake flag and found no work, before it waits. Ring bumps no
// counter for a ChanBell, so only the bell's token can end the wait: if it were lost, Park
// would block for good (the watchdog fails the test instead).
func TestChanBellRingBetweenCheckAndWait(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	w, bell := r.LaneWake(), NewChanBell()
	w.SetAwake()
	if w.Ring(bell) {
		t.Fatal("Ring rang an awake consumer")
	}
	for round := range 1000 {
		rang := false
		parked := make(chan struct{})
		go func() {
			defer close(parked)
			w.Park(bell, func() bool {
				// The producer publishes and rings right after the consumer's last check.
				rang = w.Ring(bell)
				return false
			}, 0)
		}()
		select {
		case <-parked:
		case <-time.After(time.Minute):
			t.Fatalf("round %d: Park missed a Ring made between its check and its wait", round)
		}
		if !rang {
			t.Fatalf("round %d: Ring saw the parking consumer awake", round)
		}
	}
}

// TestParkRoom: a lane parked for room on its return ring is not woken by Ring (calls
// published meanwhile wait until it has room for their results): it sleeps out its timeout,
// or until a Force (a stop request).
func TestParkRoom(t *testing.T) {
	for _, tc := range []struct {
		name string
		bell Bell
	}{{"chan", NewChanBell()}, {"futex", FutexBell{}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegion(t, Layout{Arena: 4096})
			w := r.LaneWake()
			w.SetAwake()
			if w.WaitingForRoom() {
				t.Fatal("an awake lane looks parked for room")
			}
			var work, waiting bool
			w.ParkRoom(tc.bell, func() bool {
				work, waiting = w.Ring(tc.bell), w.WaitingForRoom()
				return false
			}, time.Millisecond)
			if work || !waiting || w.WaitingForRoom() {
				t.Fatalf("Ring woke a lane parked for room: %v; it looked parked: %v; after: %v", work, waiting, w.WaitingForRoom())
			}
			forced := make(chan struct{})
			go func() {
				defer close(forced)
				w.ParkRoom(tc.bell, func() bool { w.Force(tc.bell); return false }, time.Hour)
			}()
			select {
			case <-forced:
			case <-time.After(time.Minute):
				t.Fatal("a Force between the check and the wait did not wake a lane parked for room")
			}
		})
	}
}
