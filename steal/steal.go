package steal

import (
	"bytes"
	"fmt"
	"iter"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/spin"
)

// Ring is a submit ring over one mapping: the host's Producer and the consumers'
// Consumers are views of it.
type Ring struct {
	cfg    Config
	b      []byte
	submit fastpath.Ring
	g      geom
}

// New formats mem (zeroed, 64-byte aligned, at least Size(cfg) bytes) as a submit ring.
// More than MaxConsumers consumers gives an error wrapping ErrTooManyConsumers.
func New(mem []byte, cfg Config) (*Ring, error) {
	cfg = cfg.withDefaults()
	total, err := Size(cfg)
	if err != nil {
		return nil, err
	}
	if len(mem) < total {
		return nil, fmt.Errorf("%w: %d bytes, the ring needs %d", ErrLayout, len(mem), total)
	}
	r, err := view(mem[:total], cfg)
	if err != nil {
		return nil, err
	}
	writeHeader(mem, cfg, total)
	// Every consumer starts live (LIVE is read under Dekker only).
	m := newMem(r.b, r.submit, &r.g)
	m.store(idLive, uint64(1)<<cfg.Consumers-1)
	return r, nil
}

// Open attaches to a submit ring New formatted, possibly in another process. The control
// block is validated; a bad one gives an error wrapping ErrLayout.
func Open(mem []byte) (*Ring, error) {
	h, err := readHeader(mem)
	if err != nil {
		return nil, err
	}
	return view(mem[:h.total], h.cfg)
}

// OpenConfig attaches to a submit ring New formatted with cfg, trusting cfg rather than the
// mapping's control block, which every consumer can write: a lane that learns the ring's
// shape from the host (its boot record) starts whatever a peer wrote there. mem must be
// 64-byte aligned and hold Size(cfg) bytes.
func OpenConfig(mem []byte, cfg Config) (*Ring, error) {
	cfg = cfg.withDefaults()
	total, err := Size(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	if len(mem) < total || uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%line != 0 {
		return nil, fmt.Errorf("%w: %d bytes or misaligned, the ring needs %d", ErrLayout, len(mem), total)
	}
	return view(mem[:total], cfg)
}

func view(b []byte, cfg Config) (*Ring, error) {
	off := offRing(cfg.Consumers)
	sub, err := fastpath.RingOver(b[off:], cfg.Inline, cfg.Arena)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	return &Ring{cfg: cfg, b: b, submit: sub, g: geomOf(cfg)}, nil
}

// Config returns the ring's configuration, defaults filled in.
func (r *Ring) Config() Config { return r.cfg }

// Bytes returns the mapping.
func (r *Ring) Bytes() []byte { return r.b }

// Submit returns the fastpath ring the calls travel in: slot headers and payloads.
func (r *Ring) Submit() fastpath.Ring { return r.submit }

func namedLog(l *zap.Logger) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return l.Named(logging.Steal)
}

// Producer is the host's side: it publishes calls and recovers dead consumers. It is not
// safe for concurrent use; there is one per ring.
type Producer struct {
	r   *Ring
	fp  *fastpath.Producer
	m   mem
	h   host
	rec recoverer
	log *zap.Logger
	// ctl is the control block as New wrote it: CheckHeader compares the mapping with it.
	ctl [offHead]byte
	// granted counts, per consumer, the calls the host granted it and has not seen settled
	// (AddGranted): Held reports them in grant mode. Read by Held without the producer.
	granted [MaxConsumers]atomic.Int32
	// ungranted mirrors the count of held calls for Waiting, which anyone may call.
	ungranted atomic.Int32
	// detached is set, under detachMu, once the mapping may be unmapped (Detach): the
	// readers for statistics and diagnostics (Held, Journal) read it no more.
	detachMu sync.RWMutex
	detached bool
}

// Detach is called before the mapping is unmapped: Held and Journal read it no more (they
// may be called at any time, after the pool closed too).
func (p *Producer) Detach() {
	p.detachMu.Lock()
	p.detached = true
	p.detachMu.Unlock()
}

// Producer returns the host side of r. log is knit's root logger (nil: no logging); the
// producer logs under the steal namespace.
func (r *Ring) Producer(log *zap.Logger) *Producer {
	p := &Producer{r: r, fp: r.submit.Producer(), m: newMem(r.b, r.submit, &r.g), log: namedLog(log)}
	p.h.h = uint32(p.m.load(idH))
	p.h.tail = p.m.load(idTail)
	p.h.stored = p.h.tail
	p.h.live = uint32(p.m.load(idLive))
	copy(p.ctl[:], r.b[:offHead])
	return p
}

// RequireGrants makes the ring run in grant mode, before anything is published: consumers
// claim as before, but run nothing they claimed until the host has granted it (Grant), and
// the host grants each call once, checked against its own record of what it published
// where — never against a word of the mapping, which any consumer can write. A consumer
// that writes the shared words (a broken or hostile lane) can then make claims fail, or
// calls wait until the host notices (Check), but never make a call run twice. Pools of
// process lanes use it; goroutine lanes share the host's memory anyway.
func (p *Producer) RequireGrants() { p.h.grants = true }

// Grant checks a consumer's claim of the call published as seq in slot (as its notice names
// them) and, if the slot still holds that call and nobody was granted it, grants it: it is
// no longer the ring's, and the slot is free for the next call once the claimant has
// retired it. False: the host does not grant it (it was granted or revoked already, or the
// claim names a call that is not there: the ring's words were rewritten).
func (p *Producer) Grant(slot int, seq uint64) bool { return p.take(slot, seq) }

func (p *Producer) take(slot int, seq uint64) bool {
	if !p.h.take(&p.r.g, slot, seq) {
		return false
	}
	p.ungranted.Store(int32(bits.OnesCount32(p.h.held)))
	return true
}

// Revoke takes back the call published as seq in slot if the ring still holds it ungranted
// (a dead consumer's journal names it, or the ring is given up): it will not be granted,
// and the caller dispatches it again. It reports whether the ring held it.
func (p *Producer) Revoke(slot int, seq uint64) bool { return p.take(slot, seq) }

// RevokeAll takes back every call the ring holds ungranted (the ring is given up).
func (p *Producer) RevokeAll() []Call {
	var out []Call
	for s := range Slots {
		if p.h.held&(1<<s) != 0 {
			out = append(out, Call{Slot: s, Seq: p.h.seqOf[s]})
		}
	}
	p.h.held = 0
	p.ungranted.Store(0)
	return out
}

// Ungranted is how many published calls the host holds ungranted (grant mode).
func (p *Producer) Ungranted() int { return int(p.ungranted.Load()) }

// AddGranted adds d to consumer c's count of calls granted and not settled, which Held
// reports in grant mode.
func (p *Producer) AddGranted(c, d int) {
	if c >= 0 && c < len(p.granted) {
		p.granted[c].Add(int32(d))
	}
}

// Check audits the mapping against the host's own record, in grant mode (see Anomaly): the
// control block and every word the host alone writes must be as it wrote them, and the
// words the consumers write must hold what a claim can write.
func (p *Producer) Check() Anomaly {
	if err := p.CheckHeader(); err != nil {
		return Anomaly{Err: err}
	}
	return p.h.check(&p.m, &p.r.g)
}

// CheckHeader compares the control block with what New wrote: a lane that opens the ring
// validates it, so a rewritten one would keep every new lane from starting.
func (p *Producer) CheckHeader() error {
	if !bytes.Equal(p.r.b[:offHead], p.ctl[:]) {
		return fmt.Errorf("%w: the control block was rewritten", ErrLayout)
	}
	return nil
}

// Reserve hands out a free slot (fastpath.Producer.ReserveAny: consumers retire slots in any
// order); ok is false when all 32 are in flight. In grant mode a slot whose call the host
// has not granted yet is not free, whatever the consumer word says (its claimant retired
// it before its notice reached the host, or a lane rewrote the word).
func (p *Producer) Reserve() (slot int, ok bool) {
	slot, ok = p.fp.ReserveAny()
	if !ok || p.h.held&(1<<slot) == 0 {
		return slot, ok
	}
	var skipped uint32
	for ok && p.h.held&(1<<slot) != 0 {
		skipped |= 1 << slot
		slot, ok = p.fp.ReserveAny()
	}
	for s := range Slots {
		if skipped&(1<<s) != 0 {
			p.fp.Release(s)
		}
	}
	return slot, ok
}

// Put places an n-byte payload for slot (fastpath.Producer.Put).
func (p *Producer) Put(slot, n int) ([]byte, error) { return p.fp.Put(slot, n) }

// Slot returns slot i for writing its header. Stage writes the sequence number.
func (p *Producer) Slot(i int) fastpath.Slot { return p.fp.Slot(i) }

// Release gives back a reserved slot that will not be published.
func (p *Producer) Release(slot int) { p.fp.Release(slot) }

// Stage marks slot, whose header and payload are written, ready for the next Flush, and
// returns the sequence number it gave the call: what a consumer's claim and a Recovery name
// it by.
func (p *Producer) Stage(slot int) uint64 {
	seq := p.h.lastSeq + 1
	p.h.stage(&p.m, &p.r.g, slot, seq)
	p.fp.Stage(slot)
	return seq
}

// Flush publishes every staged call: one store of the producer word and, under Ticket, one
// store of the tail. It reports whether anything was staged.
func (p *Producer) Flush() bool {
	if !p.fp.Flush() {
		return false
	}
	p.h.flush(&p.m, &p.r.g)
	if p.h.grants {
		p.ungranted.Store(int32(bits.OnesCount32(p.h.held)))
	}
	return true
}

// Drained reports whether every published call has been claimed and its slot retired.
func (p *Producer) Drained() bool { return p.fp.Drained() }

// Recover is called by the host once consumer c is dead for sure (its process reaped, its
// goroutine returned): it returns exactly the calls c held, retires the slots c had not
// retired yet, and releases c's claim handshake (its WANT, its LIVE bit, a ticket intent), so
// that the other consumers neither wait for c nor lose a call. A journal that breaks the
// protocol gives an error wrapping ErrCorrupt; the handshake is released all the same, but
// the calls c held are unknown. Recovering twice returns nothing the second time.
// Call Activate before a new consumer with id c starts claiming.
func (p *Producer) Recover(c int) (Recovery, error) {
	var out Recovery
	if c < 0 || c >= p.r.g.n {
		return out, fmt.Errorf("%w: consumer %d of %d", ErrConfig, c, p.r.g.n)
	}
	p.rec.begin(c)
	for !p.rec.step(&p.m, &p.r.g, &p.h) {
	}
	p.rec.result(&out)
	if p.rec.err != nil {
		p.log.Warn("claim journal of a dead consumer is corrupt", zap.Int("consumer", c), zap.Error(p.rec.err))
		return out, p.rec.err
	}
	if ce := logging.Debug(p.log, "journal recovered"); ce != nil {
		ce.Write(zap.Int("consumer", c), zap.Int("fresh", len(out.Fresh)), zap.Int("started", len(out.Started)),
			zap.Uint32("retired_slots", out.Retired))
	}
	return out, nil
}

// Activate lets a new consumer with id c (a restarted lane) claim again after Recover(c).
func (p *Producer) Activate(c int) {
	if c < 0 || c >= p.r.g.n {
		return
	}
	p.m.store(p.r.g.want(c), 0)
	p.m.store(p.r.g.journal(c), 0)
	p.h.live |= 1 << c
	p.m.store(idLive, uint64(p.h.live))
}

// spinLimit is how many times a Dekker claim re-checks a junior's WANT before it withdraws
// and lets the consumer poll again.
const spinLimit = 256

// Consumer is one consumer's side. It is not safe for concurrent use.
//
// A consumer claims only when it holds nothing unfinished, so the order a lane follows is:
// publish and flush its results, Finish each call, then Claim. Claim returns a batch whose
// slots the consumer holds: read (copy or decode) their payloads, then Release them (Start
// releases them if the consumer has not). Start each call before running it and Finish it
// after its result is on the return ring: the journal then tells the host, after a death,
// which calls never started.
type Consumer struct {
	r     *Ring
	id    int
	m     mem
	cl    claimer
	n     int
	held  bool // the batch's slots are not released yet
	order [maxBatch]uint8
	state [maxBatch]uint8
	log   *zap.Logger
	// fruitless counts claims in a row that took nothing while calls waited (Contended).
	fruitless int
}

// Consumer returns consumer id's side (0 ≤ id < Consumers). log is knit's root logger (nil:
// no logging).
func (r *Ring) Consumer(id int, log *zap.Logger) (*Consumer, error) {
	if id < 0 || id >= r.cfg.Consumers {
		return nil, fmt.Errorf("%w: consumer %d of %d", ErrConfig, id, r.cfg.Consumers)
	}
	return &Consumer{r: r, id: id, m: newMem(r.b, r.submit, &r.g), log: namedLog(log)}, nil
}

// Holding reports how many claimed calls the consumer has not finished.
func (c *Consumer) Holding() int {
	k := 0
	for i := range c.n {
		if c.state[i] != entryFinished {
			k++
		}
	}
	return k
}

// Claim claims a batch of up to Width calls and returns its size (0: nothing to claim, or
// the discipline's handshake yielded to a peer; poll again later). An idle poll costs two
// loads. It gives ErrHolding while the previous batch has unfinished calls.
func (c *Consumer) Claim() (int, error) {
	if c.Holding() != 0 {
		return 0, ErrHolding
	}
	c.n = 0
	g := &c.r.g
	c.cl.begin(g)
	spins := 0
	for {
		switch c.cl.step(&c.m, g, c.id, spins >= spinLimit) {
		case running:
		case blocked:
			spins++
			if spins%16 == 0 {
				runtime.Gosched()
			} else {
				spin.Pause()
			}
		case none:
			if c.Pending() {
				c.fruitless++
			} else {
				c.fruitless = 0
			}
			return 0, nil
		case exhausted:
			return 0, ErrExhausted
		case committed:
			c.n = int(c.cl.n)
			c.held = true
			c.fruitless = 0
			for k := range c.n {
				c.order[k] = uint8(k)
				c.state[k] = entryClaimed
			}
			if g.disc == Dekker { // journal order is slot order: run in publication order
				c.sortBySeq()
			}
			return c.n, nil
		default: // released cannot come before committed
			return 0, nil
		}
	}
}

// sortBySeq orders the batch by sequence number (insertion sort: at most 32 calls).
func (c *Consumer) sortBySeq() {
	for i := 1; i < c.n; i++ {
		for j := i; j > 0 && c.cl.seqs[c.order[j]] < c.cl.seqs[c.order[j-1]]; j-- {
			c.order[j], c.order[j-1] = c.order[j-1], c.order[j]
		}
	}
}

// Call returns the k-th call of the batch, in publication order.
func (c *Consumer) Call(k int) Call {
	e := c.order[k]
	return Call{Slot: int(c.cl.slots[e]), Seq: c.cl.seqs[e]}
}

// Slot returns the k-th call's slot header. Valid until Release.
func (c *Consumer) Slot(k int) fastpath.Slot { return c.r.submit.Slot(int(c.cl.slots[c.order[k]])) }

// Payload returns the k-th call's payload bytes in the mapping (validated like
// fastpath.Consumer.Payload). Valid until Release: copy or decode them first.
func (c *Consumer) Payload(k int) ([]byte, error) {
	return c.r.submit.Payload(int(c.cl.slots[c.order[k]]))
}

// Release gives the batch's slots back to the host (and under Dekker ends the handshake).
// Call it once the payloads are read.
func (c *Consumer) Release() {
	if !c.held {
		return
	}
	c.held = false
	for c.cl.step(&c.m, &c.r.g, c.id, false) == running {
	}
	// Logged once the handshake is over: a slow logger must not hold a region's WANT.
	if ce := logging.Debug(c.log, "claimed"); ce != nil {
		ce.Write(zap.Int("consumer", c.id), zap.Int("batch", c.n), zap.Stringer("discipline", c.r.g.disc),
			zap.Uint64("first_seq", c.cl.seqs[c.order[0]]))
	}
}

// contendedAfter is how many claims in a row must find calls waiting and take none before a
// consumer counts as contended.
const contendedAfter = 64

// Contended reports whether the consumer's last contendedAfter claims found calls waiting
// and took none: under Dekker a peer holds their region's handshake and has not let go
// through all those retries (it is descheduled, stopped or dead). A lane then stops retrying
// at once and polls at a slow pace until the peer lets go or the host recovers it, rather
// than burn a core. A claim that takes calls, or finds none waiting, ends it.
func (c *Consumer) Contended() bool { return c.fruitless >= contendedAfter }

// Start journals that the k-th call is about to run; it releases the batch first if the
// consumer has not.
func (c *Consumer) Start(k int) { c.mark(k, entryStarted) }

// Finish journals that the k-th call's result is on the return ring.
func (c *Consumer) Finish(k int) { c.mark(k, entryFinished) }

func (c *Consumer) mark(k, st int) {
	c.Release()
	e := int(c.order[k])
	c.state[e] = uint8(st)
	markEntry(&c.m, &c.r.g, c.id, e, c.cl.seqs[e], int(c.cl.slots[e]), st)
}

// Pending reports whether calls may be waiting to be claimed: two loads, no write, for a
// lane's park check. Under Dekker it also reports calls claimed but not yet released, so a
// lane may find nothing when it claims.
func (c *Consumer) Pending() bool {
	if c.r.g.disc == Ticket {
		return c.m.load(idTail) != headTicket(c.m.load(idHead))
	}
	return c.m.load(idH) != c.m.load(idW)
}

// Holder names the consumer whose journal shows the call with sequence number seq started
// and not finished (ok false: none does). It reads words the consumers write: a hint for
// finding the lane that runs an overdue call, never what recovery relies on. (In grant
// mode the host knows who holds each call, and does not ask the journals.)
func (p *Producer) Holder(seq uint64) (consumer int, ok bool) {
	for c := range p.r.g.n {
		for e := range p.committed(c) {
			if e>>8 == seq && int(e&3) == entryStarted {
				return c, true
			}
		}
	}
	return 0, false
}

// Held is how many calls consumer c's journal shows claimed and not finished (0 for an id
// out of range), plus in grant mode the calls granted to it and not settled. It reads words
// the consumer writes: a figure for statistics, never what recovery relies on.
func (p *Producer) Held(c int) int {
	if c < 0 || c >= p.r.g.n {
		return 0
	}
	n := int(p.granted[c].Load())
	p.detachMu.RLock()
	defer p.detachMu.RUnlock()
	if p.detached {
		return n
	}
	for e := range p.committed(c) {
		if st := int(e & 3); st == entryClaimed || st == entryStarted {
			n++
		}
	}
	return n
}

// committed yields the entry words of consumer c's journal while it is committed (a batch
// claimed and journaled), at most the journal's capacity whatever its length word says.
func (p *Producer) committed(c int) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		g := &p.r.g
		j := p.m.load(g.journal(c))
		if j&3 != phaseCommitted {
			return
		}
		for k := range min(int(j>>2)&63, g.E) {
			if !yield(p.m.load(g.entry(c, k))) {
				return
			}
		}
	}
}

// Waiting is how many published calls no consumer has claimed yet (under Dekker, also
// those claimed but not yet released): how many idle consumers the host should make sure
// of. It reads shared words only.
//
// In grant mode it is at most the calls the host holds ungranted: a lane that rewrites the
// words can make it low (calls then wait until the host's audit notices), never high.
func (p *Producer) Waiting() int {
	n := 0
	if p.r.g.disc == Ticket {
		// The head first: it never passes the tail, which only grows, so the difference
		// cannot wrap (read the other way round, a claim between the loads made it huge).
		head := headTicket(p.m.load(idHead))
		tail := p.m.load(idTail)
		if tail < head { // a head no valid claim wrote
			return 0
		}
		n = int(min(tail-head, Slots))
	} else {
		n = bits.OnesCount64(p.m.load(idH) ^ p.m.load(idW))
	}
	if p.h.grants {
		n = min(n, int(p.ungranted.Load()))
	}
	return n
}

// Journal returns consumer c's journal words (its state and its entries) and its WANT word,
// for diagnostics.
func (p *Producer) Journal(c int) (state uint64, entries []uint64, want uint64) {
	g := &p.r.g
	p.detachMu.RLock()
	defer p.detachMu.RUnlock()
	if c < 0 || c >= g.n || p.detached {
		return 0, nil, 0
	}
	want = p.m.load(g.want(c))
	for k := range g.E {
		entries = append(entries, p.m.load(g.entry(c, k)))
	}
	return p.m.load(g.journal(c)), entries, want
}
