package fastpath

import (
	"fmt"
	"sync/atomic"
)

// A standalone ring is a Ring that is not part of a Region: the shared submit ring of a
// stealing pool, which several consumers claim from (package steal lays it out inside its
// own mapping). Its bytes are the control sector, the 32 slots and the arena, in that order.

// RingBytes returns the bytes a standalone ring with this inline size and arena needs.
func RingBytes(inline, arena int) int {
	return ringCtrl + Slots*(HeaderBytes+inline) + arena
}

// RingOver views mem (RingBytes(inline, arena) bytes, 64-byte aligned) as a standalone ring.
// Sizes outside the Layout limits give an error wrapping ErrLayout.
func RingOver(mem []byte, inline, arena int) (Ring, error) {
	l := Layout{Inline: inline, Arena: arena, AbortBits: 1}
	if err := l.check(); err != nil {
		return Ring{}, err
	}
	if n := RingBytes(inline, arena); len(mem) < n {
		return Ring{}, fmt.Errorf("%w: standalone ring needs %d bytes, have %d", ErrLayout, n, len(mem))
	}
	slots := ringCtrl + Slots*(HeaderBytes+inline)
	return Ring{
		ctrl:   mem[:ringCtrl:ringCtrl],
		slots:  mem[ringCtrl:slots:slots],
		arena:  mem[slots : slots+arena : slots+arena],
		inline: inline,
	}, nil
}

// Words returns the ring's producer and consumer words. On a shared submit ring several
// consumers retire slots by atomically flipping their bits in the consumer word.
func (r Ring) Words() (prod, cons *atomic.Uint32) { return r.prodWord(), r.consWord() }

// Slot returns slot i (0 ≤ i < Slots) for a consumer that is not the ring's Consumer.
func (r Ring) Slot(i int) Slot { return r.slot(i) }

// Payload is Consumer.Payload for a consumer that is not the ring's Consumer: slot i's
// payload bytes, validated against the layout (ErrCorrupt otherwise).
func (r Ring) Payload(i int) ([]byte, error) { return r.payload(i, r.slot(i)) }
