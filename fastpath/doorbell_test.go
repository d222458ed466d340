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
