package knit_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/fastpath"
)

// waitFor polls cond until it holds, for a minute at most.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// An idle process lane pauses its heartbeat (fastpath.BeatPaused), and the watchdog does not
// take the paused lane for a frozen one: over looks spanning more than two Liveness it stays,
// and serves the next call. A lane frozen (SIGSTOP) while paused is found once a call waits
// for it: it is killed, and the call runs on its next incarnation.
func TestIdleLaneHeartbeatPaused(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Liveness: time.Second, Logger: quiet(),
		Process: knit.ProcessConfig{Env: quickExit}}, add)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v, err := add.Call(ctx, p, [2]int64{1, 2}); err != nil || v != 3 {
		t.Fatalf("a first call: %d, %v", v, err)
	}
	pid := p.Stats().Lanes[0].PID
	var first uint32 // the paused word: the lane's beat counter, and the paused mark
	waitFor(t, "the idle lane's heartbeat pausing", func() bool {
		w, ok := knit.LaneBeat(p, 0)
		first = w
		return ok && w&fastpath.BeatPaused != 0
	})
	looks := knit.WatchdogLooks(p)
	waitFor(t, "seven looks of the watchdog", func() bool { return knit.WatchdogLooks(p) >= looks+7 })
	if st := p.Stats().Lanes[0]; st.PID != pid || st.Restarts != 0 {
		t.Fatalf("a lane with its heartbeat paused was taken for frozen: pid %d → %d, %d restarts", pid, st.PID, st.Restarts)
	}
	if v, err := add.Call(ctx, p, [2]int64{2, 2}); err != nil || v != 4 {
		t.Fatalf("a call to the lane that paused its heartbeat: %d, %v", v, err)
	}
	// A pause after the call, not the first one's word: the lane's heartbeat goroutine
	// clears the mark only when it runs again, which on a loaded machine can be after the
	// call has been served. A SIGSTOP sent on that stale word could find the lane awake,
	// still able to take the next call before it stops: that call would have started.
	waitFor(t, "the heartbeat pausing again", func() bool {
		w, ok := knit.LaneBeat(p, 0)
		return ok && w&fastpath.BeatPaused != 0 && w != first
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if v, err := add.Call(ctx, p, [2]int64{3, 2}); err != nil || v != 5 {
		t.Fatalf("a call to the lane frozen while idle: %d, %v", v, err)
	}
	if st := p.Stats().Lanes[0]; st.PID == pid || st.Restarts != 1 {
		t.Fatalf("the lane frozen while idle: pid %d → %d, %d restarts (want a new process, 1 restart)", pid, st.PID, st.Restarts)
	}
}
