package knit

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/procfs"
	"github.com/knitgo/knit/lifecycle"
)

// Recycling (Config.MaxCallsPerLane, ProcessConfig.MaxLaneMemory) and retiring (Resize)
// share one graceful end: Retire. A recycled lane serves until its replacement is ready
// (the supervisor boots it, from a spare for process lanes, and opens it in the same slot);
// then it retires: no new call, the ones it holds finish — its backlog drains through its
// own ring, so every caller's result comes from the lane it waits on — and then the usual
// stop protocol. Nothing runs twice and nothing is lost: a call is either finished by the
// retiring lane or, if the stop protocol has to cut it short (Close, or Resize's context),
// settled like the calls of any stopped lane (those that had not started run elsewhere).

// countCalls counts n calls the lane took (a Map chunk's elements count one by one) and asks
// for a recycle each time the count reaches or passes a multiple of MaxCallsPerLane (a
// replacement that could not boot is tried again max calls later). Called with mu held.
func (l *lane) countCalls(max, n int) {
	l.calls += n
	if l.calls/max > (l.calls-n)/max && l.p.tree != nil && !l.p.closing.Load() { // Close replaces nothing
		l.p.tree.Recycle(l.Idx, l.Inc, fmt.Sprintf("MaxCallsPerLane: %d calls taken (limit %d)", l.calls, max))
	}
}

// Retire implements supervisor.Worker: the lane takes no new call, finishes the ones it
// holds, and then runs the stop protocol; once hurry is closed it stops at once. It returns
// once the lane has ended.
func (l *lane) Retire(hurry <-chan struct{}) bool {
	l.mu.Lock()
	l.Retiring()
	if (l.cid >= 0 || l.local != nil) && !l.Unmapped() {
		l.Region().Open().Store(0) // a stealing lane takes no more from the shared ring or its peers
	}
	l.mu.Unlock()
	if sh := l.p.shared; sh != nil && l.cid >= 0 {
		sh.leaving() // calls it was counted for go to the other lanes
	}
	l.Debug("retiring: finishing held calls", zap.Int32("in_flight", l.inflight.Load()))
wait:
	for l.inflight.Load() > 0 {
		select {
		case <-l.idle:
		case <-l.Settled():
			break wait
		case <-hurry:
			break wait
		}
	}
	acked := l.Stop()
	if l.p.slots[l.Idx].old.CompareAndSwap(l, nil) {
		l.p.signal() // Resize may wait for it
	}
	return acked
}

// retireIdle tells Retire that a retiring lane's last call has settled.
func (l *lane) retireIdle() {
	select {
	case l.idle <- struct{}{}:
	default:
	}
}

// checkMemory asks for a recycle of a process lane whose resident memory is over
// MaxLaneMemory. The watchdog calls it at every tick, for ready lanes only; the supervisor
// drops repeated requests while the replacement boots.
func (p *Pool) checkMemory(l *lane) {
	max := p.cfg.Process.MaxLaneMemory
	if max <= 0 || !l.reaper || l.State() != lifecycle.LaneReady || p.closing.Load() {
		return
	}
	rss, err := procfs.RSS(l.Run().PID()) // /proc/PID/statm: one small read
	if err != nil || rss <= max {
		return
	}
	l.Debug("lane memory over MaxLaneMemory: recycling", zap.Int64("rss", rss), zap.Int64("limit", max))
	p.tree.Recycle(l.Idx, l.Inc, fmt.Sprintf("MaxLaneMemory: resident memory %d MiB over the limit of %d MiB", rss>>20, max>>20))
}
