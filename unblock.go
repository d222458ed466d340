package knit

import (
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/lifecycle"
)

// moveQueued ends head-of-line blocking on process lanes: a lane that has run the same call
// of its own ring for MoveQueuedAfter is passed by (the balancer sends it nothing while it
// runs that call), and the calls queued behind that call, which it has not started, move
// to other lanes — as long as another lane is not in the same state, where moving would
// only shuffle them. The lane and the host agree on which calls moved through the region's
// gate word (fastpath.Gate): a call either started where it was or runs elsewhere, never
// both. The watchdog calls it every MoveQueuedAfter/2 while any lane holds or runs a call;
// busy is false when none did at this look (see Pool.moveIdle).
func (p *Pool) moveQueued(now time.Time) (busy bool) {
	after := p.cfg.MoveQueuedAfter
	n := p.laneCount()
	var long []*lane
	free := false // a ready lane not held up by a long call
	for i := range n {
		l := p.slots[i].cur.Load()
		if l == nil || l.local != nil || l.State() != lifecycle.LaneReady {
			continue
		}
		// inflight is read after the watchdog set moveIdle: see Pool.moveIdle.
		lg, running := l.runsLong(now, after)
		busy = busy || running || l.inflight.Load() != 0
		if lg {
			long = append(long, l)
		} else {
			free = true
		}
	}
	if !free {
		return busy
	}
	for _, l := range long {
		l.moveQueued(now)
	}
	return busy
}

// wakeMover restarts the watchdog's moveQueued looks, which it stopped when no lane held a
// call: a lane accepted its first one (lane.Accept).
func (p *Pool) wakeMover() {
	if p.moveIdle.CompareAndSwap(true, false) {
		select {
		case p.moveWake <- struct{}{}:
		default: // a wake is pending already
		}
	}
}

// runsLong reports whether the lane has been running the same call of its own ring since
// at least after ago, by the watchdog's looks; the balancer passes by a lane that does.
// running is whether it runs a call at all.
func (l *lane) runsLong(now time.Time, after time.Duration) (long, running bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return false, false
	}
	word := l.Region().Running().Load()
	running = fastpath.Busy(word)
	if seq := fastpath.Started(word); !running || seq != l.longSeq || l.longSince.IsZero() {
		l.longSeq, l.longSince = seq, now
		l.long.Store(0)
		return false, running
	}
	long = now.Sub(l.longSince) >= after
	if long {
		l.long.Store(l.longSince.UnixNano())
	} else {
		l.long.Store(0)
	}
	return long, running
}

// laterLong is whichever of two lanes held up by a long call (nil: none) started its long
// call later. When every lane is held up, a call goes there: the longer a call has run, the
// longer it is likely to run still, and the lane that merely ran one call slowly (a loaded
// machine can stall a lane for MoveQueuedAfter) should not send calls back behind the
// call that has run for minutes, from where they would move again.
func laterLong(a, b *lane) *lane {
	if a == nil || b.long.Load() > a.long.Load() {
		return b
	}
	return a
}

// moveQueued moves the calls queued behind the lane's long call to other lanes.
func (l *lane) moveQueued(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() || l.inflight.Load() <= 1 {
		return
	}
	started, ok := l.ring.Withdraw(l.Region().Gate())
	if !ok {
		return
	}
	end := actors.LaneEnd{Owner: l.p.id, Lane: l.key, Started: started, Requeue: l.p.requeue,
		Err: func(bool, bool) error { return l.p.closedError() }}
	moved := 0
	for _, d := range l.p.defs {
		moved += d.Withdraw(end)
	}
	l.inflight.Add(int32(-moved))
	l.moved.Add(uint64(moved))
	l.p.callDone()
	l.Debug("calls queued behind a long call moved to other lanes", zap.Int("calls", moved),
		zap.Duration("running", now.Sub(l.longSince).Round(time.Millisecond)))
}
