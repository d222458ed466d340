package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/bits"
	"sync/atomic"

	"github.com/knitgo/knit/internal/shm"
)

// Payload tags: where a slot's payload lives.
const (
	TagNone   uint32 = iota // no payload
	TagHeader               // up to HeaderData bytes in the header itself
	TagInline               // up to the inline size in the slot
	TagArena                // in the producer's arena
)

var _ = [1]struct{}{}[TagNone] // Slot.empty writes TagNone as zeros

// Slot header offsets.
const (
	hFn    = 0
	hCall  = 4
	hTag   = 8
	hFlags = 12
	hOff   = 16
	hLen   = 20
	hAbort = 24
	hGen   = 28
	hSeq   = 32
	hDL    = 40 // deadline: Unix nanoseconds, 0 for none
	hData  = 48
)

var (
	// ErrCorrupt reports a header or payload that breaks the protocol. The peer that wrote
	// it must be treated as broken.
	ErrCorrupt = errors.New("knit/fastpath: corrupt slot")
	// ErrArenaFull is backpressure: the value fits the arena but not now. Retry after the
	// consumer retires slots.
	ErrArenaFull = errors.New("knit/fastpath: arena full")
	// ErrTooLarge reports a value that can never fit this ring.
	ErrTooLarge = errors.New("knit/fastpath: payload larger than the arena")
)

// Ring is a view of one direction of a region: 32 slots, a producer word and a consumer
// word on separate cache lines, and the producer's arena. Slot i is in flight when bit i
// differs between the two words.
type Ring struct {
	ctrl, slots, arena []byte
	inline             int
}

func (r Ring) prodWord() *atomic.Uint32 { return shm.U32(r.ctrl, 0) }
func (r Ring) consWord() *atomic.Uint32 { return shm.U32(r.ctrl, line) }

// roomWord is the producer's mark that it waits for room (WantRoom). It shares the consumer
// word's cache line, which the consumer writes on every retire anyway: the consumer's load of
// it after a retire costs no transfer of a line, and the producer writes it only when it is
// about to park.
func (r Ring) roomWord() *atomic.Uint32 { return shm.U32(r.ctrl, line+32) }

// Completion returns the ring's completion doorbell (meaningful on the return ring): the one
// a host's reaper sleeps on, through an eventfd.
func (r Ring) Completion() Completion { return Completion{arm: shm.U32(r.ctrl, 2*line)} }

// Direct returns the ring's second completion doorbell, a futex on its own arm word: the one
// a caller waiting alone for its result sleeps on itself, woken by the lane without a
// reaper, a netpoller or a second goroutine between them. The producer signals both.
func (r Ring) Direct() Completion { return Completion{arm: shm.U32(r.ctrl, 3*line)} }

func (r Ring) slot(i int) Slot {
	stride := HeaderBytes + r.inline
	b := r.slots[i*stride : (i+1)*stride : (i+1)*stride]
	return Slot{h: (*[HeaderBytes]byte)(b), b: b}
}

// slotTable is every slot of a ring, sliced once: the producer and the consumer look a slot
// up on every call, several times.
type slotTable [Slots]Slot

func (r Ring) slotTable() *slotTable {
	var t slotTable
	for i := range t {
		t[i] = r.slot(i)
	}
	return &t
}

// Slot is one slot: a 64-byte header then the inline payload area. Its accessors do plain
// reads and writes; the ring words order them. h is the header as an array, so that the
// accessors' constant offsets need no bounds checks.
type Slot struct {
	h *[HeaderBytes]byte
	b []byte
}

func (s Slot) u32(off int) uint32       { return binary.LittleEndian.Uint32(s.h[off : off+4]) }
func (s Slot) put32(off int, v uint32)  { binary.LittleEndian.PutUint32(s.h[off:off+4], v) }
func (s Slot) Fn() uint32               { return s.u32(hFn) }
func (s Slot) Call() uint32             { return s.u32(hCall) }
func (s Slot) Gen() uint32              { return s.u32(hGen) }
func (s Slot) Flags() uint32            { return s.u32(hFlags) }
func (s Slot) Abort() uint32            { return s.u32(hAbort) }
func (s Slot) Seq() uint64              { return binary.LittleEndian.Uint64(s.h[hSeq : hSeq+8]) }
func (s Slot) SetFn(v uint32)           { s.put32(hFn, v) }
func (s Slot) SetCall(call, gen uint32) { s.put32(hCall, call); s.put32(hGen, gen) }
func (s Slot) SetFlags(v uint32)        { s.put32(hFlags, v) }
func (s Slot) SetAbort(v uint32)        { s.put32(hAbort, v) }
func (s Slot) SetSeq(v uint64)          { binary.LittleEndian.PutUint64(s.h[hSeq:hSeq+8], v) }

// Deadline is when the caller stops waiting for the call, in Unix nanoseconds (0: never).
func (s Slot) Deadline() int64 { return int64(binary.LittleEndian.Uint64(s.h[hDL : hDL+8])) }

// SetDeadline stores the call's deadline in Unix nanoseconds (0: none).
func (s Slot) SetDeadline(ns int64) { binary.LittleEndian.PutUint64(s.h[hDL:hDL+8], uint64(ns)) }

// empty marks the slot's payload empty: its tag (TagNone is 0), offset and length zero.
// Two stores, where three put32 calls are too costly for Empty to be inlined.
func (s Slot) empty() {
	*(*[4]byte)(s.h[hTag : hTag+4]) = [4]byte{}
	*(*[8]byte)(s.h[hOff : hOff+8]) = [8]byte{}
}

// Producer is the only writer of a ring's producer word and the owner of its arena. It is
// not safe for concurrent use.
type Producer struct {
	r          Ring
	slots      *slotTable
	prod, cons *atomic.Uint32
	room       *atomic.Uint32
	local      uint32 // the producer word as this side last stored it
	shadow     uint32 // cached consumer word; stale only ever makes a free slot look busy
	reserved   uint32 // slots handed out by Reserve and not yet staged
	staged     bool   // local holds staged slots the producer word does not show yet
	cursor     int    // the next slot to hand out
	ext        [Slots]extent
}

type extent struct{ off, n int }

// Producer returns the producing side of r, starting from the words' current values.
func (r Ring) Producer() *Producer {
	p := &Producer{r: r, slots: r.slotTable(), prod: r.prodWord(), cons: r.consWord(), room: r.roomWord()}
	p.local = p.prod.Load()
	p.shadow = p.cons.Load()
	return p
}

// Reserve hands out the next slot in cyclic order, reloading the consumer word only when
// the cached one shows it busy. Because the consumer takes every pending slot at once and
// walks them from where it stopped, cyclic order makes delivery FIFO. ok is false when the
// ring is full.
func (p *Producer) Reserve() (slot int, ok bool) {
	slot = p.cursor & slotMask // always in range: the mask spares the shift and index their checks
	bit := uint32(1) << slot
	if ((p.local^p.shadow)|p.reserved)&bit != 0 { // in flight or reserved (one test: inlined)
		p.shadow = p.cons.Load()
		if ((p.local^p.shadow)|p.reserved)&bit != 0 {
			return -1, false
		}
	}
	p.cursor = (slot + 1) & slotMask
	p.reserved |= bit
	p.ext[slot] = extent{}
	return slot, true
}

// ReserveAny is Reserve for a ring whose consumers retire slots out of order (a shared
// submit ring, where lanes claim in any order): it hands out the first free slot at or
// after the cursor, so the ring is full only when all 32 slots are taken, not when the one
// at the cursor is.
func (p *Producer) ReserveAny() (slot int, ok bool) {
	busy := (p.local ^ p.shadow) | p.reserved
	if busy&(1<<p.cursor) != 0 {
		p.shadow = p.cons.Load()
		busy = (p.local ^ p.shadow) | p.reserved
	}
	if busy == ^uint32(0) {
		return -1, false
	}
	slot = (bits.TrailingZeros32(bits.RotateLeft32(^busy, -p.cursor)) + p.cursor) & slotMask
	p.cursor = (slot + 1) & slotMask
	p.reserved |= 1 << slot
	p.ext[slot] = extent{}
	return slot, true
}

// slotMask is i % Slots for an i ≥ 0, without the fixups a signed remainder costs (Slots is
// a power of two: the array length below does not compile otherwise).
const slotMask = Slots - 1

var _ [Slots & slotMask]struct{} = [0]struct{}{}

// Slot returns slot i for writing.
func (p *Producer) Slot(i int) Slot { return p.slots[i] }

// Put places an n-byte payload for slot i and returns the bytes to fill: in the header
// (n ≤ HeaderData), inline, or in the arena. ErrArenaFull is backpressure; ErrTooLarge means
// it can never fit.
func (p *Producer) Put(i, n int) ([]byte, error) {
	s := p.slots[i]
	switch {
	case n == 0:
		s.empty()
		return nil, nil
	case n <= HeaderData:
		s.put32(hTag, TagHeader)
		s.put32(hOff, 0)
		s.put32(hLen, uint32(n))
		return s.b[hData : hData+n : hData+n], nil
	case n <= p.r.inline:
		s.put32(hTag, TagInline)
		s.put32(hOff, 0)
		s.put32(hLen, uint32(n))
		return s.b[HeaderBytes : HeaderBytes+n : HeaderBytes+n], nil
	case n > len(p.r.arena):
		return nil, fmt.Errorf("%w: %d bytes, arena holds %d", ErrTooLarge, n, len(p.r.arena))
	}
	off, ok := p.alloc(i, n)
	if !ok {
		return nil, ErrArenaFull
	}
	s.put32(hTag, TagArena)
	s.put32(hOff, uint32(off))
	s.put32(hLen, uint32(n))
	return p.r.arena[off : off+n : off+n], nil
}

// Empty is Put(i, 0): slot i carries no payload (every call and result of a goroutine
// lane: the values stay on the call's record). It is small enough to be inlined, which
// Put is not.
func (p *Producer) Empty(i int) { p.slots[i&slotMask].empty() }

// alloc finds room for n bytes first-fit between the extents of slots still in flight. It
// needs no atomics: only the producer allocates, and an extent is reclaimed once the
// consumer has retired its slot.
func (p *Producer) alloc(slot, n int) (int, bool) {
	need := align(n)
	for range 2 {
		live := (p.local ^ p.shadow) | p.reserved
		var sorted [Slots]extent
		k := 0
		for i := range Slots {
			if live&(1<<i) == 0 {
				p.ext[i] = extent{}
				continue
			}
			e := p.ext[i]
			if e.n == 0 {
				continue
			}
			j := k
			for j > 0 && sorted[j-1].off > e.off {
				sorted[j] = sorted[j-1]
				j--
			}
			sorted[j] = e
			k++
		}
		pos := 0
		for _, e := range sorted[:k] {
			if e.off-pos >= need {
				break
			}
			pos = e.off + e.n
		}
		if pos+need <= len(p.r.arena) {
			p.ext[slot] = extent{off: pos, n: need}
			return pos, true
		}
		p.shadow = p.cons.Load()
	}
	return 0, false
}

// Publish hands slot i to the consumer at once: Stage then Flush.
func (p *Producer) Publish(i int) {
	p.Stage(i)
	p.Flush()
}

// Stage marks slot i, whose header and payload are written, ready to hand over; it reaches
// the consumer with the next Flush, so that a burst of slots costs one store.
func (p *Producer) Stage(i int) {
	p.reserved &^= 1 << i
	p.local ^= 1 << i
	p.staged = true
}

// Flush publishes every staged slot: one atomic store of the producer word, after the plain
// writes of their headers and payloads. It reports whether anything was staged.
//
// The store is a Swap: doorbells rely on a store followed by a load of the other side's
// flag never being reordered (Dekker). amd64 compiles atomic stores to XCHG anyway, but the
// race runtime implements them as release stores, which lets the load pass the store.
func (p *Producer) Flush() bool {
	if !p.staged {
		return false
	}
	p.staged = false
	p.prod.Swap(p.local)
	return true
}

// Release gives back a reserved slot that will not be published, with its arena extent.
// Releasing the slot reserved last makes it the next one handed out again.
func (p *Producer) Release(i int) {
	p.reserved &^= 1 << i
	p.ext[i] = extent{}
	if (i+1)&slotMask == p.cursor {
		p.cursor = i
	}
}

// Unread reports whether the ring holds a published slot its consumer has not retired. It
// reads the two shared words only, so anyone may call it beside the producer and the
// consumer; the answer is a hint (the consumer may be retiring the slot as it is read).
func (r Ring) Unread() bool { return r.prodWord().Load() != r.consWord().Load() }

// Consumed is the consumer's word: it changes whenever the consumer retires slots.
func (r Ring) Consumed() uint32 { return r.consWord().Load() }

// Retired reloads the consumer's retire word and returns it: a producer that found the
// ring full waits for it to change. Reserve and Put see what it loaded.
func (p *Producer) Retired() uint32 {
	p.shadow = p.cons.Load()
	return p.shadow
}

// WantRoom marks the producer as waiting for the consumer to retire slots (its ring or its
// arena is full): a consumer that retires after the mark is set sees it (RoomWanted) and
// rings the producer. A full barrier: the producer then reloads the consumer word
// (Retired), and of the two (its mark and reload, the consumer's retire and look at the
// mark) one always sees the other.
func (p *Producer) WantRoom() { p.room.Swap(1) }

// NoRoomWanted clears the mark once the producer has stopped waiting.
func (p *Producer) NoRoomWanted() { p.room.Store(0) }

// Pending reports how many slots are in flight as far as the producer knows.
func (p *Producer) Pending() int { return bits.OnesCount32(p.local ^ p.shadow) }

// Drained reloads the consumer word and reports whether every published slot is retired.
func (p *Producer) Drained() bool {
	p.shadow = p.cons.Load()
	return p.local == p.shadow
}

// Consumer is the only writer of a ring's consumer word. It is not safe for concurrent use.
type Consumer struct {
	r          Ring
	slots      *slotTable
	prod, cons *atomic.Uint32
	room       *atomic.Uint32
	local      uint32
	cursor     int // where the next batch starts: the slot after the last one taken
}

// Consumer returns the consuming side of r.
func (r Ring) Consumer() *Consumer {
	c := &Consumer{r: r, slots: r.slotTable(), prod: r.prodWord(), cons: r.consWord(), room: r.roomWord()}
	c.local = c.cons.Load()
	return c
}

// Poll returns the mask of slots published and not yet retired: one atomic load.
func (c *Consumer) Poll() uint32 { return c.prod.Load() ^ c.local }

// Slot returns slot i for reading. Every field is hostile.
func (c *Consumer) Slot(i int) Slot { return c.slots[i] }

// Payload returns slot i's payload bytes, in shared memory: copy or decode them before the
// slot is retired. A tag, offset or length outside the layout gives ErrCorrupt.
func (c *Consumer) Payload(i int) ([]byte, error) { return c.r.payload(i, c.slots[i]) }

// payload is slot i's payload bytes (s is the slot), validated against the ring's layout.
// The Ring by pointer: it is ten words, which a call by value copies twice on every result.
func (r *Ring) payload(i int, s Slot) ([]byte, error) {
	tag, off, n := s.u32(hTag), s.u32(hOff), s.u32(hLen)
	switch tag {
	case TagNone:
		if n == 0 {
			return nil, nil
		}
	case TagHeader:
		if n <= HeaderData {
			return s.b[hData : hData+int(n) : hData+int(n)], nil
		}
	case TagInline:
		if n <= uint32(r.inline) {
			return s.b[HeaderBytes : HeaderBytes+int(n) : HeaderBytes+int(n)], nil
		}
	case TagArena:
		end := uint64(off) + uint64(n)
		if off%line == 0 && end <= uint64(len(r.arena)) {
			return r.arena[off:end:end], nil
		}
	}
	return nil, fmt.Errorf("%w: slot %d tag %d offset %d length %d", ErrCorrupt, i, tag, off, n)
}

// Next returns the oldest slot in pending (a mask from Poll, with slots already handled
// cleared), or -1 when pending is empty. Taking slots in this order delivers them FIFO.
func (c *Consumer) Next(pending uint32) int {
	if pending == 0 {
		return -1
	}
	i := (bits.TrailingZeros32(bits.RotateLeft32(pending, -c.cursor)) + c.cursor) & slotMask
	c.cursor = (i + 1) & slotMask
	return i
}

// Take hands each slot of pending (a mask from Poll) to f, oldest first, then retires them
// all with one store: the one loop every consumer of a ring runs. It stops handing slots at
// the first error f returns, which it returns; the slots are retired all the same, as the
// ring broke the protocol and its consumer stops reading it (taking the same slots again
// would hand a result to its caller twice).
func (c *Consumer) Take(pending uint32, f func(slot int) error) error {
	var err error
	for i := range c.Slots(pending) {
		if err = f(i); err != nil {
			break
		}
	}
	c.Retire(pending)
	return err
}

// Slots yields each slot of pending (a mask from Poll), oldest first; the caller then
// retires them all (Retire), whatever it did with them, as Take does. It is Take's loop as
// an iterator, which the compiler inlines into a hot caller instead of calling back per
// slot.
func (c *Consumer) Slots(pending uint32) iter.Seq[int] {
	return func(yield func(int) bool) {
		for m := pending; m != 0; {
			i := c.Next(m)
			m &^= 1 << (uint(i) & slotMask) // the mask spares the shift its range checks
			if !yield(i) {
				return
			}
		}
	}
}

// Retire gives the slots in mask back to the producer: one atomic store.
func (c *Consumer) Retire(mask uint32) {
	c.local ^= mask
	c.cons.Swap(c.local) // a full barrier, as in Producer.Publish
}

// RoomWanted reports, after a Retire, whether the producer waits for room (WantRoom), and
// clears its mark: the caller rings the producer. One load of a line the retire has just
// written when it does not wait.
func (c *Consumer) RoomWanted() bool { return c.room.Load() != 0 && c.room.Swap(0) != 0 }

// Bitmap is the abort bitmap: one bit per cancellable in-flight call.
type Bitmap struct {
	mem  []byte
	bits int
}

// Len is the number of bits.
func (b Bitmap) Len() int { return b.bits }

func (b Bitmap) word(i int) (*atomic.Uint32, uint32, bool) {
	if i < 0 || i >= b.bits {
		return nil, 0, false
	}
	return shm.U32(b.mem, i/32*4), 1 << (i % 32), true
}

// Set raises bit i; out of range is ignored.
func (b Bitmap) Set(i int) {
	if w, m, ok := b.word(i); ok {
		w.Or(m)
	}
}

// Clear lowers bit i; out of range is ignored.
func (b Bitmap) Clear(i int) {
	if w, m, ok := b.word(i); ok {
		w.And(^m)
	}
}

// Test reports bit i; out of range reads as clear.
func (b Bitmap) Test(i int) bool {
	w, m, ok := b.word(i)
	return ok && w.Load()&m != 0
}

// Peek returns the pending mask without the consumer's private state: safe for observers
// other than the consumer, at the cost of a second atomic load.
func (c *Consumer) Peek() uint32 { return c.prod.Load() ^ c.cons.Load() }

// BitmapSize is the bytes a bitmap of bits takes, a multiple of 64.
func BitmapSize(bits int) int { return abortBytes(bits) }

// BitmapOver is a bitmap of bits over mem, which must hold BitmapSize(bits) bytes, 4-byte
// aligned (a pool's shared abort bitmap, outside any region).
func BitmapOver(mem []byte, bits int) (Bitmap, error) {
	n := abortBytes(bits)
	if bits < 0 || len(mem) < n {
		return Bitmap{}, fmt.Errorf("%w: %d bytes for a bitmap of %d bits", ErrLayout, len(mem), bits)
	}
	return Bitmap{mem: mem[:n], bits: bits}, nil
}
