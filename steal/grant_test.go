package steal

import (
	"encoding/binary"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"unsafe"
)

// word returns the named word of the ring's mapping (Words), for writing it as a lane that
// scribbles would.
func word(t testing.TB, r *Ring, name string) Word {
	t.Helper()
	for _, w := range r.Words() {
		if w.Name == name {
			return w
		}
	}
	t.Fatalf("no word %q", name)
	return Word{}
}

func store64(r *Ring, off int, v uint64) {
	(*atomic.Uint64)(unsafe.Pointer(&r.Bytes()[off])).Store(v)
}

func store32(r *Ring, off int, v uint32) {
	(*atomic.Uint32)(unsafe.Pointer(&r.Bytes()[off])).Store(v)
}

// Words names the words the protocol uses where it uses them.
func TestWordsAreTheProtocols(t *testing.T) {
	r := newRing(t, Config{Consumers: 2, Width: 2})
	p := r.Producer(nil)
	seqs := publish(t, p, 0, 3)
	m := newMem(r.b, r.submit, &r.g)
	for name, id := range map[string]int{"head": idHead, "tail": idTail, "live": idLive, "H": idH, "W": idW,
		"stamp/1": r.g.stamp(1), "want/1": r.g.want(1), "journal/1": r.g.journal(1)} {
		w := word(t, r, name)
		before := m.load(id)
		if w.Size == 8 {
			store64(r, w.Offset, before+1)
		} else {
			store32(r, w.Offset, uint32(before)+1)
		}
		if got := m.load(id); got != before+1 {
			t.Errorf("%s at %d: wrote %d, the protocol reads %d", name, w.Offset, before+1, got)
		}
	}
	s := word(t, r, "slot/2")
	if got := binary.LittleEndian.Uint64(r.b[s.Offset+32:]); got != seqs[2] { // the header's sequence number
		t.Errorf("slot/2 at %d holds seq %d, want %d", s.Offset, got, seqs[2])
	}
}

// Under grants the host grants each call once, and only as published: a second claim of a
// call, or one naming the wrong slot or sequence number, is refused; a slot whose call is
// not granted is not reused, whatever the consumer word says; Revoke takes back what is
// still held.
func TestGrantsOnce(t *testing.T) {
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) {
			r := newRing(t, Config{Consumers: 2, Discipline: d, Width: 4})
			p := r.Producer(nil)
			p.RequireGrants()
			seqs := publish(t, p, 0, 3)
			if p.Ungranted() != 3 {
				t.Fatalf("%d ungranted, want 3", p.Ungranted())
			}
			c := consumer(t, r, 0)
			n, err := c.Claim()
			if err != nil || n == 0 {
				t.Fatalf("claim: %d, %v", n, err)
			}
			first := c.Call(0)
			c.Release()
			if p.Grant(first.Slot, first.Seq+1) || p.Grant((first.Slot+1)%Slots, first.Seq) {
				t.Error("a claim naming the wrong sequence number or slot was granted")
			}
			if !p.Grant(first.Slot, first.Seq) {
				t.Fatal("the claim was refused")
			}
			if p.Grant(first.Slot, first.Seq) {
				t.Error("a call was granted twice")
			}
			// The consumer retired its slots before its notice: those it claimed and the
			// host has not granted yet are not free, nor is one a lane retired by writing W.
			for k := 1; k < n; k++ {
				held := c.Call(k).Slot
				for range Slots {
					if s, ok := p.Reserve(); ok {
						if s == held {
							t.Fatalf("slot %d reserved while its call %d is not granted", s, c.Call(k).Seq)
						}
						p.Release(s)
					}
				}
			}
			var rest []Call
			for _, q := range seqs {
				if q != first.Seq {
					for slot, sq := range p.h.seqOf {
						if sq == q {
							rest = append(rest, Call{Slot: slot, Seq: q})
						}
					}
				}
			}
			for _, cl := range rest {
				if !p.Revoke(cl.Slot, cl.Seq) {
					t.Errorf("call %d in slot %d not revoked", cl.Seq, cl.Slot)
				}
			}
			if p.Ungranted() != 0 || p.Grant(rest[0].Slot, rest[0].Seq) {
				t.Error("a revoked call is still held, or was granted")
			}
		})
	}
}

// The audit finds every write of a word only the host writes, and the claim words no claim
// can write; in honest states (calls waiting, claimed and not noticed, granted) it finds
// nothing.
func TestCheckFindsWrites(t *testing.T) {
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) {
			fresh := func() (*Ring, *Producer) {
				r := newRing(t, Config{Consumers: 2, Discipline: d, Width: 2})
				p := r.Producer(nil)
				p.RequireGrants()
				publish(t, p, 0, 4)
				c := consumer(t, r, 1)
				if n, err := c.Claim(); err != nil || n == 0 {
					t.Fatalf("claim: %d, %v", n, err)
				}
				c.Release()
				if !p.Grant(c.Call(0).Slot, c.Call(0).Seq) { // the first granted, the others noticed later
					t.Fatal("grant refused")
				}
				if a := p.Check(); a.Err != nil || a.Claimed == 0 || a.Waiting == 0 {
					t.Fatalf("honest ring: %+v", a)
				}
				return r, p
			}
			writes := map[string]func(r *Ring){
				"control": func(r *Ring) { store32(r, word(t, r, "control").Offset, 0) },
				"H":       func(r *Ring) { w := word(t, r, "H"); store32(r, w.Offset, 0) },
				"W":       func(r *Ring) { w := word(t, r, "W"); store32(r, w.Offset, ^uint32(0)) },
				"slot": func(r *Ring) {
					for i := range Slots {
						binary.LittleEndian.PutUint64(r.b[word(t, r, "slot/"+strconv.Itoa(i)).Offset+32:], 999)
					}
				},
			}
			if d == Ticket {
				writes["head back"] = func(r *Ring) { store64(r, offHead, 0) }
				writes["head ahead"] = func(r *Ring) { store64(r, offHead, headWord(100, 1, 0)) }
				writes["tail"] = func(r *Ring) { store64(r, offTail, 99) }
				writes["order"] = func(r *Ring) {
					for i := range Slots {
						store32(r, offOrder+4*i, 31)
					}
				}
			} else {
				writes["live"] = func(r *Ring) { store32(r, offLive, 1) }
			}
			for name, write := range writes {
				r, p := fresh()
				write(r)
				if a := p.Check(); a.Err == nil {
					t.Errorf("%s written: the audit found nothing", name)
				} else if !errors.Is(a.Err, ErrCorrupt) && !errors.Is(a.Err, ErrLayout) {
					t.Errorf("%s written: %v", name, a.Err)
				}
			}
		})
	}
}

// However the shared words are written, a claim ends: a head ahead of the tail, at the
// ticket limit, or moved on at every step, and a stamp rewritten as it is stamped.
func TestClaimEndsWhateverTheWords(t *testing.T) {
	for name, write := range map[string]func(r *Ring){
		"head ahead":  func(r *Ring) { store64(r, offHead, headWord(1000, 1, 0)) },
		"head at max": func(r *Ring) { store64(r, offHead, headWord(MaxTicket, 1, 0)) },
		"tail far":    func(r *Ring) { store64(r, offTail, 1<<40) },
		"stamp ahead": func(r *Ring) { store64(r, offStamp, headWord(5, 1, 1)) },
	} {
		t.Run(name, func(t *testing.T) {
			r := newRing(t, Config{Consumers: 2, Width: 2})
			p := r.Producer(nil)
			p.RequireGrants()
			publish(t, p, 0, 2)
			write(r)
			c := consumer(t, r, 0)
			n, err := c.Claim() // must return (a loop would hang the test)
			if err != nil && !errors.Is(err, ErrExhausted) {
				t.Errorf("claim: %d, %v", n, err)
			}
			c.Release()
		})
	}
	// A stamp another goroutine rewrites at every moment: the claim gives up, it does not spin.
	r := newRing(t, Config{Consumers: 2, Width: 1})
	p := r.Producer(nil)
	publish(t, p, 0, 2)
	c1 := consumer(t, r, 1)
	if n, err := c1.Claim(); n != 1 || err != nil {
		t.Fatalf("claim: %d, %v", n, err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := uint64(0); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			store64(r, offStamp+8, v%3)
		}
	}()
	c0 := consumer(t, r, 0)
	for range 1000 {
		if _, err := c0.Claim(); err != nil && !errors.Is(err, ErrHolding) {
			t.Fatal(err)
		}
		if c0.Holding() > 0 {
			c0.Release()
			for k := range c0.n {
				c0.Finish(k)
			}
		}
	}
	close(stop)
	<-done
}

// OpenConfig trusts the configuration it is given, not the control block any consumer can
// write: a lane started after the magic was zeroed attaches and claims; Open refuses.
func TestOpenConfigIgnoresTheControlBlock(t *testing.T) {
	r := newRing(t, Config{Consumers: 2, Width: 2})
	p := r.Producer(nil)
	seqs := publish(t, p, 0, 1)
	for off := 0; off < offHead; off += 4 {
		store32(r, off, 0)
	}
	if _, err := Open(r.Bytes()); !errors.Is(err, ErrLayout) {
		t.Errorf("Open of a zeroed control block: %v, want ErrLayout", err)
	}
	o, err := OpenConfig(r.Bytes(), r.Config())
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.Consumer(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Claim(); n != 1 || err != nil || c.Call(0).Seq != seqs[0] {
		t.Fatalf("claim on the ring OpenConfig attached: %d, %v", n, err)
	}
	if _, err := OpenConfig(r.Bytes()[:100], r.Config()); !errors.Is(err, ErrLayout) {
		t.Errorf("OpenConfig of a short mapping: %v, want ErrLayout", err)
	}
	if _, err := OpenConfig(r.Bytes(), Config{Consumers: 40}); !errors.Is(err, ErrLayout) {
		t.Errorf("OpenConfig of 40 consumers: %v, want ErrLayout", err)
	}
}
