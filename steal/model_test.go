package steal

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/bits"
	"os"
	"strings"
	"sync/atomic"
	"testing"
)

// The model check: an exhaustive exploration of every interleaving of the claim protocols,
// run by the very step functions the real Claim, Release, Start, Finish and Recover run
// (claimer.step, markEntry, host.stage/flush, recoverer.step), over a plain array of words
// instead of the mapping. Each transition is one step of one actor: the host publishing a
// call or storing its words, a consumer's claim step, a consumer running a call, a consumer
// dying, or one step of the host's recovery of the dead consumer. States are hashed and
// explored depth first.
//
// Ghost state (what really happened, which the protocol cannot see) checks, in every state:
//   - no two consumers ever hold the same slot (from the moment a claim wins until the slots
//     are retired) or the same call;
//   - no call starts twice and no call settles twice;
//   - Recover returns exactly the calls the dead consumer held and had not finished: the
//     fresh ones never started, the started ones started;
// and from every reachable state, a run of the survivors (no further death, host recovery
// first) settles every call: no deadlock, no lost call. Recovered fresh calls are published
// again and count as taken once by their new taker; started ones are failed (settled) by
// the host unless their result already settled them.

const (
	mMaxN  = 4
	mMaxP  = 8
	mWords = 128
)

type mcfg struct {
	disc   Discipline
	n      int // consumers
	width  int
	S      int  // slots in the model ring
	calls  int  // calls the host publishes
	victim int  // the consumer that may die (at any of its steps), -1 none
	survey bool // dekker: run the real survey instead of choosing any pending region
	// prefill publishes every call in one burst before anything else moves, so that full
	// batches form without the host's interleavings multiplying the space.
	prefill bool
	half    bool // Config.Half
	// grant runs the ring in grant mode (Producer.RequireGrants): a consumer claims, retires
	// and sends the host a notice of its claim; the host grants each call once, checked
	// against its own record, and the call runs then (on the claimant's own ring, which the
	// model does not show). The host may also audit the ring (host.check) and give it up
	// (fallback: every ungranted call runs elsewhere) at any time.
	grant bool
	// hostile is how many writes a hostile lane makes, each of any shared word at any step,
	// with values from a domain per word (hostileWrites); it may also send notices of its
	// own naming any call. Safety under it: no call runs twice, no honest claim spins
	// without end; liveness: from every state the survivors, the host and (once it gives the
	// ring up) the fallback settle every call.
	hostile int
	// noExpire leaves out the host's taking back of one call (shared.expire) in grant mode:
	// the hostile runs of the quick and full grids, where it multiplies the states by ten
	// (the full grid ran 33 min with it on a busy 2-core machine: too much for CI's budget);
	// the extended grid keeps it.
	noExpire bool
}

func (c mcfg) String() string {
	sv := ""
	if c.disc == Dekker && c.survey {
		sv = "/survey"
	}
	if c.prefill {
		sv += "/prefill"
	}
	if c.half {
		sv += "/half"
	}
	if c.grant {
		sv += "/grant"
	}
	if c.hostile > 0 {
		sv += fmt.Sprintf("/hostile=%d", c.hostile)
	}
	return fmt.Sprintf("%v/n=%d/w=%d/S=%d/calls=%d/victim=%d%s", c.disc, c.n, c.width, c.S, c.calls, c.victim, sv)
}

// Consumer phases in the model.
const (
	cIdle  = iota
	cClaim // running claim steps
	cHeld  // batch journaled, slots not yet released
	cRun   // running the batch's calls
	// grant mode
	cNotice // publishing its notice (on its own return ring)
	cFinish // journaling the batch's entries as handed over
	cWait   // waiting for the host to have answered its notice
)

// notice is a consumer's claim notice on its way to the host (at most one: a consumer
// claims again only once the host has answered it).
type notice struct {
	pending bool
	n       uint8
	slots   [8]uint8
	seqs    [8]uint64
}

type mcons struct {
	cl      claimer
	phase   uint8
	k       uint8 // the call of the batch being run
	sub     uint8 // 0 start, 1 result on the return ring, 2 finish
	dead    bool
	needRec bool   // dead with a notice the host has not drained yet: recovered after it
	inhand  uint32 // slots this consumer holds (ghost)
	batch   [8]uint8
}

type mstate struct {
	w      [mWords]uint64
	c      [mMaxN]mcons
	h      host
	rec    recoverer
	recC   int8 // consumer under recovery, -1 none
	deaths uint8
	queue  uint16 // calls waiting to be published
	cursor uint8
	// grant mode
	notice   [mMaxN]notice
	degraded bool  // the host gave the ring up: every call runs elsewhere
	hostile  uint8 // writes the hostile lane has left
	// expire: the host took back a call claimed and retired whose notice had not come
	// (shared.expire), at most once a run (a second gives the ring up); the seqs it took
	// back, whose late notices are refused without harm.
	expires uint8
	expired uint32
	// ghost
	callOfSeq [2*mMaxP + 2]uint8
	started   [mMaxP]uint8
	settled   [mMaxP]uint8
	holder    [mMaxP]int8
	ran       [mMaxP]uint8 // grant mode: runs of each call (granted, or run elsewhere)
}

type explorer struct {
	cfg     mcfg
	g       geom
	seed    maphash.Seed
	buf     []byte
	seen    map[uint64]uint8 // flags: seenState, goodState, onStack
	spare   []*mstate
	limit   int // stop after this many states (measurements only)
	states  int
	trans   int
	maxDeep int
	err     error
	path    []string
}

func newExplorer(cfg mcfg) *explorer {
	e := &explorer{cfg: cfg, seed: maphash.MakeSeed(), seen: map[uint64]uint8{}}
	e.g = geom{disc: cfg.disc, S: cfg.S, n: cfg.n, width: cfg.width, E: cfg.width, half: cfg.half}
	if e.g.words() > mWords {
		panic("model too large")
	}
	return e
}

func (e *explorer) initial() *mstate {
	s := &mstate{recC: -1}
	s.queue = uint16(1<<e.cfg.calls - 1)
	for i := range s.holder {
		s.holder[i] = -1
	}
	m := e.mem(s)
	s.h.live = uint32(1<<e.cfg.n - 1)
	s.h.grants = e.cfg.grant
	s.hostile = uint8(e.cfg.hostile)
	m.store(idLive, uint64(s.h.live))
	if e.cfg.prefill {
		e.apply(s, move{actor: -1, what: "publish", option: 1})
	}
	return s
}

func (e *explorer) mem(s *mstate) *mem { return &mem{model: s.w[:e.g.words()]} }

func (e *explorer) key(s *mstate) uint64 {
	b := e.buf[:0]
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	for _, w := range s.w[:e.g.words()] {
		u64(w)
	}
	for i := range e.cfg.n {
		c := &s.c[i]
		cl := &c.cl
		b = append(b, cl.pc, cl.i, cl.attempts, cl.r, cl.n, c.phase, c.k, c.sub, bool8(c.dead), bool8(c.needRec))
		u64(cl.a)
		u64(cl.b)
		u64(uint64(cl.live)<<32 | uint64(cl.peer))
		u64(uint64(cl.senior)<<32 | uint64(cl.take))
		u64(uint64(c.inhand))
		b = append(b, cl.slots[:e.cfg.width]...)
		for _, q := range cl.seqs[:e.cfg.width] {
			u64(q)
		}
		b = append(b, c.batch[:]...)
	}
	if e.cfg.grant {
		for i := range e.cfg.n {
			nt := &s.notice[i]
			b = append(b, bool8(nt.pending), nt.n)
			b = append(b, nt.slots[:nt.n]...)
			for _, q := range nt.seqs[:nt.n] {
				u64(q)
			}
		}
		b = append(b, bool8(s.degraded), s.hostile, s.expires)
		u64(uint64(s.expired))
		b = append(b, s.ran[:]...)
	}
	h := &s.h
	u64(uint64(h.h)<<32 | uint64(h.live))
	u64(uint64(h.held)<<32 | uint64(bool8(h.grants)))
	u64(h.claimedTo)
	u64(h.tail)
	u64(h.stored)
	u64(h.lastSeq)
	for i := range e.cfg.S {
		u64(h.seqOf[i])
		u64(h.ticket[i])
	}
	r := &s.rec
	b = append(b, r.pc, r.c, r.k, r.n, bool8(r.won), bool8(r.err != nil), byte(s.recC), s.deaths, s.cursor)
	u64(r.js)
	u64(uint64(r.seen)<<32 | uint64(r.mask))
	for k := range r.n {
		u64(uint64(r.calls[k].Slot))
		u64(r.calls[k].Seq)
		b = append(b, r.st[k])
	}
	u64(uint64(s.queue))
	b = append(b, s.callOfSeq[:]...)
	b = append(b, s.started[:]...)
	b = append(b, s.settled[:]...)
	for _, v := range s.holder {
		b = append(b, byte(v))
	}
	e.buf = b
	return maphash.Bytes(e.seed, b)
}

func bool8(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// A transition: which actor moved, for traces.
type move struct {
	actor  int // -1 host, -2 recovery, -3 the hostile lane, else consumer
	what   string
	option int
	val    uint64 // a hostile write's value (option is the word)
}

func (mv move) String() string {
	switch mv.actor {
	case -1:
		return fmt.Sprintf("host %s/%d", mv.what, mv.option)
	case -2:
		return "recover " + mv.what
	case -3:
		return fmt.Sprintf("hostile %s %d=%#x", mv.what, mv.option, mv.val)
	}
	return fmt.Sprintf("c%d %s", mv.actor, mv.what)
}

// moves lists the transitions enabled in s.
func (e *explorer) moves(s *mstate, deaths bool, out []move) []move {
	out = out[:0]
	canDie := func(i int) bool { return deaths && i == e.cfg.victim && !s.c[i].dead }
	if deaths {
		// Partial-order reduction: a consumer step that touches only the consumer's own
		// journal (or nothing shared) commutes with every other actor's step; only the
		// consumer's own death (and the recovery that follows it) can observe it. Explore
		// just that step (and that death) here; the other orders reach the same states.
		for i := range e.cfg.n {
			if c := &s.c[i]; !c.dead && e.private(c, i) {
				out = append(out, move{actor: i, what: "step"})
				if canDie(i) {
					out = append(out, move{actor: i, what: "die"})
				}
				return out
			}
		}
	}
	if s.recC >= 0 {
		out = append(out, move{actor: -2, what: "step"})
	}
	if e.cfg.grant {
		for i := range e.cfg.n {
			if s.notice[i].pending {
				out = append(out, move{actor: -1, what: "grant", option: i})
			}
		}
	}
	if s.queue != 0 && e.free(s) != 0 {
		out = append(out, move{actor: -1, what: "publish", option: 0})
		if bits.OnesCount16(s.queue) > 1 && bits.OnesCount32(e.free(s)) > 1 {
			out = append(out, move{actor: -1, what: "publish", option: 1})
		}
		if e.g.disc == Dekker && e.g.regions() > 1 {
			out = append(out, move{actor: -1, what: "publish", option: 2})
		}
	}
	avail := e.available(s) && !s.degraded
	for i := range e.cfg.n {
		c := &s.c[i]
		if c.dead {
			continue
		}
		if c.phase == cIdle && !avail && !canDie(i) {
			continue
		}
		switch {
		case c.phase == cWait && s.notice[i].pending:
			// waits for the host's answer
		case c.phase == cClaim && c.cl.pc == dLive && !e.cfg.survey:
			// The survey only steers the choice of a region; the handshake must keep any
			// choice safe. So instead of surveying the peers' WANT words, the model lets the
			// claimant pick any pending region (a superset of what a survey can pick).
			for r := range e.g.regions() {
				if c.cl.take&e.g.regionMask(r) != 0 {
					out = append(out, move{actor: i, what: "choose", option: r})
				}
			}
		case c.phase != cIdle || avail:
			out = append(out, move{actor: i, what: "step"})
		}
		if c.phase == cClaim && c.cl.pc == dJuniorWant {
			out = append(out, move{actor: i, what: "giveup"})
		}
		if canDie(i) {
			out = append(out, move{actor: i, what: "die"})
		}
	}
	if e.cfg.grant && !s.degraded {
		// The host's audit (host.check) runs at any time: in an honest run it must never
		// find the ring broken (a false alarm gives stealing up for good); once a hostile
		// write made it find so, the host gives the ring up. It may also give it up at any
		// time (a call stuck for a second: the model has no clock), which must be safe.
		if a := s.h.check(e.mem(s), &e.g); a.Err != nil && s.hostile == uint8(e.cfg.hostile) {
			e.fail("audit of an honest run: %v", a.Err)
		}
		out = append(out, move{actor: -1, what: "fallback"})
		if s.expires == 0 && !e.cfg.noExpire {
			// Take back a call claimed and retired whose notice has not come: at any time
			// (the real host after a second of it, a claimant descheduled or sitting).
			a := s.h.check(e.mem(s), &e.g)
			for slot := range e.g.S {
				if (a.Claimed&^a.Unretired)&(1<<slot) != 0 {
					out = append(out, move{actor: -1, what: "expire", option: slot})
				}
			}
		}
	}
	if s.hostile > 0 {
		out = append(out, e.hostileMoves(s)...)
	}
	return out
}

// hostileMoves are the hostile lane's possible next writes: for each shared word a few
// values a lane can write that the protocol never would (a bit of H or W flipped, the head
// moved a ticket back or on under any owner, the tail moved, an order cell or sequence
// number naming another slot or call, LIVE and WANT bits, stamps, journal states and
// entries copied, zeroed or advanced), and notices of its own naming any slot's call.
func (e *explorer) hostileMoves(s *mstate) []move {
	g := &e.g
	var out []move
	add := func(id int, v uint64) {
		if s.w[id] != v {
			out = append(out, move{actor: -3, what: "write", option: id, val: v})
		}
	}
	for slot := range g.S {
		add(idH, s.w[idH]^1<<slot)
		add(idW, s.w[idW]^1<<slot)
		add(g.seq(slot), 0)
		add(g.seq(slot), s.w[g.seq((slot+1)%g.S)])
		add(g.seq(slot), s.w[g.seq(slot)]+1)
		out = append(out, move{actor: -3, what: "forge", option: slot})
	}
	if g.disc == Ticket {
		h := s.w[idHead]
		t := headTicket(h)
		for o := range g.n {
			add(idHead, headWord(t+1, max(headBatch(h), 1), o))
			if t > 0 {
				add(idHead, headWord(t-1, max(headBatch(h), 1), o))
			}
		}
		add(idTail, s.w[idTail]+1)
		if s.w[idTail] > 0 {
			add(idTail, s.w[idTail]-1)
		}
		for i := range g.S {
			add(g.order(i), uint64((s.w[g.order(i)]+1)%uint64(g.S)))
		}
		for c := range g.n {
			add(g.stamp(c), 0)
			add(g.stamp(c), h)
		}
	} else {
		for c := range g.n {
			add(idLive, s.w[idLive]^1<<c)
			add(g.want(c), 0)
			for r := range g.regions() {
				add(g.want(c), 1<<r)
			}
		}
	}
	for c := range g.n {
		j := s.w[g.journal(c)]
		add(g.journal(c), 0)
		x := uint64(0)
		if g.disc == Ticket {
			x = headTicket(s.w[idHead])
		}
		add(g.journal(c), journalWord(x, 1, phaseCommitted))
		if j&3 == phaseCommitted {
			add(g.journal(c), journalWord(j>>8, int(j>>2)&63, phaseIntent))
		}
		for k := range g.E {
			en := s.w[g.entry(c, k)]
			add(g.entry(c, k), 0)
			add(g.entry(c, k), en&^3|entryClaimed)
			add(g.entry(c, k), s.w[g.entry((c+1)%g.n, k)])
		}
	}
	return out
}

// available reports whether a claim started now could find anything. When nothing is
// available, a poll ends with nothing and changes nothing, whatever the other actors do
// meanwhile: under Dekker, no slot is pending, so the consumer word cannot move before the
// host publishes; under Ticket, the head cannot move before the host publishes, and a poll
// that reads the head now and the tail after a publish is the poll started after the
// publish. So idle consumers start claims only when something is available.
func (e *explorer) available(s *mstate) bool {
	if e.g.disc == Dekker {
		return (s.w[idH]^s.w[idW])&uint64(e.g.full()) != 0
	}
	return s.w[idTail] != headTicket(s.w[idHead])
}

// private reports whether consumer i's next step accesses no shared word but its own
// journal: journal stores during a claim, the choice at the end of the Dekker survey, and
// running calls.
func (e *explorer) private(c *mcons, i int) bool {
	switch c.phase {
	case cRun:
		return true
	case cNotice, cFinish:
		return true // its own return ring (read by the host only once written) and journal
	case cClaim:
		switch c.cl.pc {
		case tIntent, tAbandon, tEntry, tCommit, dUncommit, dEntry, dCommit:
			return true
		case dSurvey:
			j := int(c.cl.i)
			for j < e.cfg.n && (j == i || c.cl.live&(1<<j) == 0) {
				j++
			}
			return j == e.cfg.n
		}
	}
	return false
}

func (e *explorer) deathMoves(s *mstate) []move {
	if v := e.cfg.victim; v >= 0 && !s.c[v].dead {
		return []move{{actor: v, what: "die"}}
	}
	return nil
}

// free is the set of slots the host may publish into.
func (e *explorer) free(s *mstate) uint32 {
	return ^(s.h.h ^ uint32(s.w[idW])) & e.g.full() &^ s.h.held // Producer.Reserve
}

func (e *explorer) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf(format, args...)
	}
}

// apply performs mv on s (a copy the caller owns).
func (e *explorer) apply(s *mstate, mv move) {
	m := e.mem(s)
	g := &e.g
	switch {
	case mv.actor == -1 && mv.what == "grant":
		e.grantNotice(s, mv.option)
	case mv.actor == -1 && mv.what == "fallback":
		e.fallback(s)
	case mv.actor == -1 && mv.what == "expire":
		if seq := s.h.seqOf[mv.option]; s.h.take(g, mv.option, seq) {
			call := s.callOfSeq[seq]
			s.holder[call] = -1
			s.expires++
			s.expired |= 1 << seq
			e.requeue(s, call)
		}
	case mv.actor == -1:
		// Publish one call (option 0: the next free slot in fastpath's cyclic order; option
		// 2: the first free slot of the next region) or a burst of every queued call that
		// fits (option 1), then flush. Staging and flushing are one transition: staged
		// words (sequence numbers, order cells) are read before the flush only by a claim
		// whose head is stale, and its CAS fails whatever it read.
		for first := true; s.queue != 0 && e.free(s) != 0 && (first || mv.option == 1); first = false {
			free := e.free(s)
			slot := -1
			if mv.option != 2 {
				for k := range e.cfg.S {
					if j := (int(s.cursor) + k) % e.cfg.S; free&(1<<j) != 0 {
						slot = j
						break
					}
				}
			} else {
				r := (int(s.cursor)/e.cfg.width + 1) % g.regions()
				for k := range g.regions() {
					if f := free & g.regionMask((r+k)%g.regions()); f != 0 {
						slot = bits.TrailingZeros32(f)
						break
					}
				}
			}
			call := bits.TrailingZeros16(s.queue)
			s.queue &^= 1 << call
			seq := s.h.lastSeq + 1
			s.h.stage(m, g, slot, seq)
			s.callOfSeq[seq] = uint8(call)
			s.cursor = uint8((slot + 1) % e.cfg.S)
		}
		m.store(idH, uint64(s.h.h)) // what fastpath.Producer.Flush stores
		s.h.flush(m, g)
	case mv.actor == -2:
		c := int(s.rec.c)
		done := s.rec.step(m, g, &s.h)
		if s.rec.pc >= rLive {
			s.c[c].inhand = 0 // retired for it, or (dekker, never journaled) free again once LIVE drops
		}
		if done {
			e.recovered(s, c)
		}
	case mv.actor == -3:
		s.hostile--
		if mv.what == "write" {
			m.store(mv.option, mv.val)
		} else if seq := s.h.seqOf[mv.option]; s.h.take(g, mv.option, seq) {
			e.run(s, s.callOfSeq[seq]) // granted to the hostile lane: it runs it, once
		}
	case mv.what == "die":
		if s.c[mv.actor].dead {
			return
		}
		s.c[mv.actor].dead = true
		s.deaths++
		if s.notice[mv.actor].pending {
			// Its notice is on its return ring: the host drains that (Fence) before it
			// recovers the journal.
			s.c[mv.actor].needRec = true
			return
		}
		s.recC = int8(mv.actor)
		s.rec.begin(mv.actor)
	case mv.what == "choose":
		cl := &s.c[mv.actor].cl
		cl.live = uint32(m.load(idLive)) // what the dLive step loads
		cl.r = uint8(mv.option)
		cl.take = 0
		cl.pc = dRaise
	default:
		e.consumerStep(s, m, mv.actor, mv.what == "giveup")
	}
}

func (e *explorer) consumerStep(s *mstate, m *mem, i int, giveUp bool) {
	g := &e.g
	c := &s.c[i]
	switch c.phase {
	case cIdle:
		c.cl = claimer{}
		c.cl.begin(g)
		c.phase = cClaim
		fallthrough
	case cClaim:
		before := c.cl.pc
		st := c.cl.step(m, g, i, giveUp)
		// Ghost: the claim's linearization point. Ticket: the head CAS won. Dekker: the
		// region's snapshot was taken inside the handshake. (Not once a hostile lane has
		// written: two claims of one call are then possible, and the grants decide.)
		honest := s.hostile == uint8(e.cfg.hostile)
		if before == tCAS && c.cl.pc == tEntry && honest {
			var mask uint32
			for k := range c.cl.n {
				mask |= 1 << c.cl.slots[k]
			}
			e.take(s, i, mask)
			for k := range c.cl.n {
				e.hold(s, i, s.callOfSeq[s.h.seqOf[c.cl.slots[k]]])
			}
		}
		if before == dTakeW && c.cl.pc == dUncommit && honest {
			e.take(s, i, c.cl.take)
		}
		switch st {
		case none:
			c.cl = claimer{}
			c.phase = cIdle
		case committed:
			if !honest {
				c.phase = cHeld
				break
			}
			for k := range c.cl.n {
				slot := c.cl.slots[k]
				if c.cl.seqs[k] != s.h.seqOf[slot] {
					e.fail("c%d journaled slot %d with seq %d, the slot holds %d", i, slot, c.cl.seqs[k], s.h.seqOf[slot])
				}
				call := s.callOfSeq[c.cl.seqs[k]]
				c.batch[k] = call
				if g.disc == Dekker {
					e.hold(s, i, call)
				}
			}
			c.phase = cHeld
		case exhausted, released:
			e.fail("c%d: claim ended with status %d", i, st)
		}
	case cHeld:
		w0 := s.w[idW]
		st := c.cl.step(m, g, i, false)
		if s.w[idW] != w0 && s.hostile == uint8(e.cfg.hostile) {
			if got := uint32(s.w[idW] ^ w0); got != c.inhand {
				e.fail("c%d retired %#x, held %#x", i, got, c.inhand)
			}
			c.inhand = 0
		}
		if st == released {
			c.phase, c.k, c.sub = cRun, 0, 0
			if e.cfg.grant {
				c.phase = cNotice
			}
		}
	case cNotice:
		// The notice goes out on the consumer's own return ring: what it claimed, as its
		// claim read it (the slots and the sequence numbers in their headers).
		nt := &s.notice[i]
		*nt = notice{pending: true, n: c.cl.n}
		copy(nt.slots[:], c.cl.slots[:c.cl.n])
		copy(nt.seqs[:], c.cl.seqs[:c.cl.n])
		for k := range c.cl.n {
			if q := c.cl.seqs[k]; q < uint64(len(s.callOfSeq)) {
				if call := s.callOfSeq[q]; s.holder[call] == int8(i) {
					s.holder[call] = -1 // the host has it now
				}
			}
		}
		c.phase, c.k = cFinish, 0
	case cFinish:
		k := int(c.k)
		markEntry(m, g, i, k, c.cl.seqs[k], int(c.cl.slots[k]), entryFinished)
		if c.k++; c.k == c.cl.n {
			c.phase = cWait
		}
	case cWait:
		c.cl = claimer{}
		c.phase, c.k = cIdle, 0
	case cRun:
		k := int(c.k)
		call := c.batch[k]
		switch c.sub {
		case 0:
			markEntry(m, g, i, k, c.cl.seqs[k], int(c.cl.slots[k]), entryStarted)
			s.started[call]++
			if s.started[call] > 1 {
				e.fail("call %d started twice", call)
			}
		case 1:
			s.settled[call]++
			if s.settled[call] > 1 {
				e.fail("call %d settled twice (result of c%d)", call, i)
			}
		case 2:
			markEntry(m, g, i, k, c.cl.seqs[k], int(c.cl.slots[k]), entryFinished)
			s.holder[call] = -1
		}
		c.sub++
		if c.sub == 3 {
			c.sub = 0
			c.k++
			if c.k == c.cl.n {
				c.cl = claimer{}
				c.phase = cIdle
				c.batch = [8]uint8{}
			}
		}
	}
}

// grantNotice is the host's answer to consumer i's notice (Producer.Grant for each call
// it names): a call still held in that slot with that sequence number is granted and runs,
// once; any other is refused (an honest run never names one). A dead consumer's notice is
// drained before its journal is recovered: its calls are granted, but the lane is gone,
// so they are dispatched again.
func (e *explorer) grantNotice(s *mstate, i int) {
	nt := &s.notice[i]
	for k := range nt.n {
		slot, seq := int(nt.slots[k]), nt.seqs[k]
		if s.degraded || !s.h.take(&e.g, slot, seq) {
			if seq < 32 && s.expired&(1<<seq) != 0 {
				s.expired &^= 1 << seq // taken back (expire): refused without harm
				continue
			}
			if !s.degraded && s.hostile == uint8(e.cfg.hostile) {
				e.fail("c%d's notice of slot %d, call %d, refused in an honest run", i, slot, seq)
			}
			continue
		}
		if call := s.callOfSeq[seq]; s.c[i].dead {
			e.requeue(s, call)
		} else {
			e.run(s, call)
		}
	}
	*nt = notice{}
	if c := &s.c[i]; c.needRec {
		c.needRec = false
		s.recC = int8(i)
		s.rec.begin(i)
	}
}

// run is a call running (granted, or dispatched elsewhere once the ring is given up): once.
func (e *explorer) run(s *mstate, call uint8) {
	if s.ran[call]++; s.ran[call] > 1 {
		e.fail("call %d ran twice", call)
	}
	if s.settled[call]++; s.settled[call] > 1 {
		e.fail("call %d settled twice", call)
	}
}

// requeue dispatches a call again: on the ring, or elsewhere once the ring is given up.
func (e *explorer) requeue(s *mstate, call uint8) {
	if s.degraded {
		e.run(s, call)
		return
	}
	s.queue |= 1 << call
}

// fallback gives the ring up (the pool's private lanes take over): every call the host
// holds ungranted, and every call waiting to be published, runs elsewhere.
func (e *explorer) fallback(s *mstate) {
	s.degraded = true
	for slot := range e.g.S {
		if seq := s.h.seqOf[slot]; s.h.take(&e.g, slot, seq) {
			call := s.callOfSeq[seq]
			s.holder[call] = -1
			e.run(s, call)
		}
	}
	for call := range e.cfg.calls {
		if s.queue&(1<<call) != 0 {
			e.run(s, uint8(call))
		}
	}
	s.queue = 0
}

// take checks that slots no other consumer holds are taken by consumer i, pending, and
// records them.
func (e *explorer) take(s *mstate, i int, mask uint32) {
	for j := range e.cfg.n {
		if j != i && s.c[j].inhand&mask != 0 {
			e.fail("c%d took slots %#x while c%d holds %#x", i, mask, j, s.c[j].inhand)
		}
	}
	if pend := s.h.h ^ uint32(s.w[idW]); pend&mask != mask {
		e.fail("c%d took slots %#x, pending are %#x", i, mask, pend)
	}
	s.c[i].inhand = mask
}

func (e *explorer) hold(s *mstate, i int, call uint8) {
	if h := s.holder[call]; h >= 0 {
		e.fail("c%d took call %d, held by c%d", i, call, h)
	}
	if e.cfg.grant {
		if !s.degraded && s.ran[call] != 0 {
			e.fail("c%d took call %d, which ran", i, call)
		}
		s.holder[call] = int8(i)
		return // given up, the ring's calls ran elsewhere: the claimant's notice is refused
	}
	if s.started[call] != 0 || s.settled[call] != 0 {
		e.fail("c%d took call %d, started %d settled %d", i, call, s.started[call], s.settled[call])
	}
	s.holder[call] = int8(i)
}

// recovered checks Recover's answer against the ghost and acts on it as the pool would.
func (e *explorer) recovered(s *mstate, c int) {
	var out Recovery
	s.rec.result(&out)
	if e.cfg.grant {
		e.recoveredGrant(s, c, &out)
		return
	}
	if s.rec.err != nil {
		e.fail("recover c%d: %v", c, s.rec.err)
	}
	want := map[uint8]bool{}
	for call, h := range s.holder[:e.cfg.calls] {
		if int(h) == c {
			want[uint8(call)] = true
		}
	}
	got := 0
	for _, list := range [][]Call{out.Fresh, out.Started} {
		for _, cl := range list {
			call := s.callOfSeq[cl.Seq]
			if !want[call] {
				e.fail("recover c%d returned call %d (seq %d), which it did not hold", c, call, cl.Seq)
			}
			got++
		}
	}
	if got != len(want) {
		e.fail("recover c%d returned %d calls, it held %d", c, got, len(want))
	}
	for _, cl := range out.Fresh {
		call := s.callOfSeq[cl.Seq]
		if s.started[call] != 0 {
			e.fail("recover c%d: call %d returned as never started, but it started", c, call)
		}
		s.holder[call] = -1
		s.queue |= 1 << call // dispatched again
	}
	for _, cl := range out.Started {
		call := s.callOfSeq[cl.Seq]
		if s.started[call] == 0 {
			e.fail("recover c%d: call %d returned as started, but it never started", c, call)
		}
		s.holder[call] = -1
		if s.settled[call] == 0 {
			s.settled[call] = 1 // failed (or re-run, if idempotent)
		}
	}
	s.recC = -1
	s.rec = recoverer{}
	s.c[c] = mcons{dead: true} // it never moves again: forget its stale state
}

// recoveredGrant is recovered in grant mode: the journal is a hint. Each call it names
// that the host still holds ungranted (Revoke) is dispatched again; the host's record
// decides, so a forged journal can make it dispatch a call another claimant holds (whose
// notice is then refused), never run one twice. In an honest run the hint is exact: it
// names every call the consumer claimed and had not noticed, and started none.
func (e *explorer) recoveredGrant(s *mstate, c int, out *Recovery) {
	honest := s.hostile == uint8(e.cfg.hostile)
	if s.rec.err != nil {
		if honest {
			e.fail("recover c%d: %v", c, s.rec.err)
		}
		e.fallback(s) // the pool gives the ring up
	}
	if honest && len(out.Started) > 0 {
		e.fail("recover c%d: %d calls started, in grant mode", c, len(out.Started))
	}
	for _, list := range [][]Call{out.Fresh, out.Started} {
		for _, cl := range list {
			if !s.h.take(&e.g, cl.Slot, cl.Seq) {
				continue
			}
			call := s.callOfSeq[cl.Seq]
			if honest && s.holder[call] != int8(c) {
				e.fail("recover c%d returned call %d, held by %d", c, call, s.holder[call])
			}
			s.holder[call] = -1
			e.requeue(s, call)
		}
	}
	if honest && !s.degraded {
		for call, h := range s.holder[:e.cfg.calls] {
			if int(h) == c {
				e.fail("recover c%d did not return call %d, which it claimed and had not noticed", c, call)
			}
		}
	}
	s.recC = -1
	s.rec = recoverer{}
	s.c[c] = mcons{dead: true}
}

func (e *explorer) terminal(s *mstate) bool {
	if s.queue != 0 || s.recC >= 0 {
		return false
	}
	for i := range e.cfg.n {
		if s.notice[i].pending || s.c[i].needRec {
			return false
		}
	}
	for i := range e.cfg.n {
		if !s.c[i].dead && s.c[i].phase != cIdle {
			return false
		}
	}
	for call := range e.cfg.calls {
		if s.settled[call] != 1 {
			return false
		}
	}
	return true
}

// check asserts what must hold in every terminal state.
func (e *explorer) checkTerminal(s *mstate) {
	if s.degraded || s.hostile != uint8(e.cfg.hostile) {
		return // the ring was given up, or written by a hostile lane: nothing holds of it
	}
	if s.w[idH] != s.w[idW] {
		e.fail("terminal: producer word %#x, consumer word %#x", s.w[idH], s.w[idW])
	}
	for i := range e.cfg.n {
		if !s.c[i].dead && s.w[e.g.want(i)] != 0 {
			e.fail("terminal: c%d WANT %#x", i, s.w[e.g.want(i)])
		}
	}
}

const (
	seenState = 1 << iota
	goodState // from here the survivors settle every call
	onStack
)

func (e *explorer) alloc() *mstate {
	if n := len(e.spare); n > 0 {
		t := e.spare[n-1]
		e.spare = e.spare[:n-1]
		return t
	}
	return new(mstate)
}

type frame struct {
	s     *mstate
	key   uint64
	moves []move
	next  int
	full  bool // moves is the full set (the reduction was undone)
}

// explore runs the depth-first search from root.
func (e *explorer) explore(root *mstate) {
	rk := e.key(root)
	e.seen[rk] = seenState | onStack
	stack := []frame{{s: root, key: rk, moves: e.moves(root, true, nil)}}
	e.states = 1
	if !e.progress(root) {
		return
	}
	for len(stack) > 0 && e.err == nil {
		f := &stack[len(stack)-1]
		if f.next == len(f.moves) {
			e.seen[f.key] &^= onStack
			e.spare = append(e.spare, f.s)
			stack = stack[:len(stack)-1]
			continue
		}
		mv := f.moves[f.next]
		f.next++
		t := e.alloc()
		*t = *f.s
		e.apply(t, mv)
		e.trans++
		if e.err != nil {
			e.path = trace(stack)
			return
		}
		k := e.key(t)
		flags := e.seen[k]
		if flags&onStack != 0 && !f.full && len(f.moves) < len(e.moves(f.s, false, nil)) {
			// Cycle proviso: a reduced state must not close a cycle on the stack with only
			// its reduced moves; explore it fully instead.
			f.moves = e.moves(f.s, false, nil)
			f.moves = append(f.moves, e.deathMoves(f.s)...)
			f.full, f.next = true, 0
			continue
		}
		if flags&seenState != 0 {
			e.spare = append(e.spare, t)
			continue
		}
		e.seen[k] = flags | seenState | onStack
		if e.limit > 0 && e.states >= e.limit {
			return
		}
		e.states++
		if e.terminal(t) {
			e.checkTerminal(t)
		}
		if e.err != nil || !e.progress(t) {
			e.path = trace(stack)
			return
		}
		stack = append(stack, frame{s: t, key: k, moves: e.moves(t, true, nil)})
		e.maxDeep = max(e.maxDeep, len(stack))
	}
}

// trace lists the moves from the initial state to the failing one.
func trace(stack []frame) []string {
	var p []string
	for _, f := range stack {
		p = append(p, f.moves[f.next-1].String())
	}
	return p
}

// progress runs the survivors from s without further deaths, recovery and the host first,
// then the consumers round robin, and reports whether every call settles. States on a run
// that settles are remembered as good.
func (e *explorer) progress(s *mstate) bool {
	const limit, stallLimit = 20000, 2000
	cur := new(mstate)
	*cur = *s
	var visited []uint64
	rr, stalled, lastSettled := 0, 0, -1
	var mv []move
	for step := 0; step < limit; step++ {
		k := e.key(cur)
		if e.seen[k]&goodState != 0 || e.terminal(cur) {
			e.seen[k] |= goodState
			for _, v := range visited {
				e.seen[v] |= goodState
			}
			return true
		}
		visited = append(visited, k)
		mv = e.moves(cur, false, mv)
		if len(mv) == 0 {
			e.fail("deadlock: no move enabled in a non-final state")
			return false
		}
		// Host moves come first (but the hostile lane's, which has stopped, and giving the
		// ring up); else a busy consumer round robin, else an idle one (a poll). Only when
		// nothing else moves, or nothing has settled for a long while, does the host give
		// the ring up (grant mode), as its audit would on a real clock: never needed in an
		// honest run.
		pick := -1
		for j, m := range mv {
			if (m.actor == -1 || m.actor == -2) && m.what != "fallback" && m.what != "expire" {
				pick = j
				break
			}
		}
		if pick < 0 {
			for j := range e.cfg.n {
				i := (rr + j) % e.cfg.n
				if c := &cur.c[i]; !c.dead && c.phase != cIdle {
					pick = e.index(mv, i)
					break
				}
			}
			for j := 0; pick < 0 && j < e.cfg.n; j++ {
				if i := (rr + j) % e.cfg.n; !cur.c[i].dead {
					pick = e.index(mv, i)
				}
			}
			rr++
		}
		if settled := e.settledCount(cur); settled != lastSettled {
			lastSettled, stalled = settled, 0
		} else {
			stalled++
		}
		if pick < 0 || stalled > stallLimit {
			for j, m := range mv {
				if m.what == "fallback" {
					if cur.hostile == uint8(e.cfg.hostile) {
						e.fail("honest run stuck: only giving the ring up settles its calls")
						return false
					}
					pick = j
					break
				}
			}
		}
		if pick < 0 {
			e.fail("deadlock: calls unsettled and no survivor can move")
			return false
		}
		e.apply(cur, mv[pick])
		if e.err != nil {
			return false
		}
	}
	e.fail("no progress: %d steps of the survivors did not settle every call", limit)
	return false
}

func (e *explorer) settledCount(s *mstate) int {
	n := 0
	for _, v := range s.settled[:e.cfg.calls] {
		n += int(v)
	}
	return n
}

func (e *explorer) index(mv []move, actor int) int {
	first := -1
	for j, m := range mv {
		// A claimant waiting for a junior's WANT withdraws in the end (spinLimit): so it
		// does here, or a WANT a hostile lane raised for good would hold it for ever.
		if m.actor == actor && m.what == "giveup" {
			return j
		}
	}
	for j, m := range mv {
		if m.actor == actor && m.what == "step" {
			return j
		}
		if m.actor == actor && first < 0 && m.what != "die" && m.what != "giveup" {
			first = j
		}
	}
	return first
}

func runModel(t *testing.T, cfg mcfg) *explorer {
	t.Helper()
	e := newExplorer(cfg)
	e.explore(e.initial())
	if e.err != nil {
		t.Fatalf("%v: %v\nafter %d states; trace:\n%s", cfg, e.err, e.states, joinLines(e.path))
	}
	t.Logf("%v: %d states, %d transitions, depth %d", cfg, e.states, e.trans, e.maxDeep)
	return e
}

func joinLines(p []string) string {
	out := ""
	for _, l := range p {
		out += "  " + l + "\n"
	}
	return out
}

// EnvModel selects the model check's grid: unset, the quick grid (seconds; also what
// `go test -race ./...` runs); "full", the CI grid (.ci/run runs it without -race);
// "extended", the full grid plus the largest spaces (tens of millions of states).
const EnvModel = "KNIT_MODEL"

// modelGrid lists the configurations to explore. Ticket consumers are symmetric (an id is
// only a label in the head and stamp words), so one victim covers them all; under Dekker
// ids are seniority, and every consumer takes its turn as the victim. Batch widths above
// the number of calls behave as a width equal to it (a ticket claim takes min(available,
// width)), so they are folded into it. Dekker widths are powers of two (the only valid ones)
// and each has a spare region when 32 slots allow it.
func modelGrid(mode string) []mcfg {
	var grid []mcfg
	prefill, half := false, false
	grant, hostile, victims := false, 0, true
	ticket := func(n, calls int, widths ...int) {
		seen := map[int]bool{}
		for _, w := range widths {
			w = min(w, calls)
			if !seen[w] {
				seen[w] = true
				victim := 0
				if !victims {
					victim = -1
				}
				grid = append(grid, mcfg{disc: Ticket, n: n, width: w, S: max(4, calls), calls: calls, victim: victim, prefill: prefill, half: half,
					grant: grant, hostile: hostile, noExpire: hostile > 0 && mode != "extended"})
			}
		}
	}
	dekker := func(n, calls int, survey bool, widths ...int) {
		for _, w := range widths {
			regions := n + 1
			if w*regions > Slots {
				regions = n
			}
			for v := range n {
				if !victims {
					v = -1
				}
				grid = append(grid, mcfg{disc: Dekker, n: n, width: w, S: w * regions, calls: calls, victim: v, survey: survey, prefill: prefill, half: half,
					grant: grant, hostile: hostile, noExpire: hostile > 0 && mode != "extended"})
				if !victims {
					break
				}
			}
		}
	}
	// Grant mode (Producer.RequireGrants), honest; with a hostile lane (k writes, no death:
	// victims false), where the host's audit and fallback run too.
	granted := func(f func()) {
		grant = true
		f()
		grant = false
	}
	hostileRuns := func(k int, deaths bool, f func()) {
		grant, hostile, victims = true, k, deaths
		f()
		grant, hostile, victims = false, 0, true
	}
	// Runs with every call published up front, so that full batches form (up to 8 calls).
	prefilled := func(f func()) {
		prefill = true
		f()
		prefill = false
	}
	// Ticket claims that take half of what waits (Config.Half, as pools use them).
	halved := func(f func()) {
		half = true
		f()
		half = false
	}
	all := []int{1, 2, 3, 4, 5, 6, 7, 8}
	switch mode {
	case "":
		ticket(2, 2, all...)
		ticket(3, 1, 1)
		ticket(4, 1, 1)
		halved(func() { ticket(2, 3, 8); dekker(2, 2, false, 2) })
		dekker(2, 2, false, 2)
		granted(func() { ticket(2, 2, 2); dekker(2, 1, false, 2) })
		hostileRuns(1, false, func() { ticket(2, 1, 1); dekker(2, 1, false, 1) })
		if !raceEnabled { // the race detector slows the explorer down several times
			dekker(2, 2, true, 1)
			dekker(3, 1, false, 4)
			prefilled(func() { ticket(2, 8, 8); dekker(2, 4, false, 4) })
		}
	case "full", "extended":
		ticket(2, 3, all...)
		ticket(3, 2, all...)
		ticket(4, 1, all...)
		halved(func() { ticket(2, 3, all...); ticket(3, 2, 2, 8); dekker(2, 3, false, 4); dekker(3, 2, false, 2) })
		dekker(2, 2, false, 1, 2, 4, 8)
		dekker(2, 2, true, 2, 8)
		dekker(2, 3, false, 4)
		dekker(3, 1, false, 1, 2, 4, 8)
		dekker(3, 1, true, 2)
		dekker(4, 1, false, 1, 8)
		granted(func() {
			ticket(2, 3, all...)
			ticket(3, 2, 1, 2)
			dekker(2, 2, false, 1, 2, 4, 8)
			dekker(2, 2, true, 2)
			dekker(3, 1, false, 1, 2, 4)
			halved(func() { ticket(2, 3, 8); dekker(2, 3, false, 4) })
			prefilled(func() { ticket(2, 8, 8); dekker(2, 4, false, 4) })
		})
		hostileRuns(1, false, func() {
			ticket(2, 2, 1, 2)
			ticket(3, 1, 1)
			dekker(2, 1, false, 1, 2)
			dekker(2, 2, false, 1)
		})
		hostileRuns(1, true, func() { ticket(2, 1, 1); dekker(2, 1, false, 1) })
		hostileRuns(2, false, func() { ticket(2, 1, 1) })
		prefilled(func() {
			ticket(2, 8, all...)
			halved(func() { ticket(2, 8, 8); dekker(2, 4, false, 4) })
			ticket(3, 4, 4)
			ticket(4, 2, 2)
			dekker(2, 4, false, 4)
			dekker(2, 6, false, 8)
			dekker(3, 2, false, 2)
		})
		if mode == "extended" {
			prefilled(func() {
				dekker(3, 4, false, 4)
				dekker(4, 2, false, 4)
			})
			ticket(4, 2, all...)
			dekker(3, 2, false, 2, 8)
			dekker(4, 1, false, 2, 4)
			dekker(2, 3, true, 2, 4)
			hostileRuns(2, false, func() { dekker(2, 1, false, 1); ticket(2, 2, 2) })
			hostileRuns(1, true, func() { ticket(2, 2, 2); dekker(2, 2, false, 1) })
		}
	}
	return grid
}

// TestModel runs the model check over the grid KNIT_MODEL selects (see docs/stealing.md).
func TestModel(t *testing.T) {
	mode := os.Getenv(EnvModel)
	switch mode {
	case "", "full", "extended":
	default:
		t.Fatalf("%s=%q: want full or extended (or unset)", EnvModel, mode)
	}
	grid := modelGrid(mode)
	var states, trans atomic.Int64
	t.Run("grid", func(t *testing.T) {
		for _, cfg := range grid {
			t.Run(cfg.String(), func(t *testing.T) {
				t.Parallel()
				e := runModel(t, cfg)
				states.Add(int64(e.states))
				trans.Add(int64(e.trans))
			})
		}
	})
	t.Logf("model check (%q grid): %d configurations, %d states, %d transitions", mode, len(grid), states.Load(), trans.Load())
}

// TestModelHostileNeedsGrants: without grants, one write of a hostile lane makes a call run
// twice under either discipline (the claim head moved back; the producer word zeroed, which
// makes a claimed slot pending again), and the model finds it. With grants (TestModel's
// hostile runs) no write does.
func TestModelHostileNeedsGrants(t *testing.T) {
	for _, cfg := range []mcfg{
		{disc: Ticket, n: 2, width: 1, S: 4, calls: 1, victim: -1, hostile: 1},
		{disc: Dekker, n: 2, width: 1, S: 3, calls: 1, victim: -1, hostile: 1},
	} {
		e := newExplorer(cfg)
		e.explore(e.initial())
		if e.err == nil || !strings.Contains(e.err.Error(), "started twice") {
			t.Errorf("%v: %v after %d states, want a call started twice", cfg, e.err, e.states)
			continue
		}
		t.Logf("%v: %v after %d states:\n%s", cfg, e.err, e.states, joinLines(e.path))
	}
}
