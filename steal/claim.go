package steal

import "math/bits"

// The claim protocols as step machines. Every step performs at most one access to a
// shared word (the only exception, the entry steps, also read the slot's sequence number,
// a plain header word no one else writes while the claimant holds the slot). The real Claim
// runs steps back to back; the model check runs them one at a time in every interleaving.

// Encodings of the words the protocols share.
//
// ticket head:   T<<11 | b<<5 | owner   (T: tickets claimed so far; the last claim took
//
//	b tickets and was made by consumer owner; b = 0 only initially)
//
// journal state: x<<8 | b<<2 | phase    (x: the claim's end ticket under Ticket, else 0)
// journal entry: seq<<8 | slot<<2 | st  (st: claimed, started, finished)
const (
	headOwnerBits = 5
	headBatchBits = 6
	headShift     = headOwnerBits + headBatchBits

	phaseIdle      = 0
	phaseIntent    = 1 // ticket: about to CAS the head to x (the journal records it first)
	phaseCommitted = 2 // entries 0..b-1 are this consumer's batch

	entryClaimed  = 1
	entryStarted  = 2
	entryFinished = 3

	// ticketAttempts is how many CAS failures a claim absorbs before it returns and lets
	// the consumer poll again (the reference's STEAL_TICKET_ATTEMPTS). A stale read of the
	// head (the tail moved on more than a ring's worth past it) and a lost race for a
	// stamp count as failures too: every loop of a claim is bounded, whatever the shared
	// words say (a lane that rewrites them can make a claim fail, never spin).
	ticketAttempts = 2
)

func headWord(t uint64, b, owner int) uint64 {
	return t<<headShift | uint64(b)<<headOwnerBits | uint64(owner)
}
func headTicket(h uint64) uint64 { return h >> headShift }
func headBatch(h uint64) int     { return int(h>>headOwnerBits) & (1<<headBatchBits - 1) }

// headOwner is the consumer that made the head's claim, kept in range whatever the word.
func headOwner(h uint64, g *geom) int { return int(h&(1<<headOwnerBits-1)) % g.n }

func journalWord(x uint64, b, phase int) uint64 { return x<<8 | uint64(b)<<2 | uint64(phase) }
func entryWord(seq uint64, slot, st int) uint64 { return seq<<8 | uint64(slot)<<2 | uint64(st) }

// status is what a step reports.
type status uint8

const (
	running   status = iota // more steps to run
	blocked                 // waiting for a junior to lower its WANT; the step changed nothing shared
	none                    // done: nothing claimed
	committed               // the batch is journaled; read the slots, then run the release steps
	released                // the batch's slots are retired and the handshake is over
	exhausted               // the ticket head reached MaxTicket
)

// Program counters. 0 is idle.
const (
	pcIdle uint8 = iota
	// ticket
	tHead
	tTail
	tOrder
	tIntent
	tStamp
	tStampCAS
	tCAS
	tAbandon
	tEntry
	tCommit
	tRetire
	// dekker
	dLoadH
	dLoadW
	dLive
	dSurvey
	dRaise
	dSenior
	dJuniorLive
	dJuniorWant
	dTakeH
	dTakeW
	dUncommit
	dEntry
	dCommit
	dRetire
	dLower
	dWithdraw
)

// claimer is a consumer's private claim state: everything a step keeps between steps.
// It must stay a flat value (the model check hashes and copies it).
type claimer struct {
	pc       uint8
	i        uint8 // loop index
	attempts uint8
	r        uint8 // dekker: the region being claimed
	n        uint8 // batch size
	a, b     uint64
	live     uint32 // dekker: LIVE as loaded at the survey
	peer     uint32 // dekker: regions some live peer wants
	senior   uint32 // dekker: regions some live senior wants
	take     uint32 // dekker: pending slots, then the slots taken; ticket: the batch's slots
	slots    [maxBatch]uint8
	seqs     [maxBatch]uint64
}

// begin starts a claim.
func (c *claimer) begin(g *geom) {
	c.attempts = 0
	if g.disc == Ticket {
		c.pc = tHead
	} else {
		c.pc = dLoadH
	}
}

// step runs one step of consumer me's claim. giveUp, when the claim waits for a junior,
// makes it withdraw instead (the real Claim sets it after a bounded spin; withdrawing is
// always safe, and it keeps a consumer from waiting on a junior that died before the host
// recovered it).
func (c *claimer) step(m *mem, g *geom, me int, giveUp bool) status {
	switch c.pc {
	// ---- ticket ----
	case tHead:
		c.a = m.load(idHead)
		c.pc = tTail
	case tTail:
		t := headTicket(c.a)
		avail := m.load(idTail) - t
		if avail == 0 {
			c.pc = pcIdle
			return none
		}
		if avail > uint64(g.S) { // a stale head (the tail moved on twice over), or a broken one
			c.attempts++
			if c.attempts < ticketAttempts {
				c.pc = tHead
				return running
			}
			c.pc = pcIdle
			return none
		}
		c.n = uint8(min(avail, uint64(g.width)))
		if g.half {
			// At most half of what waits (one call of two, two of three): an idle
			// peer takes the rest, rather than a call waiting behind a slow one in
			// this batch.
			c.n = uint8(min(uint64(c.n), max(1, (avail+1)/2)))
		}
		if t+uint64(c.n) > MaxTicket {
			c.pc = pcIdle
			return exhausted
		}
		c.i, c.take = 0, 0
		c.pc = tOrder
	case tOrder:
		// Read the slots before the CAS: once the head moves past them, their owner may
		// retire them and the host may reuse the cells.
		t := headTicket(c.a) + uint64(c.i)
		s := uint8(m.load(g.order(int(t%uint64(g.S))))) % uint8(g.S)
		c.slots[c.i] = s
		c.i++
		if c.i == c.n {
			c.i = 0
			c.pc = tIntent
		}
	case tIntent:
		// The journal names the head this claim would install before the CAS, so that the
		// host can tell after a death whether the CAS happened (recover.go).
		m.store(g.journal(me), journalWord(headTicket(c.a)+uint64(c.n), int(c.n), phaseIntent))
		c.pc = tStamp
		if headBatch(c.a) == 0 {
			c.pc = tCAS
		}
	case tStamp:
		// Stamp the previous claim (the one the head shows) into its owner's stamp word
		// before moving the head past it: a claim is always visible either in the head or
		// in its owner's stamp. A consumer claims again only once its batch is journaled, so
		// the stamp of a consumer that died mid-claim is never overwritten by a later claim
		// of its own. Stamps only grow.
		c.b = m.load(g.stamp(headOwner(c.a, g)))
		if headTicket(c.b) >= headTicket(c.a) {
			c.b = 0
			c.pc = tCAS
		} else {
			c.pc = tStampCAS
		}
	case tStampCAS:
		if m.cas(g.stamp(headOwner(c.a, g)), c.b, c.a) {
			c.b = 0
			c.pc = tCAS
		} else {
			// A peer stamped it first (it only grows: the next load settles it), or a lane
			// keeps rewriting it: the second failure gives the attempt up.
			c.b = 0
			c.pc = tStamp
			if c.attempts++; c.attempts >= ticketAttempts {
				c.pc = tAbandon
			}
		}
	case tCAS:
		t := headTicket(c.a)
		if m.cas(idHead, c.a, headWord(t+uint64(c.n), int(c.n), me)) {
			c.i = 0
			c.pc = tEntry
		} else {
			c.pc = tAbandon
		}
	case tAbandon:
		m.store(g.journal(me), 0)
		c.attempts++
		c.slots = [maxBatch]uint8{} // dead values: cleared so that equal claims look equal
		if c.attempts < ticketAttempts {
			c.pc = tHead
			return running
		}
		c.pc = pcIdle
		return none
	case tEntry:
		k := c.i
		s := int(c.slots[k])
		c.seqs[k] = m.load(g.seq(s))
		c.take |= 1 << s
		m.store(g.entry(me, int(k)), entryWord(c.seqs[k], s, entryClaimed))
		c.i++
		if c.i == c.n {
			c.i = 0
			c.pc = tCommit
		}
	case tCommit:
		m.store(g.journal(me), journalWord(headTicket(c.a)+uint64(c.n), int(c.n), phaseCommitted))
		c.pc = tRetire
		return committed
	case tRetire:
		m.flip(idW, c.take)
		c.pc = pcIdle
		return released

	// ---- dekker ----
	case dLoadH:
		c.a = m.load(idH)
		c.pc = dLoadW
	case dLoadW:
		p := uint32(c.a^m.load(idW)) & g.full()
		if p == 0 {
			c.pc = pcIdle
			return none
		}
		c.take = p
		c.a = 0
		c.pc = dLive
	case dLive:
		c.live = uint32(m.load(idLive))
		c.i, c.peer, c.senior = 0, 0, 0
		c.pc = dSurvey
	case dSurvey:
		for int(c.i) < g.n && (int(c.i) == me || c.live&(1<<c.i) == 0) {
			c.i++
		}
		if int(c.i) < g.n {
			w := uint32(m.load(g.want(int(c.i))))
			c.peer |= w
			if int(c.i) < me {
				c.senior |= w
			}
			c.i++
			return running
		}
		// Candidates: pending regions nobody wants, else pending regions no senior wants.
		var pend uint32
		for r := range g.regions() {
			if c.take&g.regionMask(r) != 0 {
				pend |= 1 << r
			}
		}
		cand := pend &^ c.peer
		if cand == 0 {
			cand = pend &^ c.senior
		}
		c.i, c.peer, c.senior, c.take = 0, 0, 0, 0
		if cand == 0 {
			c.pc = pcIdle
			return none
		}
		// Start from the consumer's home region so that consumers spread out.
		home := g.regions() * me / g.n
		rot := bits.RotateLeft32(cand, -home) // bit j of rot is region (j+home) mod 32
		c.r = uint8((bits.TrailingZeros32(rot) + home) % 32)
		c.pc = dRaise
	case dRaise:
		m.store(g.want(me), 1<<c.r) // a full barrier: the loads below cannot pass it
		c.i = 0
		c.pc = dSenior
	case dSenior:
		for int(c.i) < me && c.live&(1<<c.i) == 0 {
			c.i++
		}
		if int(c.i) < me {
			if m.load(g.want(int(c.i)))&(1<<c.r) != 0 {
				c.pc = dWithdraw // a senior wants it: the junior withdraws
				return running
			}
			c.i++
			return running
		}
		c.i = uint8(me + 1)
		c.live = 0
		c.pc = dJuniorLive
	case dJuniorLive:
		if int(c.i) >= g.n {
			c.i = 0
			c.pc = dTakeH
			return running
		}
		// Reload LIVE for every junior: a junior that died with its WANT raised stops
		// counting once the host has recovered it.
		if uint32(m.load(idLive))&(1<<c.i) == 0 {
			c.i++
		} else {
			c.pc = dJuniorWant
		}
	case dJuniorWant:
		if m.load(g.want(int(c.i)))&(1<<c.r) != 0 {
			if giveUp {
				c.pc = dWithdraw
				return running
			}
			c.pc = dJuniorLive
			return blocked
		}
		c.i++
		c.pc = dJuniorLive
	case dTakeH:
		c.a = m.load(idH)
		c.pc = dTakeW
	case dTakeW:
		// One snapshot: slots published into the region after it wait for the next claim.
		c.take = uint32(c.a^m.load(idW)) & g.regionMask(int(c.r))
		c.a = 0
		if c.take == 0 {
			c.pc = dWithdraw
			return running
		}
		if g.half { // at most half of the region's calls (rounded up): a peer takes the rest
			n := bits.OnesCount32(c.take)
			for range n / 2 {
				c.take &^= 1 << (31 - bits.LeadingZeros32(c.take))
			}
		}
		c.n = uint8(bits.OnesCount32(c.take))
		c.i = 0
		c.pc = dUncommit
	case dUncommit:
		// The previous batch (all finished) stops being the journal's before its entries
		// are overwritten.
		m.store(g.journal(me), 0)
		c.pc = dEntry
	case dEntry:
		k := c.i
		rest := c.take
		for range k {
			rest &= rest - 1
		}
		s := bits.TrailingZeros32(rest)
		c.slots[k] = uint8(s)
		c.seqs[k] = m.load(g.seq(s))
		m.store(g.entry(me, int(k)), entryWord(c.seqs[k], s, entryClaimed))
		c.i++
		if c.i == c.n {
			c.i = 0
			c.pc = dCommit
		}
	case dCommit:
		m.store(g.journal(me), journalWord(0, int(c.n), phaseCommitted))
		c.pc = dRetire
		return committed
	case dRetire:
		// Retire before lowering WANT: a peer that enters the region next must not see these
		// slots pending.
		m.flip(idW, c.take)
		c.pc = dLower
	case dLower:
		m.store(g.want(me), 0)
		c.pc = pcIdle
		return released
	case dWithdraw:
		m.store(g.want(me), 0)
		c.pc = pcIdle
		return none
	default:
		c.pc = pcIdle
		return none
	}
	return running
}

// markEntry records a call's progress in consumer me's journal: entryStarted before the
// call runs, entryFinished after its result is on the return ring.
func markEntry(m *mem, g *geom, me, k int, seq uint64, slot, st int) {
	m.store(g.entry(me, k), entryWord(seq, slot, st))
}
