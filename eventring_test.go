package knit

import (
	"testing"
)

func TestEventRing(t *testing.T) {
	var r eventRing
	last, changed := r.last()
	if ev, missed := r.since(0); ev != nil || missed != 0 || last != 0 {
		t.Fatalf("empty ring: %v, %d", ev, missed)
	}
	r.add(Event{Lane: 0})
	select {
	case <-changed:
	default:
		t.Fatal("add did not close the channel changed returned")
	}
	for i := 1; i < recentEvents+10; i++ {
		r.add(Event{Lane: i})
	}
	// 266 events: the ring holds the last 256, numbered 11…266.
	ev, missed := r.since(0)
	if len(ev) != recentEvents || missed != 10 || ev[0].Seq != 11 || ev[0].Lane != 10 || ev[len(ev)-1].Seq != 266 {
		t.Fatalf("since(0): %d events from %d, missed %d", len(ev), ev[0].Seq, missed)
	}
	if ev, missed = r.since(10); len(ev) != recentEvents || missed != 0 {
		t.Fatalf("since(10): %d events, missed %d", len(ev), missed)
	}
	if ev, missed = r.since(264); len(ev) != 2 || missed != 0 || ev[0].Seq != 265 || ev[1].Lane != 265 {
		t.Fatalf("since(264): %+v, missed %d", ev, missed)
	}
	if last, _ = r.last(); last != 266 {
		t.Fatalf("last: %d, want 266", last)
	}
	if ev, _ = r.since(266); ev != nil {
		t.Fatalf("since(last): %+v", ev)
	}
}
