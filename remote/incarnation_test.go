package remote

import (
	"sync/atomic"
	"testing"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// heapIncarnation is an incarnation over a heap region, ready, with no link: enough for
// its flow control.
func heapIncarnation(t *testing.T, layout fastpath.Layout) (*incarnation, *fastpath.Consumer) {
	t.Helper()
	layout = layout.WithDefaults()
	r, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &incarnation{region: r, req: r.Requests().Consumer(), ret: r.Returns().Producer(), stats: r.Stats(), ready2: true}
	return c, r.Returns().Consumer()
}

// hold records n calls as sent, sequence numbers 1 to n, with in bytes of input each, and
// their results as received.
func hold(c *incarnation, n, in int) {
	for seq := uint64(1); seq <= uint64(n); seq++ {
		c.out[seq%uint64(len(c.out))] = sent{seq: seq, size: in, live: true}
		c.nOut++
		c.bytesOut += in
		c.pending = append(c.pending, Result{Seq: seq})
	}
}

// Results that find the return ring full wait for the pool to drain it without keeping
// the forwarder awake: it has no work until a slot is retired, and the drain that retires
// one is told to ring it (the ring's room mark). A forwarder that counted waiting results
// as work spun, on a 2-core machine, on the core the pool drains on (the window row of the
// remote benchmark moved 7.7 k calls/s with a 256-call window instead of 116 k).
func TestForwarderParksForRoom(t *testing.T) {
	c, drain := heapIncarnation(t, fastpath.Layout{})
	hold(c, fastpath.Slots+5, 8)
	c.mu.Lock()
	if n := c.publishLocked(); n != fastpath.Slots {
		t.Fatalf("published %d results on an empty ring, want its %d slots", n, fastpath.Slots)
	}
	c.mu.Unlock()
	if c.work() {
		t.Fatal("the forwarder has work with every result waiting for a ring nobody drained")
	}
	if c.nOut != 5 || len(c.pending) != 5 {
		t.Fatalf("%d calls out and %d results waiting, want 5 and 5", c.nOut, len(c.pending))
	}
	// The pool drains: its retire sees the mark (and the lane's Room hook rings the
	// forwarder), and the forwarder has work again.
	drain.Retire(drain.Poll())
	if !drain.RoomWanted() {
		t.Fatal("the drain that made room was not asked to ring the forwarder")
	}
	if !c.work() {
		t.Fatal("no work for the forwarder after the pool made room")
	}
	c.mu.Lock()
	n := c.publishLocked()
	c.mu.Unlock()
	if n != 5 || c.nOut != 0 || c.bytesOut != 0 || c.work() {
		t.Fatalf("after the drain: published %d, %d calls out, %d bytes out, work %v; want 5, 0, 0, false",
			n, c.nOut, c.bytesOut, c.work())
	}
}

// The calls on the node are bounded by count (Window) and by their inputs' bytes (the
// lane's arena), one call always going; a forwarder bound by either sends nothing until
// results free room.
func TestWindowBounds(t *testing.T) {
	c, _ := heapIncarnation(t, fastpath.Layout{Arena: 1 << 20})
	arena := c.region.Layout().Arena
	if !c.fits(2 * arena) {
		t.Fatal("a call larger than the budget may not go with nothing on the node")
	}
	hold(c, 3, arena/4)
	c.pending = nil
	if !c.fits(arena/4) || c.fits(arena/4+1) {
		t.Fatalf("with %d of %d bytes out: fits(%d) = %v, fits(%d) = %v; want true, false",
			c.bytesOut, arena, arena/4, c.fits(arena/4), arena/4+1, c.fits(arena/4+1))
	}
	c.byteBound = true
	if got := c.sendable(); got != 0 {
		t.Fatalf("a forwarder bound by bytes may send %d calls, want 0", got)
	}
	c.byteBound = false
	hold(c, Window-3, 0)
	if got := c.sendable(); got != 0 {
		t.Fatalf("with %d calls out the forwarder may send %d more, want 0", c.nOut, got)
	}
}

// wakeCount is a Bell that counts its wakes.
type wakeCount struct {
	*fastpath.ChanBell
	n int
}

func (b *wakeCount) Wake(w *atomic.Uint32) { b.n++; b.ChanBell.Wake(w) }

// A caller alone on a remote lane sleeps on the return ring's direct doorbell as a
// goroutine (DirectBell, a channel): the results the endpoint's actor publishes must ring
// that bell. A caller asleep in a futex held its thread, and the forwarder it had just
// readied waited for the scheduler to take that thread's P back (docs/benchmarks.md).
func TestResultsRingTheDirectWaiter(t *testing.T) {
	c, drain := heapIncarnation(t, fastpath.Layout{})
	bell := &wakeCount{ChanBell: fastpath.NewChanBell()}
	c.doneBell, c.dirBell = fastpath.NewChanBell(), bell
	d := c.region.Returns().Direct()
	d.Arm()
	hold(c, 1, 8)
	c.mu.Lock()
	n := c.publishLocked()
	c.mu.Unlock()
	c.signalDone()
	if bell.n != 1 {
		t.Fatalf("a published result rang the direct waiter's bell %d times, want once", bell.n)
	}
	d.Wait(c.DirectBell(), 0) // returns: the doorbell was signalled and its bell rung
	if got := drain.Poll(); n != 1 || got == 0 {
		t.Fatalf("published %d results, the ring holds %b; want 1", n, got)
	}
}

// A forward whose last call polled fills the window exactly takes no refill from the
// backlog: it once did, and sent the refill's first call past the window. With more calls
// out than the window, room() was negative, which work() did not take for a full window:
// the forwarder parked unmarked as starved, results freed the window without ringing it,
// and its calls waited for the heartbeat's stall check (a second's stall, found by a
// 1024-future stress test).
func TestForwardStopsAtTheWindow(t *testing.T) {
	c, _ := heapIncarnation(t, fastpath.Layout{})
	c.n = &Nodes{ep: &Member{e: &Endpoint{closed: true}}} // frames go nowhere
	c.k = &link{}
	publish := calls(t, c, Window-4) // hold numbers its calls from 1
	hold(c, Window-4, 0)
	c.pending = nil
	publish(4)
	refills := 0
	c.launch.Refill = func() { refills++; publish(4) } // the backlog has more
	c.forward()
	if c.nOut != Window || refills != 0 {
		t.Fatalf("%d calls out after a forward with room for 4 (window %d), %d refills; want %d and none",
			c.nOut, Window, refills, Window)
	}
	publish(4)
	if c.work() || !c.starved {
		t.Fatalf("calls waiting with the window full: work %v, starved %v; want false, true (results ring a starved forwarder)",
			c.work(), c.starved)
	}
}

// calls returns a function that publishes n calls on c's request ring, numbered on from
// seq, as the pool does.
func calls(t *testing.T, c *incarnation, seq uint64) func(n int) {
	reqs := c.region.Requests().Producer()
	return func(n int) {
		for range n {
			i, ok := reqs.Reserve()
			if !ok {
				t.Fatal("the request ring is full")
			}
			reqs.Empty(i)
			seq++
			reqs.Slot(i).SetSeq(seq)
			reqs.Stage(i)
		}
		reqs.Flush()
	}
}

// A forwarder woken for a few calls while others are out on the node lets the callers their
// results wake submit first (gather), so that their calls leave in one frame; without it,
// fewer callers than the window got a frame a call (docs/remote.md). A lone caller's call,
// a ring half full and a full window go at once.
func TestForwarderGathers(t *testing.T) {
	c, _ := heapIncarnation(t, fastpath.Layout{})
	publish := calls(t, c, Window)
	publish(1)
	if c.gather() {
		t.Fatal("the forwarder holds back a lone caller's call")
	}
	hold(c, 8, 0)
	c.pending = nil
	if !c.gather() {
		t.Fatal("woken for one call with 8 out, the forwarder does not let the others submit")
	}
	publish(fastpath.Slots/2 - 1)
	if c.gather() {
		t.Fatal("the forwarder holds back a ring half full")
	}
	hold(c, Window-8, 0)
	if c.gather() {
		t.Fatal("the forwarder yields with no room to send")
	}
}
