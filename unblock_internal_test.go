package knit

import (
	"testing"
	"time"
)

// When every lane is held up by a long call, a call goes to the lane whose long call began
// last, not to the lowest one: on a loaded machine a lane can run one call for
// MoveQueuedAfter and be marked long beside a lane whose call has run for minutes, and
// calls sent back behind that call would only have to move again.
func TestPickPrefersTheLaterLongCall(t *testing.T) {
	for _, b := range []Balancer{LeastLoaded, RoundRobin, FirstIdle, Random} {
		p := &Pool{cfg: Config{Balancer: b}, slots: make([]laneSlot, 3)}
		p.size.Store(3)
		now := time.Now()
		since := []time.Duration{time.Minute, 5 * time.Millisecond, time.Second}
		for i, d := range since {
			l := &lane{p: p}
			l.Idx = i
			l.inflight.Store(1)
			l.long.Store(now.Add(-d).UnixNano())
			p.slots[i].cur.Store(l)
		}
		for range 10 {
			if got := p.pick(nil); got != p.slots[1].cur.Load() {
				t.Fatalf("%v: every lane held up, pick chose lane %d, want lane 1 (its long call began last)", b, got.Idx)
			}
		}
		p.slots[2].cur.Load().long.Store(0)
		if got := p.pick(nil); got != p.slots[2].cur.Load() {
			t.Fatalf("%v: pick chose lane %d, want lane 2 (the one not held up)", b, got.Idx)
		}
	}
}
