package fastpath

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/latency"
	"github.com/knitgo/knit/internal/spin"
)

// Bell parks a goroutine on a 32-bit word and wakes it. Implementations may wake spuriously;
// callers re-check their condition.
type Bell interface {
	// Wait blocks while *word == seen, for at most timeout (≤ 0: no limit).
	Wait(word *atomic.Uint32, seen uint32, timeout time.Duration)
	// Wake wakes a waiter on word.
	Wake(word *atomic.Uint32)
}

// FutexBell parks on the word itself with non-private futex operations, so it works across
// processes that share the mapping. A parked goroutine holds its OS thread.
type FutexBell struct{}

// Wait implements Bell.
func (FutexBell) Wait(word *atomic.Uint32, seen uint32, timeout time.Duration) {
	_ = futex.Wait(word, seen, timeout) // timeouts and spurious wakes are the caller's re-check
}

// Wake implements Bell.
func (FutexBell) Wake(word *atomic.Uint32) { _, _ = futex.Wake(word, 1) }

// ChanBell parks in the Go scheduler: a goroutine handoff is far cheaper than a futex wake,
// so in-process lanes use it. It serves exactly one waiter.
type ChanBell struct {
	c chan struct{}
	t *time.Timer // the waiter's, kept between timed waits (one waiter: no lock)
}

// NewChanBell returns a ChanBell.
func NewChanBell() *ChanBell { return &ChanBell{c: make(chan struct{}, 1)} }

// Wait implements Bell. A token left by an earlier Wake makes it return at once, so no wake
// is lost between the caller's last check and the wait.
func (b *ChanBell) Wait(word *atomic.Uint32, seen uint32, timeout time.Duration) {
	if word.Load() != seen {
		return
	}
	if timeout <= 0 {
		<-b.c
		return
	}
	if b.t == nil {
		b.t = time.NewTimer(timeout)
	} else {
		b.t.Reset(timeout) // stopped, and its channel drained by Stop (Go 1.23 timers)
	}
	select {
	case <-b.c:
	case <-b.t.C:
	}
	b.t.Stop()
}

// Wake implements Bell.
func (b *ChanBell) Wake(*atomic.Uint32) {
	select {
	case b.c <- struct{}{}:
	default:
	}
}

// EventBell rings an eventfd, which the waiting side reads through Go's netpoller: no OS
// thread is held while it waits. The fd can be inherited by a child process.
type EventBell struct{ FD EventFD }

// EventFD is a counter descriptor such as a Linux eventfd: Signal adds one; Wait blocks
// until the counter is non-zero (then reads and clears it) or the timeout passes.
type EventFD interface {
	Signal() error
	Wait(timeout time.Duration) (uint64, error)
}

// Wait implements Bell.
func (b EventBell) Wait(word *atomic.Uint32, seen uint32, timeout time.Duration) {
	if word.Load() != seen {
		return
	}
	_, _ = b.FD.Wait(timeout)
}

// Wake implements Bell.
func (b EventBell) Wake(*atomic.Uint32) { _ = b.FD.Signal() }

// Wake is the lane doorbell: a wake counter the consumer parks on and an awake flag. The
// consumer clears its flag, re-checks for work, then parks on the counter it read; the
// producer, after publishing, bumps the counter and rings only when the flag is clear. With
// sequentially consistent atomics one of the two always sees the other, so no wake is lost.
type Wake struct {
	counter, awake *atomic.Uint32
}

// Park sleeps until rung, or until timeout (a safety net), unless ready reports work after
// the awake flag is cleared.
//
// A lane never waits marked rung: Ring rings no lane so marked, and a lane rung between the
// swap and the load of the counter (for a call a peer claimed, or one it took before it
// parked) would sleep through the ring of the next call. It clears the mark and looks
// again instead.
func (w *Wake) Park(bell Bell, ready func() bool, timeout time.Duration) {
	w.awake.Swap(0) // a full barrier before re-checking: see Producer.Publish
	for {
		seen := w.counter.Load()
		if ready() {
			break
		}
		if w.awake.CompareAndSwap(rung, 0) { // each turn takes a Ring: one per publication at most
			continue
		}
		bell.Wait(w.counter, seen, timeout)
		break
	}
	w.awake.Store(1)
}

// Awake reports whether the consumer is awake (running or polling), not parked; woken is
// true while a Ring has woken it and it has not run yet.
func (w *Wake) Awake() (awake, woken bool) {
	a := w.awake.Load()
	return a != 0, a == rung
}

// rung is the awake word of a consumer a Ring woke, until it runs.
const rung = 2

// Rings reads the wake counter: it moves with every Ring and Force.
func (w *Wake) Rings() uint32 { return w.counter.Load() }

// SetAwake marks the consumer awake (it is after boot and after every Park).
func (w *Wake) SetAwake() { w.awake.Store(1) }

// Ring wakes the consumer if it is parked or about to park, and marks it awake, so that
// the next Ring before it runs rings no more (a stealing pool then rings another lane); it
// costs one load when the consumer is awake. A ChanBell keeps its wake as a token that the
// next Wait takes, so it needs no bump of the counter.
func (w *Wake) Ring(bell Bell) bool {
	if w.awake.Load() != 0 || !w.awake.CompareAndSwap(0, rung) {
		return false
	}
	if _, ok := bell.(*ChanBell); !ok {
		w.counter.Add(1)
	}
	bell.Wake(w.counter)
	return true
}

// waitRoom is the awake word of a lane parked until the host frees a slot of its return
// ring (ParkRoom): it waits for the host to drain, not for calls, so Ring leaves it parked.
const waitRoom = 3

// ParkRoom is Park for a lane whose return ring is full: it sleeps until a Force, or for
// timeout (it must be positive: a safety net), unless ready (room) reports true after the
// awake word is set. The lane marks its return ring first (Producer.WantRoom), and the host
// that retires slots and finds the mark rings it with Force (the mark shares a cache line
// with the host's retire word, so looking at it costs a drain nothing; reading the lane's
// awake word on every drain cost a process-lane call about a fifth, docs/benchmarks.md).
// Before the mark the lane polled every millisecond, which on a loaded machine was the pace
// of the whole pool (docs/benchmarks.md, "Spinning on a busy machine").
func (w *Wake) ParkRoom(bell Bell, ready func() bool, timeout time.Duration) {
	w.awake.Swap(waitRoom) // a full barrier before re-checking, as in Park

	seen := w.counter.Load()
	if !ready() {
		bell.Wait(w.counter, seen, timeout)
	}
	w.awake.Store(1)
}

// WaitingForRoom reports whether the lane is parked in ParkRoom (or about to be).
func (w *Wake) WaitingForRoom() bool { return w.awake.Load() == waitRoom }

// Force bumps the counter and rings whatever the flag says (stop requests use it).
func (w *Wake) Force(bell Bell) {
	w.counter.Add(1)
	bell.Wake(w.counter)
}

// Completion doorbell states.
const (
	ArmOff       uint32 = 0
	ArmArmed     uint32 = 1
	ArmSignalled uint32 = 2
)

// Completion is the result doorbell of a return ring. The consumer arms it before sleeping
// and re-checks the ring; the producer signals by CAS from armed, so a burst of results
// rings once.
type Completion struct{ arm *atomic.Uint32 }

// Word is the arm word.
func (c Completion) Word() *atomic.Uint32 { return c.arm }

// Arm marks the consumer as about to sleep. Re-check the ring after arming.
func (c Completion) Arm() { c.arm.Swap(ArmArmed) } // a full barrier: see Producer.Publish

// Disarm marks the consumer awake.
func (c Completion) Disarm() { c.arm.Store(ArmOff) }

// Wait sleeps while the doorbell stays armed.
func (c Completion) Wait(bell Bell, timeout time.Duration) { bell.Wait(c.arm, ArmArmed, timeout) }

// Signal rings the doorbell if it is armed; only the first producer of a burst wins the CAS.
func (c Completion) Signal(bell Bell) bool {
	if c.arm.Load() == ArmArmed && c.arm.CompareAndSwap(ArmArmed, ArmSignalled) {
		bell.Wake(c.arm)
		return true
	}
	return false
}

// Spinner waits for a condition by polling it, and decides by itself whether polling is
// worth it: it spins only while work keeps coming back sooner than a park and wake would
// cost, and only while it keeps its core. Between polls it issues a CPU pause; every
// checkEvery polls it reads the clock. It never yields the CPU to other processes: on a
// machine where other threads want the cores, a spinner that yields hands its core to one
// of them for the rest of a scheduler slice (milliseconds), and one that does not is
// descheduled all the same, while its peer, told it is awake, does not ring it
// (docs/benchmarks.md, "Spinning on a busy machine"). A spinner that finds it was
// descheduled while it spun (a gap between two clock readings far longer than the polls
// between them) goes cold instead: it parks at once for a while (Backoff), and spins
// again afterwards to see whether the cores are free again. A zero Spinner never spins. Not
// safe for concurrent use (its Backoff is).
type Spinner struct {
	Budget time.Duration // longest spin (zero or less: none)
	// OS marks a spinner with no other goroutine to let run (a lane process's executor): it
	// never calls runtime.Gosched. Others yield to their goroutines every checkEvery polls.
	OS bool
	// Backoff is shared by the spinners that wait for the same peers (nil: the spinner's own).
	Backoff *Backoff
	// misses counts spins in a row that ran out; at coldAfter the spinner is cold: the next
	// waits park at once until a park shows that work came back within Budget after all.
	misses int
	// excused: the peer was asleep when the spinner last handed it something (PeerAsleep),
	// so a spin that runs out waiting for its answer counts as no miss: the peer's wake-up
	// took longer than the budget, which says nothing of the pace of the work.
	excused bool
	own     Backoff
}

// PeerAsleep tells the spinner that the peer whose work it is about to wait for was asleep
// when it was handed its last piece (a lane rang a parked caller with a result): if this
// spin runs out, it is no miss.
func (s *Spinner) PeerAsleep() { s.excused = true }

// coldAfter is how many spins in a row must run out before a spinner stops spinning: one
// unlucky gap (a descheduled peer) must not make both sides of a busy lane park.
const coldAfter = 3

// checkEvery is how many polls a spinner makes between two readings of the clock (and, if
// it has goroutines to let run, between two runtime.Gosched).
const checkEvery = 64

// Until reports whether ready returned true within the spin. False means: park.
func (s *Spinner) Until(ready func() bool) bool {
	excused := s.excused
	s.excused = false
	if ready() {
		s.misses = 0
		return true
	}
	if s.Budget <= 0 || s.misses >= coldAfter {
		return false
	}
	b := s.Backoff
	if b == nil {
		b = &s.own
	}
	now := Now()
	if b.Cold(now) {
		return false
	}
	start, last := now, now
	for i := 1; ; i++ {
		spin.Pause()
		if ready() {
			s.misses = 0
			return true
		}
		if i%checkEvery != 0 {
			continue
		}
		t := Now()
		if t-last > Descheduled {
			b.Descheduled(t)
			return false
		}
		if t-start >= s.Budget {
			if !excused {
				s.misses++
			}
			return false
		}
		if !s.OS {
			runtime.Gosched() // what runs meanwhile is the process's own work, not a preemption
			t = Now()
		}
		last = t
	}
}

// Parked tells the spinner how long the park that followed a failed spin lasted: a park
// shorter than the budget means the work came soon enough for spinning to pay again.
func (s *Spinner) Parked(d time.Duration) {
	if d < s.Budget {
		s.misses = 0
	}
}

// Now reads the monotonic clock (the runtime's nanotime: one vDSO call).
func Now() time.Duration { return latency.Now() }

// Descheduled is the gap between two readings of a spinner's clock, checkEvery polls apart
// (a few microseconds), beyond which the spinner was not running: the scheduler gave its
// core to another thread for a slice (a millisecond or more). Shorter gaps, up to a few
// hundred microseconds, come and go on an idle machine (interrupts, the hypervisor, a
// kernel thread: 50 to 160 µs on the reference VM) and say nothing about spinning.
const Descheduled = 500 * time.Microsecond

// Backoff is when spinning does not pay: after a spinner was descheduled, spinners that
// share it park at once for a cold window, which doubles each time a spinner is descheduled
// again soon after the last window ended (up to coldMax), and starts again from coldMin
// when that happens rarely. The spin after a window is the probe: on a machine whose cores
// are free again it is not descheduled, and spinning goes on. Safe for concurrent use; its
// zero value is warm.
type Backoff struct {
	until  atomic.Int64 // Now before which spinners park at once
	window atomic.Int64 // the last cold window
}

// Cold windows: the first after a quiet spell, and the longest.
const (
	coldMin = time.Millisecond
	coldMax = 256 * time.Millisecond
)

// Cold reports whether spinners park at once at now.
func (b *Backoff) Cold(now time.Duration) bool { return int64(now) < b.until.Load() }

// Descheduled records that a spinner was descheduled at now: it goes cold.
func (b *Backoff) Descheduled(now time.Duration) {
	w, end := time.Duration(b.window.Load()), time.Duration(b.until.Load())
	if w == 0 || now-end > 4*w {
		w = coldMin
	} else {
		w = min(2*w, coldMax)
	}
	b.window.Store(int64(w))
	b.until.Store(int64(now + w))
}

// Window is the last cold window (0: never cold).
func (b *Backoff) Window() time.Duration { return time.Duration(b.window.Load()) }
