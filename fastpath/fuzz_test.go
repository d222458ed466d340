package fastpath

import (
	"encoding/binary"
	"testing"

	"github.com/knitgo/knit/internal/shm"
)

// FuzzOpenRegion feeds arbitrary control blocks to the validator: errors, never panics, and
// an accepted region's parts all lie inside the mapping.
func FuzzOpenRegion(f *testing.F) {
	valid := newTestRegion(f, Layout{Arena: 4096, AbortBits: 64}).Bytes()
	f.Add(valid[:ctrlBytes], uint16(0), uint32(0))
	f.Add(valid[:ctrlBytes], uint16(offInline), uint32(128))
	f.Add(valid[:ctrlBytes], uint16(offArena), uint32(1<<31))
	f.Add([]byte("KNIT"), uint16(0), uint32(0))
	f.Fuzz(func(t *testing.T, ctrl []byte, at uint16, val uint32) {
		mem := shm.Heap(len(valid))
		copy(mem, ctrl)
		if int(at)+4 <= ctrlBytes {
			binary.LittleEndian.PutUint32(mem[at:], val)
		}
		r, err := OpenRegion(mem)
		if err != nil {
			return
		}
		// Every accessor of an accepted region must stay in bounds.
		_ = r.Fatal()
		r.Aborts().Set(r.Aborts().Len() - 1)
		r.Stats().Completed.Add(1)
		for _, ring := range []Ring{r.Requests(), r.Returns()} {
			c := ring.Consumer()
			for i := range Slots {
				_, _ = c.Payload(i)
			}
			p := ring.Producer()
			if i, ok := p.Reserve(); ok {
				_, _ = p.Put(i, len(ring.arena))
			}
		}
	})
}

// FuzzSlotHeader writes arbitrary header bytes into a published slot: the consumer's
// decoder returns an error or a slice inside the slot or the arena.
func FuzzSlotHeader(f *testing.F) {
	f.Add(make([]byte, HeaderBytes))
	for _, tag := range []uint32{TagHeader, TagInline, TagArena, 9} {
		h := make([]byte, HeaderBytes)
		binary.LittleEndian.PutUint32(h[hTag:], tag)
		binary.LittleEndian.PutUint32(h[hLen:], 24)
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		r := newTestRegion(t, Layout{Arena: 4096})
		checkSlot(t, r, header)
	})
}

// FuzzArenaRead aims the arena reader at arbitrary offsets and lengths.
func FuzzArenaRead(f *testing.F) {
	f.Add(uint32(0), uint32(600))
	f.Add(uint32(4032), uint32(64))
	f.Add(uint32(4032), uint32(65))
	f.Add(uint32(0xffffffc0), uint32(0x80))
	f.Fuzz(func(t *testing.T, off, n uint32) {
		h := make([]byte, HeaderBytes)
		binary.LittleEndian.PutUint32(h[hTag:], TagArena)
		binary.LittleEndian.PutUint32(h[hOff:], off)
		binary.LittleEndian.PutUint32(h[hLen:], n)
		checkSlot(t, newTestRegion(t, Layout{Arena: 4096}), h)
	})
}

func checkSlot(t *testing.T, r *Region, header []byte) {
	ring := r.Requests()
	p, c := ring.Producer(), ring.Consumer()
	i, _ := p.Reserve()
	copy(p.Slot(i).b[:HeaderBytes], header)
	p.Publish(i)
	b, err := c.Payload(i)
	if err != nil {
		return
	}
	if len(b) == 0 {
		return
	}
	inSlot := within(b, ring.slot(i).b)
	inArena := within(b, ring.arena)
	if !inSlot && !inArena {
		t.Fatalf("payload of %d bytes outside its slot and arena", len(b))
	}
}

// within reports whether b is a sub-slice of outer, by comparing addresses of the ends.
func within(b, outer []byte) bool {
	if len(outer) == 0 {
		return false
	}
	for i := range outer {
		if &outer[i] == &b[0] {
			return i+len(b) <= len(outer)
		}
	}
	return false
}
