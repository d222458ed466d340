package steal

import (
	"errors"
	"fmt"
	"testing"

	"github.com/knitgo/knit/internal/shm"
)

var disciplines = []Discipline{Ticket, Dekker}

func newRing(t testing.TB, cfg Config) *Ring {
	t.Helper()
	cfg.Arena = 64 << 10
	n, err := Size(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(shm.Heap(n), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// publish stages k calls carrying their numbers (from first) in the call word and flushes.
func publish(t testing.TB, p *Producer, first, k int) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := range k {
		slot, ok := p.Reserve()
		if !ok {
			t.Fatalf("ring full after %d calls", i)
		}
		p.Slot(slot).SetCall(uint32(first+i), 0)
		if _, err := p.Put(slot, 0); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, p.Stage(slot))
	}
	p.Flush()
	return seqs
}

func consumer(t testing.TB, r *Ring, id int) *Consumer {
	t.Helper()
	c, err := r.Consumer(id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want error
	}{
		{Config{Consumers: 32}, ErrTooManyConsumers},
		{Config{Consumers: 100, Discipline: Dekker}, ErrTooManyConsumers},
		{Config{Consumers: 0}, ErrConfig},
		{Config{Consumers: 4, Discipline: 7}, ErrConfig},
		{Config{Consumers: 4, Discipline: Dekker, Width: 8}, ErrConfig}, // 32/8 = 4 regions < 5
		{Config{Consumers: 4, Discipline: Dekker, Width: 3}, ErrConfig},
		{Config{Consumers: 4, Discipline: Ticket, Width: 33}, ErrConfig},
		{Config{Consumers: 4, Inline: 100}, ErrConfig},
	} {
		_, err := Size(tc.cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.cfg, err, tc.want)
		}
	}
	// The reference's widths.
	for n, g := range map[int]int{1: 16, 2: 8, 3: 8, 4: 4, 7: 4, 8: 2, 15: 2, 16: 1, 31: 1, 32: 0} {
		if got := DefaultWidth(n); got != g {
			t.Errorf("DefaultWidth(%d) = %d, want %d", n, got, g)
		}
	}
}

func TestOpenValidates(t *testing.T) {
	r := newRing(t, Config{Consumers: 3, Discipline: Dekker})
	o, err := Open(r.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if o.Config() != r.Config() {
		t.Fatalf("opened %+v, made %+v", o.Config(), r.Config())
	}
	bad := shm.Heap(len(r.Bytes()))
	copy(bad, r.Bytes())
	bad[offCons] = 40
	if _, err := Open(bad); !errors.Is(err, ErrLayout) {
		t.Fatalf("40 consumers: %v", err)
	}
	if _, err := Open(r.Bytes()[:100]); !errors.Is(err, ErrLayout) {
		t.Fatalf("short mapping: %v", err)
	}
}

// TestClaimInOrder: sequential claims take every call once, in batches of at most Width, in
// publication order within a batch; under Ticket in publication order overall (under Dekker
// a claim takes a region, and regions are claimed from the consumer's home region on).
func TestClaimInOrder(t *testing.T) {
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) {
			r := newRing(t, Config{Consumers: 2, Discipline: d, Width: 4})
			p := r.Producer(nil)
			c := consumer(t, r, 1)
			next := 0
			taken := map[uint32]bool{}
			for round := range 20 {
				publish(t, p, round*3, 3)
				for got := 0; got < 3; {
					n, err := c.Claim()
					if err != nil {
						t.Fatal(err)
					}
					if n == 0 {
						t.Fatalf("round %d: nothing to claim after %d of 3", round, got)
					}
					if n > 4 {
						t.Fatalf("batch of %d, width 4", n)
					}
					for k := range n {
						call := c.Slot(k).Call()
						if d == Ticket && int(call) != next {
							t.Fatalf("claimed call %d, want %d", call, next)
						}
						if k > 0 && call <= c.Slot(k-1).Call() {
							t.Fatalf("batch out of order: %d after %d", call, c.Slot(k-1).Call())
						}
						if taken[call] {
							t.Fatalf("call %d claimed twice", call)
						}
						taken[call] = true
						next++
					}
					c.Release()
					for k := range n {
						c.Start(k)
						c.Finish(k)
					}
					got += n
				}
			}
			if !p.Drained() {
				t.Fatal("not drained")
			}
		})
	}
}

// TestIdlePollMovesNothing: 1000 empty polls leave every shared word as it was.
func TestIdlePollMovesNothing(t *testing.T) {
	for _, d := range disciplines {
		r := newRing(t, Config{Consumers: 3, Discipline: d})
		c := consumer(t, r, 0)
		before := append([]byte(nil), r.Bytes()[:offRing(3)+256]...)
		for range 1000 {
			if n, err := c.Claim(); n != 0 || err != nil {
				t.Fatalf("%v: empty ring claimed %d, %v", d, n, err)
			}
		}
		if string(before) != string(r.Bytes()[:offRing(3)+256]) {
			t.Fatalf("%v: idle polls wrote to the mapping", d)
		}
	}
}

func TestClaimWhileHolding(t *testing.T) {
	r := newRing(t, Config{Consumers: 2})
	p := r.Producer(nil)
	c := consumer(t, r, 0)
	publish(t, p, 0, 2)
	if n, _ := c.Claim(); n != 2 {
		t.Fatalf("claimed %d", n)
	}
	c.Start(0)
	c.Finish(0)
	if _, err := c.Claim(); !errors.Is(err, ErrHolding) {
		t.Fatalf("claim while holding: %v", err)
	}
}

// TestRecoverSplitsHeldCalls: a consumer dies holding a batch with one call finished, one
// started and two never started; Recover names exactly the last three, retires nothing the
// consumer retired, and a survivor claims what is left.
func TestRecoverSplitsHeldCalls(t *testing.T) {
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) {
			r := newRing(t, Config{Consumers: 2, Discipline: d, Width: 4})
			p := r.Producer(nil)
			seqs := publish(t, p, 0, 4)
			dead := consumer(t, r, 0)
			if n, err := dead.Claim(); n != 4 || err != nil {
				t.Fatalf("claimed %d, %v", n, err)
			}
			if h := p.Held(0); h != 4 {
				t.Fatalf("held %d after claiming 4", h)
			}
			dead.Start(0)
			dead.Finish(0)
			dead.Start(1)
			if h := p.Held(0); h != 3 {
				t.Fatalf("held %d with one of 4 finished", h)
			}
			// dead dies here.
			rec, err := p.Recover(0)
			if err != nil {
				t.Fatal(err)
			}
			if h, out := p.Held(0), p.Held(MaxConsumers); h != 0 || out != 0 {
				t.Fatalf("held %d after recovery, %d for an id out of range", h, out)
			}
			if fmt.Sprint(rec.Started) != fmt.Sprint([]Call{dead.Call(1)}) {
				t.Fatalf("started %v, want %v", rec.Started, dead.Call(1))
			}
			if len(rec.Fresh) != 2 || rec.Fresh[0].Seq != seqs[2] || rec.Fresh[1].Seq != seqs[3] {
				t.Fatalf("fresh %v, want seqs %v", rec.Fresh, seqs[2:])
			}
			if rec.Retired != 0 {
				t.Fatalf("retired %#x: the consumer had released its slots", rec.Retired)
			}
			if again, err := p.Recover(0); err != nil || len(again.Fresh)+len(again.Started) != 0 {
				t.Fatalf("second recovery: %+v, %v", again, err)
			}
			survivor := consumer(t, r, 1)
			publish(t, p, 4, 1)
			if n, err := survivor.Claim(); n != 1 || err != nil || survivor.Slot(0).Call() != 4 {
				t.Fatalf("survivor claimed %d, %v", n, err)
			}
		})
	}
}

// TestRecoverUnreleased: a consumer dies after journaling a batch and before releasing its
// slots; Recover retires them for it and returns every call as fresh.
func TestRecoverUnreleased(t *testing.T) {
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) {
			r := newRing(t, Config{Consumers: 2, Discipline: d, Width: 4})
			p := r.Producer(nil)
			publish(t, p, 0, 3)
			dead := consumer(t, r, 1)
			if n, _ := dead.Claim(); n != 3 {
				t.Fatalf("claimed %d", n)
			}
			rec, err := p.Recover(1)
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Fresh) != 3 || len(rec.Started) != 0 || rec.Retired == 0 {
				t.Fatalf("recovered %+v", rec)
			}
			if !p.Drained() {
				t.Fatal("slots still in flight after recovery")
			}
		})
	}
}

// TestDeadJuniorDoesNotBlock: under Dekker a junior that died with its WANT raised over the
// only pending region makes a senior withdraw (it never waits for ever), and once the host
// has recovered the junior the senior claims.
func TestDeadJuniorDoesNotBlock(t *testing.T) {
	r := newRing(t, Config{Consumers: 2, Discipline: Dekker, Width: 8})
	p := r.Producer(nil)
	publish(t, p, 0, 1)
	junior := consumer(t, r, 1)
	junior.cl.begin(&r.g)
	for junior.cl.pc != dSenior { // raise WANT, then die
		junior.cl.step(&junior.m, &r.g, 1, false)
	}
	senior := consumer(t, r, 0)
	if n, err := senior.Claim(); n != 0 || err != nil {
		t.Fatalf("senior claimed %d, %v past a junior holding the region", n, err)
	}
	if _, err := p.Recover(1); err != nil {
		t.Fatal(err)
	}
	if n, err := senior.Claim(); n != 1 || err != nil {
		t.Fatalf("after recovery the senior claimed %d, %v", n, err)
	}
	p.Activate(1)
	publish(t, p, 1, 1)
	senior.Release()
	senior.Start(0)
	senior.Finish(0)
	if n, err := junior.Claim(); n != 1 || err != nil {
		t.Fatalf("the reactivated junior claimed %d, %v", n, err)
	}
}

// TestContendedPeer: a consumer whose claims keep finding calls held by a peer's handshake
// (a junior that raised WANT and stopped) becomes Contended after contendedAfter claims, so
// that its lane parks instead of retrying without end; it stops being contended once it
// claims again. Nothing waiting is not contention.
func TestContendedPeer(t *testing.T) {
	r := newRing(t, Config{Consumers: 2, Discipline: Dekker, Width: 8})
	p := r.Producer(nil)
	senior := consumer(t, r, 0)
	for range 2 * contendedAfter {
		if n, err := senior.Claim(); n != 0 || err != nil {
			t.Fatalf("claimed %d, %v from an empty ring", n, err)
		}
	}
	if senior.Contended() {
		t.Fatal("contended with nothing waiting")
	}
	publish(t, p, 0, 1)
	junior := consumer(t, r, 1)
	junior.cl.begin(&r.g)
	for junior.cl.pc != dSenior { // raise WANT, then stop
		junior.cl.step(&junior.m, &r.g, 1, false)
	}
	for i := range contendedAfter {
		if senior.Contended() {
			t.Fatalf("contended after %d fruitless claims, want %d", i, contendedAfter)
		}
		if n, err := senior.Claim(); n != 0 || err != nil {
			t.Fatalf("senior claimed %d, %v past a junior holding the region", n, err)
		}
	}
	if !senior.Contended() {
		t.Fatalf("not contended after %d fruitless claims", contendedAfter)
	}
	if _, err := p.Recover(1); err != nil {
		t.Fatal(err)
	}
	if n, err := senior.Claim(); n != 1 || err != nil {
		t.Fatalf("after recovery the senior claimed %d, %v", n, err)
	}
	if senior.Contended() {
		t.Fatal("still contended after a claim that took a call")
	}
}

// TestWaitingNeverWraps: a ticket head beyond the tail (no valid claim writes one; a claim
// between Waiting's two loads could make it look so) counts as nothing waiting, not a ring
// full of calls.
func TestWaitingNeverWraps(t *testing.T) {
	r := newRing(t, Config{Consumers: 2, Discipline: Ticket})
	p := r.Producer(nil)
	publish(t, p, 0, 3)
	if w := p.Waiting(); w != 3 {
		t.Fatalf("waiting %d, want 3", w)
	}
	p.m.store(idHead, headWord(5, 2, 1))
	if w := p.Waiting(); w != 0 {
		t.Fatalf("waiting %d with the head past the tail, want 0", w)
	}
}

// TestTicketTakenNotRecorded: a consumer whose head CAS won dies before journaling the
// batch; whether a successor moved the head past it or not, Recover returns the batch.
func TestTicketTakenNotRecorded(t *testing.T) {
	for _, successor := range []bool{false, true} {
		r := newRing(t, Config{Consumers: 3, Width: 2})
		p := r.Producer(nil)
		publish(t, p, 0, 4)
		dead := consumer(t, r, 2)
		dead.cl.begin(&r.g)
		for dead.cl.pc != tEntry {
			dead.cl.step(&dead.m, &r.g, 2, false)
		}
		if successor {
			c := consumer(t, r, 0)
			if n, _ := c.Claim(); n != 2 || c.Slot(0).Call() != 2 {
				t.Fatalf("successor claimed %d", n)
			}
		}
		rec, err := p.Recover(2)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Fresh) != 2 || rec.Retired == 0 {
			t.Fatalf("successor %v: recovered %+v", successor, rec)
		}
	}
}

// TestCorruptJournal: a journal that breaks the protocol gives ErrCorrupt, and the dead
// consumer's handshake is released all the same.
func TestCorruptJournal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		js      uint64
		entries []uint64
	}{
		{"bad phase", 3, nil},
		{"idle with garbage", journalWord(5, 2, phaseIdle), nil},
		{"batch too large", journalWord(0, 40, phaseCommitted), nil},
		{"slot out of range", journalWord(0, 1, phaseCommitted), []uint64{entryWord(1, 40, entryClaimed)}},
		{"unknown seq", journalWord(0, 1, phaseCommitted), []uint64{entryWord(99, 1, entryClaimed)}},
		{"empty entry", journalWord(0, 1, phaseCommitted), []uint64{0}},
		{"slot twice", journalWord(0, 2, phaseCommitted), []uint64{entryWord(1, 0, entryClaimed), entryWord(2, 0, entryClaimed)}},
		{"call twice", journalWord(0, 2, phaseCommitted), []uint64{entryWord(2, 0, entryClaimed), entryWord(2, 1, entryStarted)}},
	} {
		r := newRing(t, Config{Consumers: 2, Discipline: Dekker})
		p := r.Producer(nil)
		publish(t, p, 0, 2)
		m := newMem(r.b, r.submit, &r.g)
		m.store(r.g.want(0), 1)
		m.store(r.g.journal(0), tc.js)
		for k, e := range tc.entries {
			m.store(r.g.entry(0, k), e)
		}
		_, err := p.Recover(0)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if m.load(r.g.want(0)) != 0 || m.load(idLive)&1 != 0 {
			t.Errorf("%s: handshake not released", tc.name)
		}
	}
}
