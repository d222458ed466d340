package steal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// Discipline is a claim discipline.
type Discipline uint32

// The claim disciplines.
const (
	// Ticket: a 64-bit claim head advanced by CAS in batches, a publication tail the host
	// stores once per burst, and an order ring mapping tickets to slots. An idle poll is
	// two loads. The default (as in the reference) until measurements say otherwise.
	Ticket Discipline = 1
	// Dekker: the slots are split into regions of Width lanes; a claimant raises its WANT
	// word, defers to seniors (lower ids), waits out juniors, takes one snapshot of its
	// region and retires it before lowering WANT.
	Dekker Discipline = 2
)

func (d Discipline) String() string {
	switch d {
	case Ticket:
		return "ticket"
	case Dekker:
		return "dekker"
	}
	return fmt.Sprintf("Discipline(%d)", uint32(d))
}

// Limits.
const (
	Slots        = fastpath.Slots // slots in the submit ring
	MaxConsumers = Slots - 1      // 31: Dekker needs a region per consumer plus a spare
	maxBatch     = Slots
	// MaxTicket bounds the ticket head: 2^53 tickets, decades at any claim rate.
	MaxTicket = 1<<53 - 1
)

var (
	// ErrTooManyConsumers: more consumers than one submit ring can serve. A pool falls back
	// to private lanes.
	ErrTooManyConsumers = errors.New("knit/steal: more than 31 consumers")
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("knit/steal: invalid configuration")
	// ErrLayout reports a mapping that does not hold a valid submit ring.
	ErrLayout = errors.New("knit/steal: invalid submit mapping")
	// ErrCorrupt reports a claim journal that breaks the protocol: the consumer that wrote it
	// is broken or hostile.
	ErrCorrupt = errors.New("knit/steal: corrupt claim journal")
	// ErrHolding: Claim was called while the consumer still holds calls it has not
	// finished. A consumer claims only when idle.
	ErrHolding = errors.New("knit/steal: consumer still holds unfinished calls")
	// ErrExhausted: the 64-bit ticket head reached MaxTicket.
	ErrExhausted = errors.New("knit/steal: ticket sequence exhausted")
)

// Config shapes a submit ring.
type Config struct {
	Consumers  int        // 1..31
	Discipline Discipline // zero: Ticket
	// Width is the batch width: the most calls one claim takes. Dekker: the region width, a
	// power of two with 32/Width ≥ Consumers+1. Ticket: 1..32. Zero: DefaultWidth.
	Width int
	// Half makes a claim take at most half of the calls waiting (under Dekker, in its
	// region), rounded up, so that a call does not wait in one lane's batch while another
	// lane is idle.
	Half   bool
	Inline int // inline payload bytes per slot (zero: fastpath.DefaultInline)
	Arena  int // payload arena bytes (zero: fastpath.DefaultArena)
}

// DefaultWidth is the largest power of two g with 32/g ≥ consumers+1 (one spare region for
// a late claimant), or 0 when consumers is out of range.
func DefaultWidth(consumers int) int {
	if consumers < 1 || consumers > MaxConsumers {
		return 0
	}
	for g := Slots; g >= 1; g /= 2 {
		if Slots/g >= consumers+1 {
			return g
		}
	}
	return 0
}

func (c Config) withDefaults() Config {
	if c.Discipline == 0 {
		c.Discipline = Ticket
	}
	if c.Width == 0 {
		c.Width = DefaultWidth(c.Consumers)
	}
	if c.Inline == 0 {
		c.Inline = fastpath.DefaultInline
	}
	if c.Arena == 0 {
		c.Arena = fastpath.DefaultArena
	}
	return c
}

func (c Config) check() error {
	if c.Consumers > MaxConsumers {
		return fmt.Errorf("%w: %d consumers (at most %d share a submit ring)", ErrTooManyConsumers, c.Consumers, MaxConsumers)
	}
	if c.Consumers < 1 {
		return fmt.Errorf("%w: %d consumers", ErrConfig, c.Consumers)
	}
	switch c.Discipline {
	case Ticket:
		if c.Width < 1 || c.Width > Slots {
			return fmt.Errorf("%w: ticket batch width %d (want 1..%d)", ErrConfig, c.Width, Slots)
		}
	case Dekker:
		if c.Width < 1 || c.Width&(c.Width-1) != 0 || Slots/c.Width < c.Consumers+1 {
			return fmt.Errorf("%w: dekker region width %d for %d consumers (want a power of two g with 32/g ≥ %d)",
				ErrConfig, c.Width, c.Consumers, c.Consumers+1)
		}
	default:
		return fmt.Errorf("%w: discipline %v", ErrConfig, c.Discipline)
	}
	if c.Inline < line || c.Inline > fastpath.MaxInline || c.Inline%line != 0 ||
		c.Arena < 0 || c.Arena > fastpath.MaxArena || c.Arena%line != 0 {
		return fmt.Errorf("%w: inline size %d, arena %d (want multiples of 64 up to %d and %d)",
			ErrConfig, c.Inline, c.Arena, fastpath.MaxInline, fastpath.MaxArena)
	}
	return nil
}

// Mapping layout. Every word the claim protocol touches sits on its own cache line, except
// the order and stamp rings (written once per ticket) and the journal entries (written only
// by their consumer).
const (
	line       = 64
	magic      = 0x5453_4e4b // "KNST"
	version    = 1
	offMagic   = 0
	offVersion = 4
	offDisc    = 8
	offCons    = 12
	offWidth   = 16
	offInline  = 20
	offArena   = 24
	offTotal   = 32 // u64
	offHead    = 256
	offTail    = offHead + line
	offLive    = offTail + line
	offOrder   = offLive + line    // Slots × u32
	offStamp   = offOrder + 2*line // one u64 per consumer
	offWant    = offStamp + 4*line // Consumers lines
	journalLen = line + Slots*8    // state word line, then the entries
)

func align(n int) int { return (n + line - 1) &^ (line - 1) }

func offJournal(consumers int) int { return offWant + consumers*line }
func offRing(consumers int) int    { return align(offJournal(consumers) + consumers*journalLen) }

// Size returns the bytes a mapping for cfg needs, or the configuration error.
func Size(cfg Config) (int, error) {
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return 0, err
	}
	return offRing(cfg.Consumers) + fastpath.RingBytes(cfg.Inline, cfg.Arena), nil
}

// geom is what the step machines need to know about a ring: sizes and discipline. The
// model check uses small rings (S < 32); the real one has S = 32 and E = 32.
type geom struct {
	disc  Discipline
	S     int // slots
	n     int // consumers
	width int // batch width (ticket) or region width (dekker)
	E     int // journal entries per consumer
	half  bool
}

// Word ids: the step machines address shared words by id, so that the model check can run
// them over a plain array and the real code over the mapping.
const (
	idH     = iota // the ring's producer word (host)
	idW            // the ring's consumer word (consumers flip their bits to retire)
	idHead         // ticket claim head
	idTail         // ticket publication tail
	idLive         // dekker: host-owned mask of live consumers
	idOrder        // S order cells, S slot sequence numbers, then n stamps, n WANT words, n journal states, n×E entries
)

func (g *geom) order(i int) int         { return idOrder + i }
func (g *geom) seq(i int) int           { return idOrder + g.S + i }
func (g *geom) stamp(c int) int         { return idOrder + 2*g.S + c }
func (g *geom) want(c int) int          { return idOrder + 2*g.S + g.n + c }
func (g *geom) journal(c int) int       { return idOrder + 2*g.S + 2*g.n + c }
func (g *geom) entry(c, k int) int      { return idOrder + 2*g.S + 3*g.n + c*g.E + k }
func (g *geom) words() int              { return idOrder + 2*g.S + 3*g.n + g.n*g.E }
func (g *geom) full() uint32            { return uint32(1<<g.S - 1) }
func (g *geom) regions() int            { return g.S / g.width }
func (g *geom) regionMask(r int) uint32 { return uint32(1<<g.width-1) << (r * g.width) }

// mem is the shared memory the step machines see: a plain array in the model check
// (single-threaded, each step atomic by construction), the mapping's atomic words otherwise.
type mem struct {
	model []uint64
	b     []byte
	ring  fastpath.Ring
	h, w  *atomic.Uint32 // the ring's producer and consumer words
	off   []uint32       // per word id: byte offset << 3 | kind
	// The words themselves, resolved once: a claim touches a dozen, and each shm view
	// costs a bounds check and a conversion.
	w32 []*atomic.Uint32
	w64 []*atomic.Uint64
}

const (
	kind32 = iota
	kind64
	kindSeq // the sequence number in a slot header: plain, ordered by the ring words
	kindH   // the ring's producer word
	kindW   // the ring's consumer word
)

func newMem(b []byte, ring fastpath.Ring, g *geom) mem {
	m := mem{b: b, ring: ring, off: make([]uint32, g.words())}
	m.h, m.w = ring.Words()
	m.off[idH] = kindH
	m.off[idW] = kindW
	m.off[idHead] = offHead<<3 | kind64
	m.off[idTail] = offTail<<3 | kind64
	m.off[idLive] = offLive<<3 | kind32
	for i := range g.S {
		m.off[g.order(i)] = uint32(offOrder+4*i)<<3 | kind32
		m.off[g.seq(i)] = uint32(i)<<3 | kindSeq
	}
	jo := offJournal(g.n)
	for c := range g.n {
		m.off[g.stamp(c)] = uint32(offStamp+8*c)<<3 | kind64
		m.off[g.want(c)] = uint32(offWant+c*line)<<3 | kind32
		m.off[g.journal(c)] = uint32(jo+c*journalLen)<<3 | kind64
		for k := range g.E {
			m.off[g.entry(c, k)] = uint32(jo+c*journalLen+line+8*k)<<3 | kind64
		}
	}
	m.w32, m.w64 = make([]*atomic.Uint32, len(m.off)), make([]*atomic.Uint64, len(m.off))
	for id, e := range m.off {
		switch e & 7 {
		case kind32:
			m.w32[id] = shm.U32(b, int(e>>3))
		case kind64:
			m.w64[id] = shm.U64(b, int(e>>3))
		}
	}
	return m
}

func (m *mem) load(id int) uint64 {
	if m.model != nil {
		return m.model[id]
	}
	e := m.off[id]
	switch e & 7 {
	case kindH:
		return uint64(m.h.Load())
	case kindW:
		return uint64(m.w.Load())
	case kind32:
		return uint64(m.w32[id].Load())
	case kind64:
		return m.w64[id].Load()
	}
	return m.ring.Slot(int(e >> 3)).Seq()
}

func (m *mem) store(id int, v uint64) {
	if m.model != nil {
		m.model[id] = v
		return
	}
	e := m.off[id]
	switch e & 7 {
	case kindH:
		m.h.Swap(uint32(v))
	case kindW:
		m.w.Swap(uint32(v))
	case kind32:
		// A Swap, not a Store: a WANT raise must not let the following loads pass it
		// (StoreLoad), and the race runtime implements atomic stores as release stores.
		m.w32[id].Swap(uint32(v))
	case kind64:
		m.w64[id].Store(v)
	default:
		m.ring.Slot(int(e >> 3)).SetSeq(v)
	}
}

// cas works on 64-bit words only (head and stamps).
func (m *mem) cas(id int, old, new uint64) bool {
	if m.model != nil {
		if m.model[id] != old {
			return false
		}
		m.model[id] = new
		return true
	}
	return m.w64[id].CompareAndSwap(old, new)
}

// flip XORs v into a 32-bit word (the consumer word): several consumers retire disjoint
// bits, and XOR of disjoint bits commutes.
func (m *mem) flip(id int, v uint32) {
	if m.model != nil {
		m.model[id] ^= uint64(v)
		return
	}
	w := m.w // the only word consumers flip
	for {
		old := w.Load()
		if w.CompareAndSwap(old, old^v) {
			return
		}
	}
}

// header is the control block of a mapping.
type header struct {
	cfg   Config
	total int
}

func writeHeader(b []byte, cfg Config, total int) {
	le := binary.LittleEndian
	le.PutUint32(b[offVersion:], version)
	disc := uint32(cfg.Discipline)
	if cfg.Half {
		disc |= halfFlag
	}
	le.PutUint32(b[offDisc:], disc)
	le.PutUint32(b[offCons:], uint32(cfg.Consumers))
	le.PutUint32(b[offWidth:], uint32(cfg.Width))
	le.PutUint32(b[offInline:], uint32(cfg.Inline))
	le.PutUint32(b[offArena:], uint32(cfg.Arena))
	le.PutUint64(b[offTotal:], uint64(total))
	shm.U32(b, offMagic).Store(magic) // last: a reader never sees a half-written header
}

// halfFlag marks Config.Half in the control block's discipline word.
const halfFlag = 1 << 16

// readHeader validates a mapping's control block; every field is hostile.
func readHeader(b []byte) (header, error) {
	if len(b) < offHead || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%line != 0 {
		return header{}, fmt.Errorf("%w: %d bytes or misaligned", ErrLayout, len(b))
	}
	le := binary.LittleEndian
	if m := shm.U32(b, offMagic).Load(); m != magic {
		return header{}, fmt.Errorf("%w: bad magic %#x", ErrLayout, m)
	}
	if v := le.Uint32(b[offVersion:]); v != version {
		return header{}, fmt.Errorf("%w: version %d, want %d", ErrLayout, v, version)
	}
	disc := le.Uint32(b[offDisc:])
	cfg := Config{
		Discipline: Discipline(disc &^ halfFlag),
		Half:       disc&halfFlag != 0,
		Consumers:  int(min(le.Uint32(b[offCons:]), 1<<16)),
		Width:      int(min(le.Uint32(b[offWidth:]), 1<<16)),
		Inline:     int(min(le.Uint32(b[offInline:]), fastpath.MaxInline+1)),
		Arena:      int(min(le.Uint32(b[offArena:]), fastpath.MaxArena+1)),
	}
	if err := cfg.check(); err != nil {
		return header{}, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	total, _ := Size(cfg)
	if t := le.Uint64(b[offTotal:]); t != uint64(total) || total > len(b) {
		return header{}, fmt.Errorf("%w: total size %d, layout needs %d, mapping has %d", ErrLayout, t, total, len(b))
	}
	return header{cfg: cfg, total: total}, nil
}

// geomOf returns the real geometry of a validated config.
func geomOf(cfg Config) geom {
	return geom{disc: cfg.Discipline, S: Slots, n: cfg.Consumers, width: cfg.Width, E: maxBatch, half: cfg.Half}
}

// Word is a named word (or range) of a ring's mapping: what the protocol shares.
type Word struct {
	Name         string
	Offset, Size int
}

// Words lists the ring's shared words by name, with their offsets in the mapping: the
// control block ("control"), "head", "tail", "live", the order cells ("order"), one
// "stamp", "want", "journal" state and "entries" range per consumer, the submit ring's
// producer and consumer words ("H", "W"), and each slot's header ("slot"). For diagnostics,
// and for tests that play a lane writing the mapping.
func (r *Ring) Words() []Word {
	n := r.cfg.Consumers
	out := []Word{{"control", 0, offHead}, {"head", offHead, 8}, {"tail", offTail, 8}, {"live", offLive, 4},
		{"order", offOrder, 4 * Slots}}
	jo := offJournal(n)
	for c := range n {
		out = append(out, Word{fmt.Sprintf("stamp/%d", c), offStamp + 8*c, 8}, Word{fmt.Sprintf("want/%d", c), offWant + c*line, 4},
			Word{fmt.Sprintf("journal/%d", c), jo + c*journalLen, 8}, Word{fmt.Sprintf("entries/%d", c), jo + c*journalLen + line, 8 * Slots})
	}
	ring := offRing(n)
	h, w := r.submit.Words()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(r.b)))
	out = append(out, Word{"H", int(uintptr(unsafe.Pointer(h)) - base), 4}, Word{"W", int(uintptr(unsafe.Pointer(w)) - base), 4})
	stride := fastpath.HeaderBytes + r.cfg.Inline
	slots := ring + fastpath.RingBytes(r.cfg.Inline, 0) - fastpath.Slots*stride
	for i := range Slots {
		out = append(out, Word{fmt.Sprintf("slot/%d", i), slots + i*stride, fastpath.HeaderBytes})
	}
	return out
}
