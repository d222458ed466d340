package knit

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/knitgo/knit/supervisor"
)

// State is where a lane is in its life. A lane goes booting → ready → stopping → closed,
// or ends crashed, exited or startup_failed; the supervisor then has it restarting or,
// past its restart intensity under the CrashLoop policy, crash_loop_backoff (and booting
// again as a new incarnation after the delay), or dead. The pool itself reports failed
// (Lane -1) when no lane is left. A lane's first event is from StateNew.
type State int

// States.
const (
	StateBooting          State = iota
	StateReady                  // serving calls
	StateStopping               // asked to stop (Close, a restart of its group)
	StateClosed                 // stopped by the host
	StateCrashed                // ended by a crash: Event.Code says how
	StateExited                 // ended on its own
	StateStartupFailed          // could not start
	StateRestarting             // waiting Event.Delay before its next incarnation boots
	StateDead                   // given up (its RestartType, or GiveUp past its intensity)
	StateFailed                 // the pool: no lane is left
	StateNew                    // before a lane's first boot
	StateCrashLoopBackoff       // restarting after Event.Delay, past the restart intensity
	// StateRecycling: a planned replacement (Config.MaxCallsPerLane,
	// ProcessConfig.MaxLaneMemory); the event's Reason says why. The lane serves on until
	// its next incarnation is ready; then the recycled incarnation finishes its calls and
	// stops (its later events keep its own incarnation number).
	StateRecycling
	// StateRetiring: the lane is being removed (Pool.Resize): it takes no new call,
	// finishes the ones it holds, then stops.
	StateRetiring
	// StateRemoved: a retired lane is gone from the pool.
	StateRemoved
)

// String is the state's name: "ready", "crash_loop_backoff", ….
func (s State) String() string { return supervisor.State(s).String() }

// MarshalText names the state (JSON carries "ready", not 1).
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state's name.
func (s *State) UnmarshalText(b []byte) error {
	var v supervisor.State
	if err := v.UnmarshalText(b); err != nil {
		return fmt.Errorf("knit: unknown state %q", b)
	}
	*s = State(v)
	return nil
}

// Event is one lifecycle transition of a lane (Lane -1: the pool), as Config.OnEvent and
// Pool.Events deliver it.
type Event struct {
	Lane        int // -1 for the pool
	Incarnation int // 0 for a lane's first start
	From, To    State
	Code        Code // the classified end, when the transition is one
	Reason      string
	Delay       time.Duration // with To == StateRestarting or StateCrashLoopBackoff: the wait before the restart
	Time        time.Time
}

// eventOf is the supervisor's event as knit reports it. The states have the supervisor's
// values (TestEnumsMatchTheirLayers).
func eventOf(e supervisor.Event) Event {
	return Event{Lane: e.Lane, Incarnation: e.Incarnation, From: State(e.From), To: State(e.To),
		Code: Code(e.Code), Reason: e.Reason, Delay: e.Delay, Time: e.Time}
}

// PoolFailed is the message Config.Parent receives when the supervisor has given up every
// lane: the pool's actor and why.
type PoolFailed struct {
	Pool *actor.PID
	Err  error
}

// eventReplay is how many of the transitions before the first call of Events it delivers
// first.
const eventReplay = 64

// remember keeps e among the last transitions for a first call of Events. evMu is held.
func (p *Pool) remember(e Event) {
	n := max(min(eventReplay, p.cfg.EventBuffer), 1)
	if len(p.recent) >= n {
		copy(p.recent, p.recent[len(p.recent)-n+1:])
		p.recent = p.recent[:n-1]
	}
	p.recent = append(p.recent, e)
}

// subscribe makes the events channel on the first call of Events, filled with the
// transitions remembered so far; from then on every transition is sent to it.
func (p *Pool) subscribe() <-chan Event {
	if p.evWanted.Load() {
		return p.events
	}
	p.evMu.Lock()
	defer p.evMu.Unlock()
	if p.events == nil {
		p.events = make(chan Event, max(p.cfg.EventBuffer, len(p.recent)))
		for _, e := range p.recent {
			p.events <- e
		}
		p.recent = nil
		if p.evDone {
			close(p.events)
		}
		p.evWanted.Store(true)
	}
	return p.events
}
