package knit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// stallTask is defined here, not in tasks_test.go with the other test tasks: this test is
// internal (package knit), which cannot refer to what tasks_test.go (package knit_test)
// defines.
var stallTask = Define("test.pool.stall", func(context.Context, int) (int, error) { return 0, nil })

// countBell counts its wakes.
type countBell struct{ n atomic.Int32 }

func (b *countBell) Wait(*atomic.Uint32, uint32, time.Duration) {}
func (b *countBell) Wake(*atomic.Uint32)                        { b.n.Add(1) }

// The watchdog's backstop: a lane whose awake word says awake but that reads nothing of its
// ring between two looks while a call waits there is woken anyway; one that reads, or has
// nothing waiting, is not. (A parked one is rung at once, as before.)
func TestRingStalledWakesAStuckLane(t *testing.T) {
	h, err := NewResultHarness(stallTask)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l := h.l
	bell := &countBell{}
	l.laneBell = bell
	publish := func() {
		p := l.Region().Requests().Producer()
		slot, ok := p.Reserve()
		if !ok {
			t.Fatal("no free slot")
		}
		p.Empty(slot)
		p.Stage(slot)
		p.Flush()
	}
	publish()
	l.ringStalled() // the first look notes what the lane has read
	if n := bell.n.Load(); n != 0 {
		t.Fatalf("%d wakes at the first look at an awake lane", n)
	}
	l.ringStalled() // nothing read since: woken whatever its word says
	if n := bell.n.Load(); n != 1 {
		t.Fatalf("%d wakes at the second look, want 1", n)
	}
	cons := l.Region().Requests().Consumer()
	cons.Retire(cons.Poll()) // the lane reads its ring
	l.ringStalled()
	if n := bell.n.Load(); n != 1 {
		t.Fatalf("a lane with nothing waiting was woken (%d wakes)", n)
	}
	publish()
	l.ringStalled()
	if n := bell.n.Load(); n != 1 {
		t.Fatalf("a lane that read its ring since the last look was woken (%d wakes)", n)
	}
}
