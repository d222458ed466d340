package fastpath

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit/internal/shm"
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
			looks := 0
			w.Park(bell, func() bool {
				// The producer publishes and rings right after the consumer's last check
				// (once: Park looks again after a ring, and every ring here is a new call).
				if looks++; looks == 1 {
					rang = w.Ring(bell)
				}
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

// waitProbe is a futex-like Bell for TestParkNeverWaitsRung: Wait returns at once when the
// word has moved, and otherwise records whether a Ring made now would reach the waiter.
type waitProbe struct {
	w         *Wake
	waits     int
	unringing int // waits during which Ring would not have rung
}

func (b *waitProbe) Wait(word *atomic.Uint32, seen uint32, _ time.Duration) {
	if word.Load() != seen {
		return
	}
	b.waits++
	if a, _ := b.w.Awake(); a {
		b.unringing++
	}
}

func (b *waitProbe) Wake(*atomic.Uint32) {}

// TestParkNeverWaitsRung: a host rings a parking lane (its awake word goes from 0 to rung)
// for a call the lane does not find (a peer claimed it, or the lane took it before it
// parked), and its counter bump comes before the lane loads the counter. Ring rings no lane
// marked rung, so a lane that waited so marked would sleep through the next call's ring
// (the stall of process lanes in docs/benchmarks.md). Park must clear the mark and look
// again before it waits.
func TestParkNeverWaitsRung(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	w := r.LaneWake()
	bell := &waitProbe{w: w}
	looks := 0
	w.Park(bell, func() bool {
		if looks++; looks == 1 {
			// The ring's CAS; its counter bump went before the lane's load, so the counter
			// the lane waits on equals the one it loaded.
			if !w.awake.CompareAndSwap(0, rung) {
				t.Fatal("Ring's CAS failed on a parking lane")
			}
		}
		return false
	}, time.Second)
	if bell.waits != 1 || bell.unringing != 0 {
		t.Fatalf("Park waited %d times, %d of them where Ring could not reach it", bell.waits, bell.unringing)
	}
	if looks != 2 {
		t.Fatalf("Park looked for work %d times after it was rung for nothing, want 2", looks)
	}
}

// A Backoff goes cold for a window after a descheduling; the window doubles while
// deschedulings follow soon after the last window, and starts from coldMin again after a
// quiet spell.
func TestBackoff(t *testing.T) {
	var b Backoff
	if b.Cold(1) || b.Window() != 0 {
		t.Fatal("a zero Backoff is cold")
	}
	now := 10 * time.Second
	b.Descheduled(now)
	if !b.Cold(now+coldMin-1) || b.Cold(now+coldMin) || b.Window() != coldMin {
		t.Fatalf("after a descheduling: window %v", b.Window())
	}
	for w := 2 * coldMin; w <= coldMax; w *= 2 {
		now += b.Window() + time.Microsecond // soon after the window ended
		b.Descheduled(now)
		if b.Window() != w || !b.Cold(now+w-1) {
			t.Fatalf("window %v, want %v", b.Window(), w)
		}
	}
	now += b.Window()
	b.Descheduled(now)
	if b.Window() != coldMax {
		t.Fatalf("window %v beyond %v", b.Window(), coldMax)
	}
	now += 10 * coldMax // a quiet spell
	b.Descheduled(now)
	if b.Window() != coldMin {
		t.Fatalf("after a quiet spell: window %v, want %v", b.Window(), coldMin)
	}
}

// A spinner goes cold after coldAfter spins in a row that find nothing, but not for spins
// that waited for a peer it knows was asleep (PeerAsleep); a cold spinner polls once and
// parks. Spinners that share a Backoff that is cold do not spin either. (The spinner's own
// Backoff is reset before each spin that must spin: a test descheduled on a loaded machine
// makes it cold, rightly.)
func TestSpinnerMisses(t *testing.T) {
	polls := 0
	never := func() bool { polls++; return false }
	s := Spinner{Budget: 20 * time.Microsecond, OS: true}
	for range 2 * coldAfter {
		s.PeerAsleep()
		polls, s.own = 0, Backoff{}
		if s.Until(never) || polls < 2 {
			t.Fatalf("an excused spinner did not spin (%d polls)", polls)
		}
	}
	for s.misses < coldAfter {
		s.own = Backoff{}
		s.Until(never)
	}
	polls = 0
	if s.Until(never) || polls != 1 {
		t.Fatalf("a cold spinner polled %d times, want 1", polls)
	}
	s.Parked(time.Microsecond) // a short park: work came back soon
	polls, s.own = 0, Backoff{}
	if s.Until(never); polls < 2 {
		t.Fatalf("a spinner warm again polled %d times", polls)
	}
	var b Backoff
	b.Descheduled(Now())
	shared := Spinner{Budget: time.Millisecond, OS: true, Backoff: &b}
	polls = 0
	if shared.Until(never) || polls != 1 {
		t.Fatalf("a spinner whose Backoff is cold polled %d times, want 1", polls)
	}
}

// The producer's room mark is seen once by the consumer's RoomWanted after a retire.
func TestRoomMark(t *testing.T) {
	layout := Layout{Inline: 64, Arena: 64, AbortBits: 1}
	r, err := NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, c := r.Returns().Producer(), r.Returns().Consumer()
	if c.RoomWanted() {
		t.Fatal("room wanted before any mark")
	}
	p.WantRoom()
	if !c.RoomWanted() || c.RoomWanted() {
		t.Fatal("the mark is not seen exactly once")
	}
	p.WantRoom()
	p.NoRoomWanted()
	if c.RoomWanted() {
		t.Fatal("a cleared mark is seen")
	}
}

// A timed wait on a ChanBell reuses the bell's timer: a remote lane's caller alone on the
// lane waits on one for every call (its direct doorbell), bounded by a safety timeout.
func TestChanBellTimedWaitDoesNotAllocate(t *testing.T) {
	var w atomic.Uint32
	b := NewChanBell()
	allocs := testing.AllocsPerRun(100, func() {
		b.Wake(&w)
		b.Wait(&w, 0, time.Second) // the token ends it; the timer was armed all the same
	})
	if allocs != 0 {
		t.Fatalf("a timed wait allocates %v times, want 0", allocs)
	}
}
