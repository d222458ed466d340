package knit

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/lifecycle"
)

// watchdog looks after a process pool's lanes every Liveness/3, whatever the calls do (with
// Liveness off and MaxLaneMemory set, every second, for the memory alone): it
// drains every return ring, so that a result whose doorbell was lost (a lane that closed or
// replaced its descriptors) still settles; it moves backlogs into free slots (a stealing
// pool's shared one too, and it wakes lanes for calls left unclaimed); and it kills a
// lane whose heartbeat has stood still for Liveness (SIGSTOP, a stuck runtime): its calls
// settle and the supervisor restarts it. It samples each lane's resident memory for
// MaxLaneMemory (checkMemory). Recycled incarnations finishing their calls are looked after
// too. Every MoveQueuedAfter/2 it moves the calls queued behind a long one (moveQueued),
// as long as some lane holds a call: an idle pool's watchdog wakes once a tick, not 20 times
// a second (a wake-up of the host costs tens of µs of CPU on a VM).
func (p *Pool) watchdog(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := p.cfg.Liveness / beatsPerLiveness
	if tick <= 0 { // the watchdog runs for MaxLaneMemory alone
		tick = defaultLiveness / beatsPerLiveness
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var move <-chan time.Time // moveQueued's looks, more frequent; nil while no lane holds a call
	var mover *time.Ticker
	moveEvery := max(p.cfg.MoveQueuedAfter/2, time.Millisecond)
	if p.moveWake != nil {
		mover = time.NewTicker(moveEvery)
		defer mover.Stop()
		move = mover.C
	}
	type seen struct {
		l    *lane
		beat uint32
		at   time.Time
	}
	var last, lastOld []seen // per lane slot: its current and its recycled incarnation
	for {
		select {
		case <-stop:
			return
		case now := <-move:
			p.moveIdle.Store(true) // before the looks: see Pool.moveIdle
			if p.moveQueued(now) {
				p.moveIdle.Store(false)
			} else {
				mover.Stop()
				move = nil
			}
			continue
		case <-p.moveWake:
			if move == nil {
				mover.Reset(moveEvery)
				move = mover.C
			}
			p.moveQueued(time.Now())
			continue
		case <-t.C:
		}
		p.looks.Add(1)
		p.hostLimits.Check() // a lane may have lowered the host's own limits (prlimit64)
		now := time.Now()
		if sh := p.shared; sh != nil { // the same for the shared ring: its backlog, its claimants
			if sh.host.Queued() > 0 {
				sh.flush()
			}
			if sh.prod.Waiting() > 0 { // reads shared words only: safe beside the producer
				sh.wake()
			}
		}
		n := p.laneCount()
		for len(last) < n {
			last, lastOld = append(last, seen{}), append(lastOld, seen{})
		}
		for i := range n {
			for k, l := range p.slots[i].lanes() {
				if l == nil || !l.reaper {
					continue
				}
				if st := l.State(); st != lifecycle.LaneReady && st != lifecycle.LaneRetiring {
					continue
				}
				l.drain()
				if l.queued() > 0 {
					l.flush() // a backlog is moved on submit and after results: never left behind
				}
				l.ringStalled()
				if k == 0 {
					p.checkMemory(l)
				}
				if p.cfg.Liveness <= 0 {
					continue
				}
				beat, ok := l.heartbeat()
				if !ok {
					continue
				}
				s := &last[i]
				if k == 1 {
					s = &lastOld[i]
				}
				if s.l != l || s.beat != beat || beat&fastpath.BeatPaused != 0 && p.shared == nil && !l.awaited() {
					*s = seen{l: l, beat: beat, at: now}
					continue
				}
				if still := now.Sub(s.at); still >= p.cfg.Liveness {
					l.Debug("heartbeat stood still: killing the lane", zap.Duration("still", still))
					l.Kill(lifecycle.Exit{Unresponsive: fmt.Sprintf("no heartbeat for %v", still.Round(time.Millisecond))})
				}
			}
		}
	}
}

// heartbeat reads a process lane's heartbeat counter, unless its region is gone.
func (l *lane) heartbeat() (uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return 0, false
	}
	return l.Region().Heartbeat().Load(), true
}

// awaited reports whether calls wait for a lane: published on its ring and not read, or one
// running. A lane whose heartbeat is paused (fastpath.BeatPaused) is idle by its own word,
// which the watchdog believes only while this is false: a lane that froze while idle is
// found once a call waits for it, and ringStalled rings it first.
func (l *lane) awaited() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return false
	}
	return l.Region().Requests().Unread() || fastpath.Busy(l.Region().Running().Load())
}

// ringStalled rings a process lane that is parked while calls wait in its ring. The doorbell
// protocol loses no wake; this is the backstop that lets the lane's park safety net be long
// (parkSafetyNet), because an idle lane woken by that timer costs CPU. A false alarm (the
// lane retiring the last slot as it is read) costs one spurious wake-up.
//
// A lane whose awake word says it is not parked, but that has read nothing of its ring
// between two looks while calls wait there, is woken all the same (a Force, whatever the
// word says). A harness run on 2026-12-01 saw a StealDekker lane hold one call of its own
// ring for 3 s with every other lane idle (docs/benchmarks.md): a lane rung for a call it
// then did not find had waited marked rung, which no Ring wakes (fixed in fastpath.Wake.Park;
// this stays the backstop). A lane that is merely busy with a long task gets a futex wake
// nobody waits on.
func (l *lane) ringStalled() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return
	}
	req := l.Region().Requests()
	if !req.Unread() {
		l.stalled = false
		return
	}
	if awake, _ := l.wake.Awake(); !awake {
		l.wake.Ring(l.laneBell)
		return
	}
	consumed := req.Consumed()
	if l.stalled && consumed == l.stalledAt {
		l.wake.Force(l.laneBell)
	}
	l.stalled, l.stalledAt = true, consumed
}
