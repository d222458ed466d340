package knit_test

import (
	"fmt"
	"strings"
	"testing"
)

// An exhaustive interleaving check of how a stealing pool's host makes sure lanes claim what
// it publishes (shared.wake and lane.offer in steal.go) against how a lane looks for
// work and parks (actors.Executor.Run, fastpath.Wake), at the level of the shared words
// both read and write: the ring's tail and claim head, and per lane its awake word, its
// running word's busy bit and its bell's wake token. Every step is one access to one of
// them; steps of different actors interleave in every order.
//
// The host publishes calls one after another (each followed by wake); call 0 never ends, so
// the lane that runs it is lost to the others, as in TestStealFreeLaneTakesCalls. A lane
// claims as a ticket claim does (load the head and the tail, CAS the head over half of
// what waits, rounded up; two CAS failures and it gives up and polls again), spins a
// bounded number of polls, then parks: it clears its awake word, polls once more, and
// waits for a token. Property: in every state where nothing can move any more, every
// call has been claimed — no call waits while a lane sleeps unrung.
//
// The check also runs the protocol as it was before issue 13's fix (a lane marked busy
// only when it starts a call, and a lane rung or woken counted whatever its running word),
// and each half of the fix alone, and must find a stuck call in each: the model can fail,
// and both halves are needed.
//
// The lane's bell is either a ChanBell's token (goroutine lanes), which keeps a ring until
// the next wait takes it, or a futex on the lane's wake counter (process lanes), where a
// ring whose counter bump came before Park loaded the counter is spent: a lane rung for a
// call a peer then claimed waits marked rung, and no later call rings it. Park clears such
// a mark and looks again (the re-arm); the futex bell without it must fail too.

// wakeProto selects the protocol the model runs: the fix is both halves.
type wakeProto struct {
	busyFirst bool // the lane stores busy before it claims, and idle again if it took nothing
	onlyIdle  bool // the host counts a lane, woken or rung too, only if it is not busy
	// futex: the lane's bell is a futex on its wake counter (process lanes), not a ChanBell's
	// token: Park loads the counter after clearing its awake word and waits while the
	// counter still equals what it loaded, so a ring whose bump came before that load is
	// spent. rearm: Park clears a rung mark it finds after its last look, and looks again
	// (fastpath.Wake.Park; without it a lane rung for a call a peer claimed sleeps marked
	// rung, and no later call rings it).
	futex, rearm bool
}

var wakeFixed = wakeProto{busyFirst: true, onlyIdle: true, rearm: true}

const (
	wmLanes = 3 // at most
	wmCalls = 4 // at most
)

// Lane program counters.
const (
	lTop       uint8 = iota // loop top: a lane that was busy stores idle
	lPoll                   // ready(): Pending loads the tail,
	lPollHead               // then the head
	lBusy                   // store busy before the claim (fixed protocol)
	lClaimH                 // the claim: load the head and the tail
	lClaimCAS               // CAS the head
	lIdle                   // the claim took nothing: store idle (fixed protocol)
	lRetry                  // load Pending again (the tail, then the head): retry rather
	lRetryHead              // than park
	lPark                   // swap the awake word to 0
	lSeen                   // load the wake counter
	lRearm                  // CAS the awake word rung → 0; look again if it was rung
	lWait                   // parked: wait for a token (the counter to move, with futex)
	lAwake                  // store awake = 1 after the park
	lRun                    // run the claimed batch (store busy first if not yet)
	lStuck                  // running call 0, which never ends
)

var laneSteps = [...]string{"top", "poll", "poll head", "busy", "claim", "claim CAS", "idle", "retry",
	"retry head", "park", "seen", "rearm", "wait", "awake", "run", "running call 0"}

// Host program counters.
const (
	hPublish uint8 = iota // store the tail
	hWaiting              // load Waiting (tail − head)
	hAwake                // offer lane i: load its awake word
	hRing                 // CAS its awake word 0 → rung
	hToken                // the bell's token
	hBusy                 // load its running word
	hDone
)

type wmLane struct {
	pc       uint8
	inPark   bool  // ready() runs inside Park (its result decides whether to wait)
	spins    uint8 // polls left before parking
	attempts uint8 // CAS failures absorbed by the current claim
	h, t     uint8 // the claim's (and Pending's) loads
	n        uint8 // calls claimed and not run
	zero     bool  // the batch holds call 0, which never ends
	awake    uint8 // 0 parked, 1 awake, 2 rung
	busy     bool  // the running word's busy bit
	token    bool  // a ChanBell wake waiting to be taken
	bumped   bool  // futex: the wake counter moved since Park loaded it
}

type wmState struct {
	tail, head uint8
	hpc        uint8 // host
	call       uint8 // calls published so far (the one being woken for: call-1)
	want       int8
	lane       uint8 // the lane being offered
	lanes      [wmLanes]wmLane
}

type wakeModel struct {
	proto        wakeProto
	lanes, calls int
	spins        uint8
	seen         map[wmState]bool
	states       int
	stuck        *wmState
	trace        []string
}

// checkWake explores every interleaving; it returns a description of a state where a call
// waits and nothing can move, or "".
func checkWake(proto wakeProto, lanes, calls int, spins uint8) (string, int) {
	m := &wakeModel{proto: proto, lanes: lanes, calls: calls, spins: spins, seen: map[wmState]bool{}}
	var s wmState
	for i := range lanes {
		s.lanes[i] = wmLane{pc: lTop, awake: 1, spins: spins}
	}
	m.dfs(s)
	if m.stuck == nil {
		return "", m.states
	}
	return m.describe(*m.stuck), m.states
}

func (m *wakeModel) describe(s wmState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "published %d, claimed %d;", s.tail, s.head)
	for i := range m.lanes {
		l := s.lanes[i]
		fmt.Fprintf(&b, " lane %d at %s awake %d busy %v token %v bumped %v holds %d (call 0: %v);", i, laneSteps[l.pc], l.awake, l.busy, l.token, l.bumped, l.n, l.zero)
	}
	return b.String()
}

// dfs visits s and every state reachable from it (iteratively: the space is deep).
func (m *wakeModel) dfs(start wmState) {
	stack := []wmState{start}
	m.seen[start] = true
	for len(stack) > 0 && m.stuck == nil {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		m.states++
		moved := false
		for a := -1; a < m.lanes; a++ {
			for _, n := range m.next(s, a) {
				moved = true
				if !m.seen[n] {
					m.seen[n] = true
					stack = append(stack, n)
				}
			}
		}
		if !moved && int(s.head) < m.calls {
			m.stuck = &s
		}
	}
}

// next returns the states actor a (-1: the host, else a lane) can step s to.
func (m *wakeModel) next(s wmState, a int) []wmState {
	if a < 0 {
		if n, ok := m.host(s); ok {
			return []wmState{n}
		}
		return nil
	}
	return m.lane(s, a)
}

func (m *wakeModel) host(s wmState) (wmState, bool) {
	if s.hpc == hDone {
		return s, false
	}
	fixed := m.proto.onlyIdle
	count := func(counted bool) {
		if counted {
			if s.want--; s.want == 0 {
				s.hpc = hPublish
				return
			}
		}
		if s.lane++; int(s.lane) == m.lanes {
			s.hpc = hPublish
			return
		}
		s.hpc = hAwake
	}
	switch s.hpc {
	case hPublish:
		if int(s.call) == m.calls {
			s.hpc = hDone
			break
		}
		s.tail++
		s.call++
		s.hpc = hWaiting
	case hWaiting:
		s.want = int8(max(s.tail-s.head, 1))
		s.lane, s.hpc = 0, hAwake
	case hAwake:
		switch a := s.lanes[s.lane].awake; {
		case a == 0:
			s.hpc = hRing
		case !fixed && a == 2: // woken and not run yet: counted
			count(true)
		default:
			s.hpc = hBusy
		}
	case hRing:
		l := &s.lanes[s.lane]
		if l.awake != 0 { // the CAS fails: not counted
			count(false)
			break
		}
		l.awake = 2
		s.hpc = hToken
	case hToken:
		if m.proto.futex {
			s.lanes[s.lane].bumped = true
		} else {
			s.lanes[s.lane].token = true
		}
		if fixed {
			s.hpc = hBusy
		} else {
			count(true)
		}
	case hBusy:
		count(!s.lanes[s.lane].busy)
	}
	return s, true
}

func (m *wakeModel) lane(s wmState, i int) []wmState {
	l := &s.lanes[i]
	fixed := m.proto.busyFirst
	// ready ends the lane's ready(): in a spin, true runs what it found and false polls
	// again or parks; in a park, false waits for a token.
	ready := func(r bool) []wmState {
		switch {
		case r && l.inPark:
			l.pc = lAwake
		case r && l.n > 0:
			l.pc = lRun
		case r: // a retry: back to the loop's top
			l.pc = lTop
		case l.inPark && m.proto.rearm:
			l.pc = lRearm
		case l.inPark:
			l.pc = lWait
		case l.spins > 0: // poll again, or give up the spin and park
			l.spins--
			l.pc = lPoll
			again := s
			l.pc = lPark
			return []wmState{again, s}
		default:
			l.pc = lPark
		}
		return []wmState{s}
	}
	switch l.pc {
	case lTop:
		l.busy = false // a batch that ended: idle, looking for work
		l.inPark, l.spins = false, m.spins
		l.pc = lPoll
	case lPoll:
		l.t = s.tail
		l.pc = lPollHead
	case lPollHead:
		pending := l.t != s.head
		l.t = 0
		if !pending {
			return ready(false)
		}
		if fixed {
			l.pc = lBusy
		} else {
			l.pc = lClaimH
		}
	case lBusy:
		l.busy = true
		l.pc = lClaimH
	case lClaimH:
		l.h, l.t = s.head, s.tail
		if l.t == l.h {
			l.pc, l.h, l.t, l.attempts = m.tookNothing(), 0, 0, 0
			break
		}
		l.pc = lClaimCAS
	case lClaimCAS:
		if s.head != l.h {
			l.h, l.t = 0, 0
			if l.attempts++; l.attempts < 2 {
				l.pc = lClaimH
			} else {
				l.pc, l.attempts = m.tookNothing(), 0
			}
			break
		}
		k := (l.t - l.h + 1) / 2
		s.head += k
		l.n, l.zero = k, l.h == 0
		l.h, l.t, l.attempts = 0, 0, 0
		return ready(true)
	case lIdle:
		l.busy = false
		l.pc = lRetry
	case lRetry: // Pending: the tail, then the head
		l.t = s.tail
		l.pc = lRetryHead
	case lRetryHead:
		retry := l.t != s.head
		l.t = 0
		return ready(retry)
	case lPark:
		l.awake = 0
		l.inPark = true
		l.pc = lSeen
	case lSeen:
		l.bumped = false
		l.pc = lPoll
	case lRearm:
		if l.awake == 2 {
			l.awake = 0
			l.pc = lSeen
			break
		}
		l.pc = lWait
	case lWait:
		if m.proto.futex {
			if !l.bumped {
				return nil
			}
		} else if !l.token {
			return nil
		}
		l.token, l.bumped = false, false
		l.pc = lAwake
	case lAwake:
		l.awake = 1
		l.inPark = false
		if l.n > 0 {
			l.pc = lRun
		} else {
			l.pc = lTop
		}
	case lRun:
		l.busy = true
		if l.zero { // the batch holds call 0, which never ends
			l.pc = lStuck
			break
		}
		l.pc, l.n = lTop, 0
	case lStuck:
		return nil
	}
	return []wmState{s}
}

// tookNothing is where a claim that took nothing goes.
func (m *wakeModel) tookNothing() uint8 {
	if m.proto.busyFirst {
		return lIdle
	}
	return lRetry
}

func TestStealWakeModel(t *testing.T) {
	type run struct {
		lanes, calls int
		spins        uint8
	}
	// 2 lanes: 2 to 4 calls, lanes that park at once or spin one poll first (tens to
	// hundreds of thousands of states, about a second in all). 3 lanes, 2 calls: millions
	// of states, seconds; 3 calls would be tens of millions. Under -race (ten times slower),
	// and with -short, the two smallest. Each with both bells.
	runs := []run{{2, 2, 0}, {2, 2, 1}, {2, 3, 0}, {2, 4, 0}, {2, 3, 1}, {2, 4, 1}, {3, 2, 0}}
	if testing.Short() || raceEnabled {
		runs = runs[:2]
	}
	for _, futex := range []bool{false, true} {
		p := wakeFixed
		p.futex = futex
		for _, r := range runs {
			t.Run(fmt.Sprintf("futex=%v/lanes=%d/calls=%d/spins=%d", futex, r.lanes, r.calls, r.spins), func(t *testing.T) {
				stuck, n := checkWake(p, r.lanes, r.calls, r.spins)
				if stuck != "" {
					t.Errorf("a call waits and nothing moves: %s", stuck)
				}
				t.Logf("%d states", n)
			})
		}
	}
	// The model can fail: the protocol before issue 13's fix, and each half of that fix
	// alone, leave a call waiting; so does a futex bell without the re-arm (the stall of
	// process lanes that ended only when the watchdog forced a wake).
	mutants := []wakeProto{{}, {busyFirst: true}, {onlyIdle: true}, {busyFirst: true, onlyIdle: true, futex: true}}
	for _, p := range mutants {
		if stuck, _ := checkWake(p, 2, 2, 0); stuck == "" {
			t.Errorf("%+v passes the check: the model cannot tell it from the fix", p)
		} else {
			t.Logf("%+v: %s", p, stuck)
		}
	}
}
