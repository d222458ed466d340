package knit_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/knitgo/knit"
)

// Events (events.go): OnEvent and the Events channel.

// A program that only uses OnEvent drops nothing, whatever the pool goes through; Events,
// once called, delivers the last transitions before it, then buffers (and drops past its
// capacity).
func TestEventsBufferOnlyOnceAsked(t *testing.T) {
	var n atomic.Int64
	ev := newEvents()
	p := newPool(t, knit.Config{Lanes: 1, EventBuffer: 2, OnEvent: func(e knit.Event) { n.Add(1); ev.on(e) }})
	restart := func(inc int) {
		t.Helper()
		if _, err := goexit.Call(context.Background(), p, 1); !errors.Is(err, knit.ErrWorkerExited) {
			t.Fatalf("goexit: %v", err)
		}
		ev.await(t, fmt.Sprintf("ready %d", inc), func(e knit.Event) bool { return e.Incarnation == inc && e.To == knit.StateReady })
	}
	for i := 1; i <= 3; i++ {
		restart(i)
	}
	if n.Load() < 3*4 {
		t.Fatalf("%d events for three restarts", n.Load())
	}
	if d := p.Stats().DroppedEvents; d != 0 {
		t.Fatalf("DroppedEvents %d with no one asking for Events", d)
	}
	ch := p.Events()
	if len(ch) != 2 {
		t.Fatalf("Events holds %d transitions, want the last 2", len(ch))
	}
	if e := <-ch; e.To != knit.StateBooting || e.Incarnation != 3 {
		t.Errorf("first replayed event %+v, want booting 3", e)
	}
	if e := <-ch; e.To != knit.StateReady || e.Incarnation != 3 {
		t.Errorf("second replayed event %+v, want ready 3", e)
	}
	restart(4) // four transitions into a channel of two
	if d := p.Stats().DroppedEvents; d == 0 {
		t.Errorf("DroppedEvents 0 once Events is read by no one")
	}
	if p.Events() != ch {
		t.Errorf("a second Events call returned another channel")
	}
}

// Events called after Close returns a closed channel (with what it remembered).
func TestEventsAfterClose(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 1}, add)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range p.Events() {
		n++
	}
	if n == 0 {
		t.Errorf("no transition remembered before Close")
	}
}
