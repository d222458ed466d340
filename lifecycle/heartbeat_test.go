package lifecycle

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// beatUntil polls the region's heartbeat word until ok accepts it, for a minute at most.
func beatUntil(t *testing.T, r *fastpath.Region, what string, ok func(uint32) bool) uint32 {
	t.Helper()
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Microsecond) {
		if w := r.Heartbeat().Load(); ok(w) {
			return w
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within a minute (heartbeat word %#x)", what, r.Heartbeat().Load())
		}
	}
}

// beats waits until the heartbeat has moved n times unpaused: it fails if the beat pauses.
func beats(t *testing.T, r *fastpath.Region, what string, n int) {
	t.Helper()
	last := r.Heartbeat().Load()
	for range n {
		last = beatUntil(t, r, what, func(w uint32) bool { return w != last && w&fastpath.BeatPaused == 0 })
	}
}

// An idle lane's heartbeat pauses: parked and not rung over two beats, it marks its word
// paused and stands still, and the executor's wake-up (Executor.Woke) starts it again. An
// awake lane beats on. The executor here is a goroutine that parks on the lane's doorbell
// as Executor.Run does.
func TestHeartbeatPausesWhileParked(t *testing.T) {
	l := fastpath.Layout{Arena: 4096}
	r, err := fastpath.NewRegion(shm.Heap(l.Size()), l, 0, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	wake, bell := r.LaneWake(), fastpath.FutexBell{}
	wake.SetAwake()
	pause := newBeatPause()
	stop := heartbeat(r, time.Millisecond, pause)

	beats(t, r, "an awake lane beats", 5)

	var park, exit atomic.Bool // the executor parks while park is set, returns at exit
	parks := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !exit.Load() {
			if !park.Load() {
				time.Sleep(100 * time.Microsecond) // awake between parks, as a lane running calls
				continue
			}
			select {
			case parks <- struct{}{}:
			default:
			}
			wake.Park(bell, func() bool { return !park.Load() || exit.Load() }, time.Minute)
			pause.woke()
		}
	}()
	for range 3 {
		park.Store(true)
		<-parks
		paused := beatUntil(t, r, "a parked lane's beat pauses", func(w uint32) bool { return w&fastpath.BeatPaused != 0 })
		park.Store(false)
		wake.Ring(bell)
		beatUntil(t, r, "the beat after the lane woke", func(w uint32) bool { return w != paused && w&fastpath.BeatPaused == 0 })
		beats(t, r, "a woken lane beats on", 3)
	}
	exit.Store(true)
	wake.Force(bell)
	<-done
	stop()
	goleak.VerifyNone(t)
}
