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

// TestParkRoom: a lane parked for room on its return ring is woken by RingRoom, also when
// the host retires and rings between the lane's check and its wait, and not by Ring (calls
// published meanwhile wait until it has room for their results).
func TestParkRoom(t *testing.T) {
	for _, tc := range []struct {
		name string
		bell Bell
	}{{"chan", NewChanBell()}, {"futex", FutexBell{}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegion(t, Layout{Arena: 4096})
			w := r.LaneWake()
			w.SetAwake()
			if w.RingRoom(tc.bell) || w.WaitingForRoom() {
				t.Fatal("RingRoom rang a lane that is not parked for room")
			}
			for round := range 200 {
				var work, room bool
				parked := make(chan struct{})
				go func() {
					defer close(parked)
					w.ParkRoom(tc.bell, func() bool {
						work = w.Ring(tc.bell)
						room = w.WaitingForRoom() && w.RingRoom(tc.bell)
						return false
					}, 0)
				}()
				select {
				case <-parked:
				case <-time.After(time.Minute):
					t.Fatalf("round %d: ParkRoom missed a RingRoom made between its check and its wait", round)
				}
				if work || !room {
					t.Fatalf("round %d: Ring woke the lane: %v; RingRoom woke it: %v", round, work, room)
				}
				if w.WaitingForRoom() {
					t.Fatalf("round %d: the lane still looks parked for room after it woke", round)
				}
			}
		})
	}
}
