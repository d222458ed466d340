package actors

import (
	"fmt"
	"testing"
)

// An exhaustive interleaving check of who settles a call of a LocalLane in a stealing group
// (StealLocal): a submitter pushing calls onto a victim lane (Push, and the back-out of
// lane.submitLocal when it meets the sealed queue), the victim taking its stack and running
// it (take, settleLocal), a thief stealing the victim's stack (LocalLane.steal: the thieves
// lock, the CAS on the victim's head, a CAS on each record's Lane field), and the victim's
// end (Seal: the closed mark and the wait for the thieves lock; then FailLane, which takes
// every record still naming the victim with a CAS on Lane). The victim may die at every one
// of its steps, and (the abandon variant) its end may start while it still runs.
//
// Every step is one access to one shared word; steps of different actors interleave in every
// order. A load of the head followed by a CAS of it is one step for the victim and the thief
// (a CAS that would fail changes nothing, and the loop that follows retries: the states
// between are ones the check visits anyway). Property: no call is settled twice, and in every
// state where nothing can move every call is settled exactly once — run by the victim or the
// thief, taken by the end, or given back to its submitter.
//
// The batch variant's submitter pushes its calls as Task.Map's chunks go (lane.submitLocalBatch,
// PushBatch, TakeBack): it names the victim in every record first, then pushes them all with
// one CAS of the head, or, meeting the closed mark, takes each back with its own CAS on the
// record's Lane field.

// Lane field values of the model.
const (
	lmNone   int8 = iota // -1 in the code: settling, or settled
	lmVictim             // the victim's key
	lmThief              // the thief's key
	lmFenced             // the abandon variant's fence
)

const lmCalls = 3

type lmState struct {
	// Shared words.
	head     [lmCalls]int8 // the victim's stack, top first; hl entries
	hl       int8
	hv       uint8 // the head's version: bumped by every change, for the submitter's CAS
	closed   bool
	lane     [lmCalls]int8
	lockedBy int8 // the victim's thieves lock: 0 free, 1 the thief, 2 the end

	// What became of each call (checked), and the submitter's give-backs.
	settled [lmCalls]int8
	refused [lmCalls]int8

	// Submitter: call sc at step spc; sv is the head version it loaded. (Batch: sc counts
	// the records named, bk the calls it has tried to take back.)
	sc, spc, bk int8
	sv          uint8

	// Victim: its taken batch (vb entries), alive or dead.
	vbatch [lmCalls]int8
	vb     int8
	vdead  bool

	// Thief: tpc; its taken stack (tk entries, tm of them moved so far), its moved calls
	// (tn entries, run from tr); attempts left.
	tpc      int8
	tstack   [lmCalls]int8
	tk, tm   int8
	tmoved   [lmCalls]int8
	tn, tr   int8
	attempts int8

	// End: epc; the next call its FailLane scan looks at.
	epc, escan int8
}

// Step counters.
const (
	sStore int8 = iota // store lane = victim
	sLoad              // load the head
	sBack              // the head is closed: CAS lane victim → none
	sCAS               // CAS the head (push)
	sDone
)

const (
	tLock   int8 = iota // TryLock
	tTake               // load the head and CAS it to empty
	tMove               // move the next taken call: CAS lane victim → thief
	tUnlock             // unlock
	tRun                // run the next moved call: CAS lane thief → none
	tDone
)

const (
	eIdle   int8 = iota // not started
	eSeal               // swap the head to closed
	eLock               // lock the thieves lock (waits while the thief holds it)
	eUnlock             // unlock it
	eScan               // FailLane: CAS the next call's lane victim → none (or fenced)
	eDone
)

type lmModel struct {
	calls   int
	abandon bool // the end may start while the victim still runs, and fences its calls
	batch   bool // the submitter pushes all its calls at once (PushBatch)
	mutant  int  // a broken protocol (mutants), for the check that the model can fail
	seen    map[lmState]bool
	stack   []lmState
	states  int
	err     error
}

func (m *lmModel) settle(s *lmState, c int8, who string) bool {
	if s.settled[c]++; s.settled[c] > 1 {
		m.err = fmt.Errorf("call %d settled twice (the second by %s): %+v", c, who, *s)
		return false
	}
	return true
}

// succ appends every state one step of one actor leads to.
func (m *lmModel) succ(s lmState) []lmState {
	var out []lmState
	add := func(n lmState) { out = append(out, n) }
	n := int8(m.calls)

	// Submitter.
	if m.batch {
		m.batchSubmitter(s, add)
	} else if s.sc < n {
		c := s.sc
		switch s.spc {
		case sStore:
			t := s
			t.lane[c], t.spc = lmVictim, sLoad
			add(t)
		case sLoad:
			t := s
			t.sv = s.hv
			if s.closed {
				t.spc = sBack
			} else {
				t.spc = sCAS
			}
			add(t)
		case sBack:
			t := s
			if t.lane[c] == lmVictim || m.mutant == mutantPlainBackOut { // the back-out's CAS wins: the call is given back
				t.lane[c], t.refused[c] = lmNone, 1
			} // (else the end took it: it is settled there)
			t.sc, t.spc = c+1, sStore
			add(t)
		case sCAS:
			t := s
			if s.hv == s.sv && !s.closed {
				copy(t.head[1:], s.head[:s.hl])
				t.head[0], t.hl, t.hv = c, s.hl+1, s.hv+1
				t.sc, t.spc = c+1, sStore
			} else {
				t.spc = sLoad // the CAS failed: look again
			}
			add(t)
		}
	}

	// Victim.
	if !s.vdead {
		if s.vb > 0 { // run its oldest taken call: take the record back, then settle it
			t := s
			c := t.vbatch[t.vb-1]
			t.vb--
			if t.lane[c] == lmVictim || m.mutant == mutantPlainVictim {
				t.lane[c] = lmNone
				if !m.settle(&t, c, "the victim") {
					return nil
				}
			}
			add(t)
		} else if s.hl > 0 && !s.closed { // take its stack
			t := s
			for i := range s.hl {
				t.vbatch[i] = s.head[i] // top first: run from the end, oldest first
			}
			t.vb, t.hl, t.hv = s.hl, 0, s.hv+1
			add(t)
		}
		t := s // or die here, in the call it runs or between calls
		t.vdead = true
		add(t)
	}

	// Thief.
	switch s.tpc {
	case tLock:
		if s.attempts > 0 && s.lockedBy == 0 {
			t := s
			t.lockedBy, t.tpc, t.attempts = 1, tTake, s.attempts-1
			add(t)
		}
	case tTake:
		t := s
		if s.hl > 0 && !s.closed {
			copy(t.tstack[:], s.head[:s.hl])
			t.tk, t.tm, t.hl, t.hv, t.tpc = s.hl, 0, 0, s.hv+1, tMove
		} else {
			t.tpc = tUnlock
		}
		add(t)
	case tMove:
		t := s
		c := t.tstack[t.tm]
		if t.lane[c] == lmVictim || m.mutant == mutantPlainMove && t.lane[c] != lmThief {
			t.lane[c] = lmThief
			t.tmoved[t.tn] = c
			t.tn++
		}
		if t.tm++; t.tm == t.tk {
			t.tpc = tUnlock
		}
		add(t)
	case tUnlock:
		t := s
		t.lockedBy, t.tpc = 0, tRun
		add(t)
	case tRun:
		t := s
		if t.tr < t.tn {
			c := t.tmoved[t.tr]
			t.tr++
			if t.lane[c] == lmThief {
				t.lane[c] = lmNone
				if !m.settle(&t, c, "the thief") {
					return nil
				}
			}
		} else {
			t.tpc = tLock // hunt again, while attempts last
			if t.attempts == 0 {
				t.tpc = tDone
			}
		}
		add(t)
	}

	// The victim's end: after its death, or (abandon) at any time.
	switch s.epc {
	case eIdle:
		if s.vdead || m.abandon {
			t := s
			t.epc = eSeal
			add(t)
		}
	case eSeal:
		t := s
		t.closed, t.hl, t.hv, t.epc = true, 0, s.hv+1, eLock
		add(t)
	case eLock:
		if s.lockedBy == 0 || m.mutant == mutantPlainMove && s.lockedBy == 1 {
			t := s
			if s.lockedBy == 0 {
				t.lockedBy = 2
			}
			t.epc = eUnlock
			add(t)
		}
	case eUnlock:
		t := s
		if t.lockedBy == 2 {
			t.lockedBy = 0
		}
		t.epc, t.escan = eScan, 0
		add(t)
	case eScan:
		t := s
		if c := t.escan; t.lane[c] == lmVictim {
			if m.abandon {
				t.lane[c] = lmFenced
			} else {
				t.lane[c] = lmNone
			}
			if !m.settle(&t, c, "the end") {
				return nil
			}
		}
		if t.escan++; t.escan == n {
			t.epc = eDone
		}
		add(t)
	}
	return out
}

// batchSubmitter is the submitter of the batch variant: one step of it.
func (m *lmModel) batchSubmitter(s lmState, add func(lmState)) {
	n := int8(m.calls)
	t := s
	switch s.spc {
	case sStore: // NameLane, one record at a time
		t.lane[s.sc] = lmVictim
		if t.sc++; t.sc == n {
			t.spc = sLoad
		}
	case sLoad:
		t.sv = s.hv
		if s.closed {
			t.spc = sBack
		} else {
			t.spc = sCAS
		}
	case sCAS: // PushBatch: every call in one CAS, the oldest (call 0) deepest
		if s.hv != s.sv || s.closed {
			t.spc = sLoad
			break
		}
		copy(t.head[n:], s.head[:s.hl])
		for c := range n {
			t.head[n-1-c] = c
		}
		t.hl, t.hv, t.spc = s.hl+n, s.hv+1, sDone
	case sBack: // TakeBack, one record at a time
		c := s.bk
		if t.lane[c] == lmVictim || m.mutant == mutantPlainBackOut {
			t.lane[c], t.refused[c] = lmNone, 1
		}
		if t.bk++; t.bk == n {
			t.spc = sDone
		}
	default:
		return
	}
	add(t)
}

// check runs the model from its initial state; it reports the number of states visited.
func (m *lmModel) check(attempts int8) error {
	m.seen = map[lmState]bool{}
	start := lmState{attempts: attempts}
	m.stack = append(m.stack[:0], start)
	m.seen[start] = true
	for len(m.stack) > 0 && m.err == nil {
		s := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		m.states++
		next := m.succ(s)
		if m.err != nil {
			return m.err
		}
		if len(next) == 0 {
			if err := m.final(s); err != nil {
				return err
			}
		}
		for _, t := range next {
			if !m.seen[t] {
				m.seen[t] = true
				m.stack = append(m.stack, t)
			}
		}
	}
	return m.err
}

// final checks a state where nothing can move.
func (m *lmModel) final(s lmState) error {
	submitted := s.sc == int8(m.calls) && (!m.batch || s.spc == sDone)
	if !submitted || s.epc != eDone || s.tpc != tDone && s.attempts > 0 {
		return fmt.Errorf("stuck with actors not done: %+v", s)
	}
	for c := range m.calls {
		if s.settled[c]+s.refused[c] != 1 {
			return fmt.Errorf("call %d settled %d times and given back %d: %+v", c, s.settled[c], s.refused[c], s)
		}
	}
	return nil
}

// Mutants: each drops one CAS of the protocol for a plain store.
const (
	mutantNone         = iota
	mutantPlainBackOut // a submitter that meets the closed mark takes its call back unconditionally
	mutantPlainVictim  // the victim settles a call it took whatever its Lane field says
	// a thief moves a call to itself whatever its Lane field says, and the end does not
	// wait for a thief that took the stack. Either guard alone keeps the property (the check
	// passes with each); the lock is also what keeps a thief's walk of the stack's links
	// from meeting a record the end has requeued elsewhere, which the model does not show.
	mutantPlainMove
)

func TestLocalStealModel(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, abandon := range []bool{false, true} {
			for calls := 1; calls <= lmCalls; calls++ {
				for attempts := int8(1); attempts <= 2; attempts++ {
					name := fmt.Sprintf("batch=%v/abandon=%v/calls=%d/attempts=%d", batch, abandon, calls, attempts)
					t.Run(name, func(t *testing.T) {
						m := &lmModel{calls: calls, abandon: abandon, batch: batch}
						if err := m.check(attempts); err != nil {
							t.Fatal(err)
						}
						t.Logf("%d states", m.states)
					})
				}
			}
		}
	}
}

// Each mutant of the protocol breaks the property somewhere in the grid: the model can fail.
func TestLocalStealModelMutants(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, mutant := range []int{mutantPlainBackOut, mutantPlainVictim, mutantPlainMove} {
			failed := false
			for _, abandon := range []bool{false, true} {
				for calls := 1; calls <= lmCalls && !failed; calls++ {
					m := &lmModel{calls: calls, abandon: abandon, mutant: mutant, batch: batch}
					if err := m.check(2); err != nil {
						t.Logf("batch=%v mutant %d: %v", batch, mutant, err)
						failed = true
					}
				}
			}
			if !failed {
				t.Errorf("batch=%v: mutant %d passed the model check", batch, mutant)
			}
		}
	}
}
