package steal

import "fmt"

// host is the producer's private state: what it published where. Recovery trusts it and
// nothing else; every word it reads from the mapping is checked against it.
type host struct {
	h       uint32        // the producer word as last stored (mirrors the fastpath producer)
	tail    uint64        // tickets published (staged, under Ticket)
	stored  uint64        // the tail as last stored in the mapping
	live    uint32        // dekker LIVE mask as last stored
	lastSeq uint64        // the last sequence number handed out
	seqOf   [Slots]uint64 // the sequence number of the call each slot holds
	ticket  [Slots]uint64 // the ticket each slot was published as, under Ticket
}

// stage records slot as published with seq: the sequence number goes into the slot header,
// and under Ticket the slot into the order ring. The caller stores the producer word.
func (h *host) stage(m *mem, g *geom, slot int, seq uint64) {
	m.store(g.seq(slot), seq)
	h.seqOf[slot] = seq
	h.lastSeq = seq
	if g.disc == Ticket {
		h.ticket[slot] = h.tail
		m.store(g.order(int(h.tail%uint64(g.S))), uint64(slot))
		h.tail++
	}
	h.h ^= 1 << slot
}

// flush publishes the staged tickets: one store of the tail per burst. (Under Dekker the
// producer word's store is the publication.)
func (h *host) flush(m *mem, g *geom) {
	if g.disc == Ticket && h.stored != h.tail {
		m.store(idTail, h.tail)
		h.stored = h.tail
	}
}

// Call is one call a consumer held: the slot it was published in and its sequence number.
type Call struct {
	Slot int
	Seq  uint64
}

// Recovery is what a dead consumer held.
type Recovery struct {
	// Fresh calls were claimed but provably never started: dispatch them again.
	Fresh []Call
	// Started calls had started and not finished: fail them, or run them again if they are
	// idempotent. A call whose result reached the return ring before the consumer died is
	// among them when the consumer died before journaling its end: settle from the return
	// ring first and skip calls already settled.
	Started []Call
	// Retired is the mask of slots the host retired on the dead consumer's behalf.
	Retired uint32
}

// Recovery program counters.
const (
	rJournal uint8 = iota + 1
	rEntry
	rHead
	rStamp
	rLoadW
	rFlip
	rLive
	rWant
	rReset
	rDone
)

// recoverer is the host's recovery of one dead consumer, as steps like the claim's: the
// model check runs it interleaved with the survivors.
type recoverer struct {
	pc    uint8
	c     uint8
	k, n  uint8
	won   bool
	js    uint64
	seen  uint32 // slots named so far (a batch names each slot once)
	mask  uint32 // slots to retire on the dead consumer's behalf
	calls [maxBatch]Call
	st    [maxBatch]uint8
	err   error
}

func (r *recoverer) begin(c int) {
	*r = recoverer{pc: rJournal, c: uint8(c)}
}

func (r *recoverer) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: consumer %d: "+format, append([]any{ErrCorrupt, r.c}, args...)...)
	}
	r.n = 0
	r.mask = 0
	r.pc = rLive // whatever the journal says, release the handshake so survivors go on
}

// step runs one step of the recovery; it reports true when done.
func (r *recoverer) step(m *mem, g *geom, h *host) bool {
	c := int(r.c)
	switch r.pc {
	case rJournal:
		r.js = m.load(g.journal(c))
		phase, b, x := int(r.js&3), int(r.js>>2)&63, r.js>>8
		switch {
		case r.js == 0:
			r.pc = rLive
		case phase == phaseCommitted && b >= 1 && b <= g.E && b <= g.width && (g.disc == Dekker) == (x == 0):
			r.n = uint8(b)
			r.k = 0
			r.pc = rEntry
		case phase == phaseIntent && g.disc == Ticket && b >= 1 && b <= g.width && x >= uint64(b) && x <= MaxTicket:
			if x > h.stored {
				r.fail("claim intent up to ticket %d, only %d published", x, h.stored)
			} else {
				r.pc = rHead
			}
		default:
			r.fail("journal state %#x", r.js)
		}
	case rEntry:
		e := m.load(g.entry(c, int(r.k)))
		st, slot, seq := int(e&3), int(e>>2)&63, e>>8
		switch {
		case st == 0 || slot >= g.S || seq == 0 || seq > h.lastSeq:
			r.fail("entry %d: %#x", r.k, e)
			return false
		case r.seen&(1<<slot) != 0:
			r.fail("entry %d: slot %d named twice", r.k, slot)
			return false
		}
		for _, prev := range r.calls[:r.k] {
			if prev.Seq == seq { // one call in two slots: settling it twice would be worse
				r.fail("entry %d: call %d named twice", r.k, seq)
				return false
			}
		}
		r.seen |= 1 << slot
		r.calls[r.k] = Call{Slot: slot, Seq: seq}
		r.st[r.k] = uint8(st)
		r.k++
		if r.k == r.n {
			r.pc = rLoadW
		}
	case rHead:
		// Head first, then the stamp: a successor stamps the claim before moving the head
		// past it, so a claim that won is seen in one or the other.
		r.won = m.load(idHead) == r.claimHead()
		r.pc = rStamp
		if r.won {
			r.pc = rLoadW
			r.intentCalls(g, h)
		}
	case rStamp:
		r.won = m.load(g.stamp(c)) == r.claimHead()
		r.pc = rLive
		if r.won {
			r.pc = rLoadW
			r.intentCalls(g, h)
		}
	case rLoadW:
		// A held slot the consumer had not retired yet still holds the same call (same
		// sequence number) and is still pending: retire it for the consumer. No one else can
		// retire it: under Dekker the consumer's WANT still guards its region (LIVE is
		// cleared only below), under Ticket its tickets are taken.
		pend := h.h ^ uint32(m.load(idW))
		for k := range r.n {
			call := r.calls[k]
			if r.st[k] != entryFinished && h.seqOf[call.Slot] == call.Seq && pend&(1<<call.Slot) != 0 {
				r.mask |= 1 << call.Slot
			}
		}
		if r.won && r.mask != r.seen {
			r.fail("won a claim of slots %#x, but only %#x are pending", r.seen, r.mask)
			return false
		}
		r.pc = rFlip
	case rFlip:
		if r.mask != 0 {
			m.flip(idW, r.mask)
		}
		r.pc = rLive
	case rLive:
		if g.disc == Dekker {
			h.live &^= 1 << c
			m.store(idLive, uint64(h.live))
		}
		r.pc = rWant
	case rWant:
		m.store(g.want(c), 0) // LIVE no longer names it: no survivor reads this word now
		r.pc = rReset
	case rReset:
		m.store(g.journal(c), 0)
		r.pc = rDone
	default:
		return true
	}
	return r.pc == rDone
}

// claimHead is the head value the journaled ticket intent would have installed.
func (r *recoverer) claimHead() uint64 {
	return headWord(r.js>>8, int(r.js>>2)&63, int(r.c))
}

// intentCalls names the calls of a ticket claim that won but was not journaled: the host
// knows which ticket each slot holds, and the claimant never retired these slots, so they
// still hold the claim's tickets. rLoadW checks that every one is found and pending.
func (r *recoverer) intentCalls(g *geom, h *host) {
	x, b := r.js>>8, uint64(r.js>>2)&63
	r.n = 0
	for s := range g.S {
		if h.seqOf[s] != 0 && h.ticket[s] < x && h.ticket[s] >= x-b {
			r.calls[r.n] = Call{Slot: s, Seq: h.seqOf[s]}
			r.st[r.n] = entryClaimed
			r.seen |= 1 << s
			r.n++
		}
	}
	if uint64(r.n) != b {
		r.fail("won a claim of %d tickets up to %d, the host knows %d of them", b, x, r.n)
	}
}

// result splits the held calls.
func (r *recoverer) result(out *Recovery) {
	out.Retired = r.mask
	for k := range r.n {
		switch r.st[k] {
		case entryClaimed:
			out.Fresh = append(out.Fresh, r.calls[k])
		case entryStarted:
			out.Started = append(out.Started, r.calls[k])
		}
	}
}
