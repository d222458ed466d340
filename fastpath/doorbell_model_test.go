package fastpath

import (
	"fmt"
	"testing"
)

// Exhaustive interleaving checks of the two doorbells issue 28 added, at the level of the
// shared words both sides read and write; every step is one access to one word, and steps of
// different actors interleave in every order. A futex wait is modelled by its value: the
// waiter blocks while the word still holds the value it waited on (futex_wait returns at once
// when the word has changed, and every changer wakes it after changing it).
//
// The room doorbell (Producer.WantRoom, Consumer.RoomWanted, Wake.ParkRoom, the lane's
// Executor.waitRoom and the host's HostRing.Drain): a lane whose return ring is full reads the
// consumer word, marks the ring, sets its awake word, reads its wake counter, looks at the
// consumer word again and parks on the counter; the host retires slots, then looks at the
// mark and, finding it, clears it and bumps the counter (Wake.Force). Property: the lane never
// sleeps for good once the host has retired.
//
// The direct completion doorbell (Ring.Direct, lane.waitDirect, the lane's signal): a caller
// alone on a lane drains, arms the doorbell, looks at the ring, then at its call, and sleeps
// on the arm word; the lane publishes the call's result, then looks at the arm word and rings
// it if armed. A reaper drains the same ring at any time (one drainer at a time: the draining
// flag), and settles the call before it retires its slot, as Drain does. In the death variant
// the lane's end settles the call instead (FailLane), closes Settled and stores Signalled in
// the arm word (lane.LetGo); in the abandon variant it stores Signalled before Settled closes
// (lane.Settle of an abandoned lane, whose LetGo may never come). Property: the caller never
// sleeps for good.

// --- the room doorbell ---

type roomState struct {
	cons, room, counter, awake uint8 // shared words (cons counts the host's retires)
	lpc, seen, cseen           uint8 // the lane: step, consumer word read, counter read
	hpc                        uint8 // the host
}

const (
	rlSeen  uint8 = iota // read the consumer word (Retired)
	rlTry                // tryReserve: room if the consumer word moved since the start
	rlMark               // WantRoom
	rlAwake              // swap the awake word to waitRoom
	rlCount              // read the wake counter
	rlReady              // ready: the consumer word moved since seen?
	rlWait               // futex wait on the counter
	rlClear              // NoRoomWanted, awake = 1, then tryReserve again
	rlDone               // reserved
)

const (
	rhRetire uint8 = iota // retire a slot: the consumer word moves
	rhLook                // RoomWanted's load of the mark
	rhSwap                // its swap
	rhForce               // Force: bump the counter (and wake)
	rhDone
)

// Mutants of the room doorbell.
const (
	roomOK        = iota
	roomNoRing    // the host never looks at the mark
	roomNoRecheck // the lane parks without looking at the consumer word after its mark
	roomLateMark  // the lane marks its ring after its last look, just before it sleeps
)

func (m roomState) next(mutant int) []roomState {
	var out []roomState
	l := m
	switch m.lpc {
	case rlSeen:
		l.seen, l.lpc = m.cons, rlTry
		out = append(out, l)
	case rlTry:
		if m.cons != 0 {
			l.lpc = rlDone
		} else if mutant == roomLateMark {
			l.lpc = rlAwake
		} else {
			l.lpc = rlMark
		}
		out = append(out, l)
	case rlMark:
		l.room, l.lpc = 1, rlAwake
		if mutant == roomLateMark {
			l.lpc = rlWait
		}
		out = append(out, l)
	case rlAwake:
		l.awake, l.lpc = waitRoom, rlCount
		out = append(out, l)
	case rlCount:
		l.cseen, l.lpc = m.counter, rlReady
		if mutant == roomNoRecheck {
			l.lpc = rlWait
		}
		out = append(out, l)
	case rlReady:
		if m.cons != m.seen {
			l.lpc = rlClear
		} else if mutant == roomLateMark {
			l.lpc = rlMark
		} else {
			l.lpc = rlWait
		}
		out = append(out, l)
	case rlWait:
		if m.counter != m.cseen {
			l.lpc = rlClear
			out = append(out, l)
		}
	case rlClear:
		l.room, l.awake, l.lpc = 0, 1, rlTry
		out = append(out, l)
	}
	h := m
	switch m.hpc {
	case rhRetire:
		h.cons, h.hpc = m.cons+1, rhLook
		if mutant == roomNoRing {
			h.hpc = rhDone
		}
		out = append(out, h)
	case rhLook:
		h.hpc = rhDone
		if m.room != 0 {
			h.hpc = rhSwap
		}
		out = append(out, h)
	case rhSwap:
		h.hpc = rhDone
		if m.room != 0 {
			h.room, h.hpc = 0, rhForce
		}
		out = append(out, h)
	case rhForce:
		h.counter, h.hpc = m.counter+1, rhDone
		out = append(out, h)
	}
	return out
}

func checkRoom(mutant int) (states int, err error) {
	seen := map[roomState]bool{}
	stack := []roomState{{awake: 1}}
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[s] {
			continue
		}
		seen[s] = true
		next := s.next(mutant)
		if len(next) == 0 && s.lpc != rlDone {
			return len(seen), fmt.Errorf("the lane sleeps for good: %+v", s)
		}
		stack = append(stack, next...)
	}
	return len(seen), nil
}

func TestRoomDoorbellModel(t *testing.T) {
	n, err := checkRoom(roomOK)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d states", n)
	for _, mutant := range []int{roomNoRing, roomNoRecheck, roomLateMark} {
		if _, err := checkRoom(mutant); err == nil {
			t.Errorf("room mutant %d passed the model check", mutant)
		} else {
			t.Logf("room mutant %d: %v", mutant, err)
		}
	}
}

// --- the direct completion doorbell ---

type directState struct {
	// Shared words: the ring (published, retired), the call, the arm word, the draining
	// flag, Settled.
	prod, cons, pending, arm, draining, closed uint8
	lpc                                        uint8 // the lane
	cpc, cdrain                                uint8 // the caller, and its drain's step
	rpc                                        uint8 // the reaper's drain
	epc                                        uint8 // the lane's end (death variant)
}

const (
	dlPublish uint8 = iota // publish the result
	dlLook                 // load the arm word
	dlSignal               // CAS armed → signalled, and wake
	dlDone
)

const (
	dcTop     uint8 = iota // loop: the call settled? key moved (not modelled)?
	dcDrain                // l.drain()
	dcPending              // settled by the drain?
	dcArm                  // Arm
	dcWaiting              // the ring (Peek)
	dcCall                 // the call pending? Settled closed?
	dcWait                 // futex wait while armed
	dcDisarm               // Disarm; Settled closed: leave
	dcDone
)

// A drain: take the draining flag; if a result waits, settle the call then retire; let go.
const (
	drIdle uint8 = iota
	drTake
	drSettle
	drRetire
	drLetGo
)

const (
	deIdle   uint8 = iota
	deSettle       // FailLane settles the call
	deClose        // Settled closes
	deStore        // LetGo stores Signalled in the arm word (and wakes)
	deDone
	// The abandon variant's order: settle, store, then close.
	deStoreFirst
	deCloseLast
)

const (
	armOff = iota
	armArmed
	armSignalled
)

// Mutants of the direct doorbell.
const (
	directOK          = iota
	directNoSignal    // the lane never rings the direct doorbell
	directCallFirst   // the caller looks at its call before the ring, after its arm
	directNoRecheck   // the caller sleeps at once after its arm
	directNoLetGoWake // the lane's end does not store in the arm word
)

// drain is one step of a drain by a drainer whose step is *pc; it reports whether it moved.
func (d *directState) drain(pc *uint8) bool {
	switch *pc {
	case drTake:
		if d.draining != 0 {
			return false
		}
		d.draining = 1
		*pc = drSettle
		if d.prod == d.cons {
			*pc = drLetGo
		}
	case drSettle:
		d.pending, *pc = 0, drRetire
	case drRetire:
		d.cons, *pc = d.prod, drLetGo
	case drLetGo:
		d.draining, *pc = 0, drIdle
	}
	return true
}

func (m directState) next(mutant int, death, abandon bool) []directState {
	var out []directState
	l := m
	switch m.lpc {
	case dlPublish:
		if m.epc == deIdle { // a dead lane publishes nothing
			l.prod, l.lpc = 1, dlLook
			out = append(out, l)
		}
	case dlLook:
		l.lpc = dlDone
		if m.arm == armArmed && mutant != directNoSignal {
			l.lpc = dlSignal
		}
		out = append(out, l)
	case dlSignal:
		if m.arm == armArmed {
			l.arm = armSignalled
		}
		l.lpc = dlDone
		out = append(out, l)
	}
	c := m
	switch m.cpc {
	case dcTop:
		c.cpc = dcDrain
		if m.pending == 0 {
			c.cpc = dcDone
		}
		c.cdrain = drTake
		out = append(out, c)
	case dcDrain:
		if m.cdrain == drTake && m.draining != 0 { // another drainer holds it: Drain returns
			c.cpc, c.cdrain = dcPending, drIdle
			out = append(out, c)
		} else if c.drain(&c.cdrain) {
			if c.cdrain == drIdle {
				c.cpc = dcPending
			}
			out = append(out, c)
		}
	case dcPending:
		c.cpc = dcArm
		if m.pending == 0 {
			c.cpc = dcDone
		}
		out = append(out, c)
	case dcArm:
		c.arm, c.cpc = armArmed, dcWaiting
		switch mutant {
		case directCallFirst:
			c.cpc = dcCall
		case directNoRecheck:
			c.cpc = dcWait
		}
		out = append(out, c)
	case dcWaiting:
		switch {
		case m.prod != m.cons:
			c.cpc = dcDisarm
		case mutant == directCallFirst:
			c.cpc = dcWait
		default:
			c.cpc = dcCall
		}
		out = append(out, c)
	case dcCall:
		switch {
		case m.pending == 0 || m.closed != 0:
			c.cpc = dcDisarm
		case mutant == directCallFirst:
			c.cpc = dcWaiting
		default:
			c.cpc = dcWait
		}
		out = append(out, c)
	case dcWait:
		if m.arm != armArmed {
			c.cpc = dcDisarm
			out = append(out, c)
		}
	case dcDisarm:
		c.arm, c.cpc = armOff, dcTop
		if m.closed != 0 {
			c.cpc = dcDone
		}
		out = append(out, c)
	}
	r := m
	if r.rpc == drIdle {
		if m.prod != m.cons { // a reaper may start a drain whenever a result waits
			r.rpc = drTake
			out = append(out, r)
		}
	} else if r.drain(&r.rpc) {
		out = append(out, r)
	}
	if death {
		e := m
		switch m.epc {
		case deIdle:
			e.epc = deSettle
			out = append(out, e)
		case deSettle:
			e.pending, e.epc = 0, deClose
			if abandon {
				e.epc = deStoreFirst
			}
			out = append(out, e)
		case deStoreFirst:
			e.epc = deCloseLast
			if mutant != directNoLetGoWake {
				e.arm = armSignalled
			}
			out = append(out, e)
		case deCloseLast:
			e.closed, e.epc = 1, deDone
			out = append(out, e)
		case deClose:
			e.closed, e.epc = 1, deStore
			if mutant == directNoLetGoWake {
				e.epc = deDone
			}
			out = append(out, e)
		case deStore:
			e.arm, e.epc = armSignalled, deDone
			out = append(out, e)
		}
	}
	return out
}

func checkDirect(mutant int, death, abandon bool) (states int, err error) {
	seen := map[directState]bool{}
	stack := []directState{{pending: 1}}
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[s] {
			continue
		}
		seen[s] = true
		next := s.next(mutant, death, abandon)
		if len(next) == 0 && s.cpc != dcDone {
			return len(seen), fmt.Errorf("the caller sleeps for good: %+v", s)
		}
		stack = append(stack, next...)
	}
	return len(seen), nil
}

// The variants: no death, a death (LetGo after Settled closes), an abandonment (the store
// before Settled closes).
var directVariants = []struct{ death, abandon bool }{{false, false}, {true, false}, {true, true}}

func TestDirectDoorbellModel(t *testing.T) {
	for _, v := range directVariants {
		n, err := checkDirect(directOK, v.death, v.abandon)
		if err != nil {
			t.Fatalf("%+v: %v", v, err)
		}
		t.Logf("%+v: %d states", v, n)
	}
	for _, mutant := range []int{directNoSignal, directCallFirst, directNoRecheck, directNoLetGoWake} {
		failed := false
		for _, v := range directVariants {
			if _, err := checkDirect(mutant, v.death, v.abandon); err != nil {
				t.Logf("direct mutant %d (%+v): %v", mutant, v, err)
				failed = true
			}
		}
		if !failed {
			t.Errorf("direct mutant %d passed the model check", mutant)
		}
	}
	// Without its store an abandonment strands the caller: the store is what ends its sleep.
	if _, err := checkDirect(directNoLetGoWake, true, true); err == nil {
		t.Error("an abandonment without the store passed the model check")
	}
}
