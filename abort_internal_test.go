package knit

import (
	"context"
	"sync/atomic"
	"testing"
)

var abortProbe = Define("test.internal.abortProbe", func(_ context.Context, n int) (int, error) { return n, nil })

// A call whose caller gave up while it looked for a lane (its expiry found it on no lane)
// gets its abort bit raised as its new lane accepts it: otherwise a task that waits for its
// context would hold that lane for good, and every call behind it.
func TestAcceptRaisesAbortOfCancelledCall(t *testing.T) {
	p, err := NewPool(Config{Runtime: Process, Lanes: 1}, abortProbe)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	l := p.slots[0].cur.Load()
	for _, cancelled := range []bool{false, true} {
		done := make(chan struct{})
		if cancelled {
			close(done)
		}
		var lane, abort atomic.Int32
		var seq atomic.Uint64
		c := call{def: abortProbe.def, id: 7, lane: &lane, abort: &abort, seq: &seq, done: done}
		l.mu.Lock()
		l.accept(&c)
		bit := abort.Load()
		raised := bit >= 0 && l.region.Aborts().Test(int(bit))
		l.mu.Unlock()
		if bit < 0 {
			t.Fatal("a cancellable call got no abort bit")
		}
		if raised != cancelled {
			t.Errorf("caller gave up: %v; abort bit raised: %v", cancelled, raised)
		}
		if err := l.freeAbort(bit, abortProbe.def.Index(), 7); err != nil {
			t.Fatal(err)
		}
		l.inflight.Add(-1)
	}
}
