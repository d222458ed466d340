package knit

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/lifecycle"
)

// watchdog looks after a process pool's lanes every Liveness/3, whatever the calls do: it
// drains every return ring, so that a result whose doorbell was lost (a lane that closed or
// replaced its descriptors) still settles; it moves backlogs into free slots; and it kills a
// lane whose heartbeat has stood still for Liveness (SIGSTOP, a stuck runtime): its calls
// settle and the supervisor restarts it.
func (p *Pool) watchdog(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(p.cfg.Liveness / 3)
	defer t.Stop()
	type seen struct {
		l    *lane
		beat uint32
		at   time.Time
	}
	last := make([]seen, len(p.lanes))
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		for i := range p.lanes {
			l := p.lanes[i].Load()
			if l == nil || l.proc == nil || l.state.Load() != laneReady {
				continue
			}
			l.drain()
			if l.queued.Load() > 0 {
				l.flush() // a backlog is moved on submit and after results: never left behind
			}
			beat, ok := l.heartbeat()
			if !ok {
				continue
			}
			s := &last[i]
			if s.l != l || s.beat != beat {
				*s = seen{l: l, beat: beat, at: now}
				continue
			}
			if still := now.Sub(s.at); still >= p.cfg.Liveness {
				l.debug("heartbeat stood still: killing the lane", zap.Duration("still", still))
				l.kill(lifecycle.Exit{Unresponsive: fmt.Sprintf("no heartbeat for %v", still.Round(time.Millisecond))})
			}
		}
	}
}

// heartbeat reads a process lane's heartbeat counter, unless its region is gone.
func (l *lane) heartbeat() (uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unmapped {
		return 0, false
	}
	return l.region.Heartbeat().Load(), true
}

// frozen reports whether process pid is stopped (SIGSTOP, a debugger): a spare in that state
// would make a restart wait for nothing.
func frozen(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state == 'T' || state == 't'
}
