package steal

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzRecover: whatever a dead consumer left in its journal (and whatever the ticket head
// and its stamp say), Recover never panics; it either returns an error wrapping ErrCorrupt
// or names only calls the host published, each once, and retires only slots in flight.
func FuzzRecover(f *testing.F) {
	f.Add(false, uint8(4), journalWord(0, 2, phaseCommitted), uint64(0), uint64(0),
		words(entryWord(1, 0, entryStarted), entryWord(2, 1, entryClaimed)))
	f.Add(true, uint8(4), journalWord(0, 2, phaseCommitted), uint64(0), uint64(0),
		words(entryWord(3, 2, entryFinished), entryWord(4, 3, entryClaimed)))
	f.Add(false, uint8(6), journalWord(4, 2, phaseIntent), headWord(4, 2, 1), uint64(0), []byte{})
	f.Add(false, uint8(6), journalWord(4, 2, phaseIntent), headWord(6, 2, 0), headWord(4, 2, 1), []byte{})
	f.Add(false, uint8(0), uint64(3), uint64(1)<<63, ^uint64(0), []byte{0xff})
	f.Fuzz(func(t *testing.T, dekker bool, published uint8, js, head, stamp uint64, entries []byte) {
		d := Ticket
		if dekker {
			d = Dekker
		}
		r := newRing(t, Config{Consumers: 3, Discipline: d, Width: 4})
		p := r.Producer(nil)
		k := int(published % 33)
		seqs := publish(t, p, 0, k)
		m := newMem(r.b, r.submit, &r.g)
		m.store(r.g.journal(1), js)
		m.store(idHead, head)
		m.store(r.g.stamp(1), stamp)
		for i := 0; i+8 <= len(entries) && i/8 < maxBatch; i += 8 {
			m.store(r.g.entry(1, i/8), binary.LittleEndian.Uint64(entries[i:]))
		}
		rec, err := p.Recover(1)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		known := map[uint64]bool{}
		for _, s := range seqs {
			known[s] = true
		}
		seen := map[uint64]bool{}
		for _, list := range [][]Call{rec.Fresh, rec.Started} {
			for _, c := range list {
				if c.Slot < 0 || c.Slot >= Slots || !known[c.Seq] || seen[c.Seq] {
					t.Fatalf("recovered %+v: not a published call, or named twice", c)
				}
				seen[c.Seq] = true
			}
		}
		if k < Slots && rec.Retired>>k != 0 {
			t.Fatalf("retired %#x, only %d slots were published", rec.Retired, k)
		}
	})
}

func words(ws ...uint64) []byte {
	var b []byte
	for _, w := range ws {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b
}
