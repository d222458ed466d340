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

	// Grants (Producer.RequireGrants): a consumer runs no call it claimed until the host
	// grants it, and the host grants each call once. held is the host's own record of which
	// slots hold calls published and neither granted nor revoked; claimedTo is one past
	// the highest ticket the host knows was claimed (granted or revoked), which the claim
	// head can never go below.
	grants    bool
	held      uint32
	claimedTo uint64
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
	if h.grants {
		h.held |= 1 << slot
	}
}

// take ends the ring's hold on the call published as seq in slot, if the slot still holds
// it and no grant or revocation has taken it yet: it reports whether it did. Everything it
// checks is the host's own record; the slot and sequence number come from a consumer's
// claim (a grant) or its journal (a revocation after its death), and may be anything.
func (h *host) take(g *geom, slot int, seq uint64) bool {
	if slot < 0 || slot >= g.S || seq == 0 || h.held&(1<<slot) == 0 || h.seqOf[slot] != seq {
		return false
	}
	h.held &^= 1 << slot
	if g.disc == Ticket {
		h.claimedTo = max(h.claimedTo, h.ticket[slot]+1)
	}
	return true
}

// Anomaly is what an audit of the shared words against the host's own record found.
type Anomaly struct {
	// Err: a word only the host writes differs from what it wrote, or a word the consumers
	// write holds what no claim can have written: the mapping was written by something
	// other than the protocol.
	Err error
	// Claimed are the held slots the ring shows claimed (ticket: below the claim head;
	// dekker: retired), whose claimant's notice has not reached the host yet; Waiting the
	// held slots the ring shows claimable. A slot that stays in either while lanes are free
	// to claim it is a ring that no longer works, whatever the words say.
	Claimed, Waiting uint32
	// Unretired are the Claimed slots still pending in the ring (ticket: claimed, not yet
	// retired by the claimant). Only a slot retired can be taken back from a live claimant
	// (Revoke): one retired later would be pending again.
	Unretired uint32
	// Seq is the sequence number of the call each held slot holds.
	Seq [Slots]uint64
}

// check audits the shared words against the host's record (grant mode): the producer word,
// the tail, LIVE, the order cells and sequence numbers of the calls it holds are the host's
// alone; the claim head never passes the tail nor goes back below a ticket the host knows
// was claimed; a slot the host does not hold is never pending (its claimant retired it
// before its notice, or recovery did); and under Ticket a held slot not yet claimed is
// pending. One load per word, in any order: the caller holds the producer (no publication
// moves meanwhile), and consumers only ever make held slots claimed.
func (h *host) check(m *mem, g *geom) Anomaly {
	var a Anomaly
	bad := func(format string, args ...any) {
		if a.Err == nil {
			a.Err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
		}
	}
	if w := uint32(m.load(idH)); w != h.h {
		bad("producer word %#x, the host stored %#x", w, h.h)
	}
	pend := (h.h ^ uint32(m.load(idW))) & g.full()
	if stray := pend &^ h.held; stray != 0 {
		bad("slots %#x pending, the host holds no call there", stray)
	}
	head := uint64(0)
	if g.disc == Ticket {
		if t := m.load(idTail); t != h.stored {
			bad("tail %d, the host stored %d", t, h.stored)
		}
		head = headTicket(m.load(idHead))
		if head > h.stored || head < h.claimedTo {
			bad("claim head at ticket %d, published %d, claimed at least %d", head, h.stored, h.claimedTo)
		}
	} else if l := uint32(m.load(idLive)); l != h.live {
		bad("LIVE %#x, the host stored %#x", l, h.live)
	}
	for s := range g.S {
		bit := uint32(1) << s
		if h.held&bit == 0 {
			continue
		}
		if q := m.load(g.seq(s)); q != h.seqOf[s] {
			bad("slot %d names call %d, the host published %d", s, q, h.seqOf[s])
		}
		claimed := pend&bit == 0
		if g.disc == Ticket {
			// A ticket not claimed yet still has its order cell (a claimed one's cell may
			// name a later ticket's slot by now), and its slot is pending.
			t := h.ticket[s]
			if o := m.load(g.order(int(t % uint64(g.S)))); t >= head && o != uint64(s) {
				bad("order cell of ticket %d names slot %d, the host published slot %d", t, o, s)
			}
			if t >= head && claimed {
				bad("slot %d retired, its ticket %d not claimed (head %d)", s, t, head)
			}
			claimed = t < head
		}
		if claimed {
			a.Claimed |= bit
			if pend&bit != 0 {
				a.Unretired |= bit
			}
		} else {
			a.Waiting |= bit
		}
		a.Seq[s] = h.seqOf[s]
	}
	return a
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
