package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/knitgo/knit/internal/shm"
)

// payloadFor builds message n's payload; sizes cycle through every tier.
func payloadFor(n uint32, buf []byte) []byte {
	sizes := [...]int{0, 8, HeaderData, HeaderData + 1, 300, DefaultInline, DefaultInline + 1, 5000}
	size := sizes[n%uint32(len(sizes))]
	buf = buf[:size]
	for i := range buf {
		buf[i] = byte(n>>(8*(i%4))) ^ byte(i)
	}
	return buf
}

// exactlyOnce sends count messages through l and checks each result arrives once, intact.
func exactlyOnce(t *testing.T, l *laneUnderTest, count uint32) {
	seen := make([]bool, count)
	var got uint32
	errc := make(chan error, 1)
	go func() {
		want := make([]byte, 0, 8192)
		for got < count {
			_, err := l.receive(20*time.Microsecond, func(s Slot, p []byte) error {
				n := s.Call()
				switch {
				case n >= count || s.Gen() != ^n:
					return fmt.Errorf("result for unknown call %d (gen %#x)", n, s.Gen())
				case seen[n]:
					return fmt.Errorf("call %d delivered twice", n)
				case crc32.ChecksumIEEE(p) != s.Fn() || !bytes.Equal(p, payloadFor(n, want)):
					return fmt.Errorf("call %d: payload corrupted", n)
				}
				seen[n] = true
				got++
				return nil
			})
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 0, 8192)
	for n := range count {
		l.send(n, payloadFor(n, buf))
	}
	done := make(chan struct{})
	var err error
	go func() { err = <-errc; close(done) }()
	l.watchdog(t, done, "exactly-once delivery")
	if err != nil {
		t.Fatal(err)
	}
	l.close(t)
}

func messages(t *testing.T) uint32 {
	if testing.Short() {
		return 100_000
	}
	return 1_000_000
}

func TestExactlyOnceGoroutines(t *testing.T) {
	exactlyOnce(t, goroutineLane(t, Layout{Arena: 64 << 10}, 20*time.Microsecond), messages(t))
}

func TestExactlyOnceProcesses(t *testing.T) {
	exactlyOnce(t, processLane(t, Layout{Arena: 64 << 10}, 20*time.Microsecond), messages(t))
}

// noLostWake ping-pongs with spinning disabled, so both sides park on every message.
func noLostWake(t *testing.T, l *laneUnderTest, rounds int) {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		msg := []byte("ping")
		for n := range rounds {
			l.send(uint32(n), msg)
			var k int
			for k == 0 && err == nil {
				k, err = l.receive(0, func(s Slot, p []byte) error {
					if s.Call() != uint32(n) {
						return fmt.Errorf("round %d: got result %d", n, s.Call())
					}
					return nil
				})
			}
			if err != nil {
				return
			}
		}
	}()
	l.watchdog(t, done, "park/wake ping-pong")
	if err != nil {
		t.Fatal(err)
	}
	l.close(t)
}

func wakeRounds(t *testing.T) int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

func TestNoLostWakeGoroutines(t *testing.T) {
	noLostWake(t, goroutineLane(t, Layout{Arena: 4096}, 0), wakeRounds(t))
}

func TestNoLostWakeProcesses(t *testing.T) {
	noLostWake(t, processLane(t, Layout{Arena: 4096}, 0), wakeRounds(t))
}

func newTestRegion(t testing.TB, l Layout) *Region {
	r, err := NewRegion(shm.Heap(l.Size()), l, 3, 7, 42)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRegionValidation(t *testing.T) {
	r := newTestRegion(t, Layout{})
	if _, err := OpenRegion(r.Bytes()); err != nil {
		t.Fatalf("valid region refused: %v", err)
	}
	if r.Lane() != 3 || r.Incarnation() != 7 || r.Epoch() != 42 {
		t.Fatalf("identity = %d/%d/%d", r.Lane(), r.Incarnation(), r.Epoch())
	}
	corrupt := map[string]func(b []byte){
		"magic":   func(b []byte) { b[offMagic] ^= 1 },
		"version": func(b []byte) { b[offVersion] = 9 },
		"slots":   func(b []byte) { b[offSlots] = 31 },
		"inline":  func(b []byte) { b[offInline] = 100 },
		"stride":  func(b []byte) { b[offStride] ^= 64 },
		"arena":   func(b []byte) { b[offArena+3] = 0x7f },
		"abort":   func(b []byte) { b[offAbortBits+2] = 0xff },
		"total":   func(b []byte) { b[offTotal] ^= 64 },
		"part":    func(b []byte) { b[offParts+8] ^= 64 },
	}
	for name, f := range corrupt {
		b := shm.Heap(len(r.Bytes()))
		copy(b, r.Bytes())
		f(b)
		if _, err := OpenRegion(b); !errors.Is(err, ErrLayout) {
			t.Errorf("%s corrupted: err = %v, want ErrLayout", name, err)
		}
	}
	if _, err := OpenRegion(r.Bytes()[:len(r.Bytes())-64]); !errors.Is(err, ErrLayout) {
		t.Errorf("short mapping: err = %v", err)
	}
	if _, err := NewRegion(shm.Heap(1<<20), Layout{Inline: 100}, 0, 0, 0); !errors.Is(err, ErrLayout) {
		t.Errorf("bad inline size accepted: %v", err)
	}
}

func TestFatalMessage(t *testing.T) {
	r := newTestRegion(t, Layout{})
	if r.Fatal() != "" || r.Boot().Load() != BootBooting {
		t.Fatal("fresh region has a fatal message or is not booting")
	}
	r.SetFatal("unknown task \"x\"")
	if r.Fatal() != "unknown task \"x\"" || r.Boot().Load() != BootFailed {
		t.Fatalf("fatal = %q, boot = %d", r.Fatal(), r.Boot().Load())
	}
	long := bytes.Repeat([]byte("x"), 2*FatalBytes)
	r.SetFatal(string(long))
	if len(r.Fatal()) != FatalBytes {
		t.Fatalf("fatal message not truncated to the area: %d", len(r.Fatal()))
	}
}

func TestRingFullAndTiers(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	p, c := r.Requests().Producer(), r.Requests().Consumer()
	for i := range Slots {
		s, ok := p.Reserve()
		if !ok {
			t.Fatalf("reserve %d failed with free slots", i)
		}
		p.Publish(s)
	}
	if _, ok := p.Reserve(); ok {
		t.Fatal("reserved a 33rd slot")
	}
	if got := c.Poll(); got != ^uint32(0) {
		t.Fatalf("pending = %#x, want all", got)
	}
	c.Retire(0b11)
	a, ok1 := p.Reserve()
	b, ok2 := p.Reserve()
	if !ok1 || !ok2 || a != 0 || b != 1 {
		t.Fatalf("after retiring slots 0 and 1 got %d,%d", a, b)
	}
	if _, ok := p.Reserve(); ok {
		t.Fatal("reserved a slot that was not retired")
	}
	for _, tc := range []struct {
		n   int
		tag uint32
	}{{0, TagNone}, {HeaderData, TagHeader}, {HeaderData + 1, TagInline}, {DefaultInline, TagInline}, {DefaultInline + 1, TagArena}} {
		if _, err := p.Put(a, tc.n); err != nil {
			t.Fatalf("put %d: %v", tc.n, err)
		}
		if got := p.Slot(a).u32(hTag); got != tc.tag {
			t.Errorf("size %d: tag %d, want %d", tc.n, got, tc.tag)
		}
	}
	if _, err := p.Put(a, 4097); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the arena: %v", err)
	}
}

// Empty is Put(i, 0): a slot that carried a payload reads as carrying none, and keeps the
// header fields that are not the payload's.
func TestEmpty(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	p, c := r.Requests().Producer(), r.Requests().Consumer()
	for _, n := range []int{HeaderData, DefaultInline, DefaultInline + 1} {
		i, ok := p.Reserve()
		if !ok {
			t.Fatal("ring full")
		}
		if _, err := p.Put(i, n); err != nil {
			t.Fatalf("put %d: %v", n, err)
		}
		s := p.Slot(i)
		s.SetFlags(7)
		s.SetAbort(9)
		p.Empty(i)
		p.Publish(i)
		pending := c.Poll()
		got, err := c.Payload(i)
		if pending != 1<<i || err != nil || got != nil {
			t.Fatalf("after a payload of %d bytes: pending %#x, payload %q, %v", n, pending, got, err)
		}
		if tag, off, l := s.u32(hTag), s.u32(hOff), s.u32(hLen); tag != TagNone || off != 0 || l != 0 || s.Flags() != 7 || s.Abort() != 9 {
			t.Fatalf("after a payload of %d bytes: tag %d offset %d length %d flags %d abort %d", n, tag, off, l, s.Flags(), s.Abort())
		}
		c.Retire(pending)
	}
}

func TestArenaBackpressureAndReclaim(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	p, c := r.Requests().Producer(), r.Requests().Consumer()
	put := func(n int) (int, error) {
		s, ok := p.Reserve()
		if !ok {
			t.Fatal("no slot")
		}
		if _, err := p.Put(s, n); err != nil {
			p.Release(s)
			return s, err
		}
		p.Publish(s)
		return s, nil
	}
	if _, err := put(3000); err != nil {
		t.Fatal(err)
	}
	if _, err := put(2000); !errors.Is(err, ErrArenaFull) {
		t.Fatalf("second value: %v, want ErrArenaFull", err)
	}
	c.Retire(c.Poll())
	if _, err := put(2000); err != nil {
		t.Fatalf("after retire: %v", err)
	}
	if _, err := put(2000); err != nil {
		t.Fatalf("gap after the first value: %v", err)
	}
}

func TestBitmap(t *testing.T) {
	b := newTestRegion(t, Layout{}).Aborts()
	if b.Len() != DefaultAbortBits {
		t.Fatalf("len %d", b.Len())
	}
	for _, i := range []int{0, 31, 32, 257} {
		b.Set(i)
		if !b.Test(i) {
			t.Errorf("bit %d not set", i)
		}
		b.Clear(i)
		if b.Test(i) {
			t.Errorf("bit %d not cleared", i)
		}
	}
	b.Set(258)
	b.Set(-1)
	if b.Test(258) || b.Test(-1) {
		t.Error("out of range bits read as set")
	}
}

func TestFIFO(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	p, c := r.Requests().Producer(), r.Requests().Consumer()
	next := uint32(0)
	send := func(n int) {
		for range n {
			i, ok := p.Reserve()
			if !ok {
				t.Fatal("ring full")
			}
			p.Slot(i).SetCall(next, 0)
			next++
			p.Publish(i)
		}
	}
	want := uint32(0)
	take := func() {
		pending := c.Poll()
		for m := pending; m != 0; {
			i := c.Next(m)
			m &^= 1 << i
			if got := c.Slot(i).Call(); got != want {
				t.Fatalf("took call %d, want %d", got, want)
			}
			want++
		}
		c.Retire(pending)
	}
	// Bursts of every size wrap the ring many times; calls come out in order.
	for burst := 1; burst <= Slots; burst++ {
		send(burst)
		take()
		send(Slots - burst)
		take()
	}
}

// ReserveAny hands out every slot the consumers have retired, in whatever order they did:
// one slot still in flight at the cursor does not make the ring look full.
func TestReserveAnySkipsBusySlots(t *testing.T) {
	r := newTestRegion(t, Layout{Inline: 64, Arena: 64, AbortBits: 1})
	p, c := r.Requests().Producer(), r.Requests().Consumer()
	for i := range Slots {
		s, ok := p.ReserveAny()
		if !ok || s != i {
			t.Fatalf("reserve %d: slot %d, %v", i, s, ok)
		}
		p.Stage(s)
	}
	p.Flush()
	if s, ok := p.ReserveAny(); ok {
		t.Fatalf("a full ring handed out slot %d", s)
	}
	c.Retire(c.Poll() &^ 1) // every slot but 0, the one at the cursor
	for i := 1; i < Slots; i++ {
		if s, ok := p.ReserveAny(); !ok || s != i {
			t.Fatalf("after the retire: slot %d, %v; want %d", s, ok, i)
		}
	}
	if s, ok := p.ReserveAny(); ok {
		t.Fatalf("slot 0 is in flight, yet slot %d was handed out", s)
	}
	if _, ok := p.Reserve(); ok {
		t.Fatal("Reserve handed out a slot of a full ring")
	}
}

func TestRingUnread(t *testing.T) {
	r := newTestRegion(t, Layout{Arena: 4096})
	ring := r.Requests()
	p, c := ring.Producer(), ring.Consumer()
	if ring.Unread() {
		t.Fatal("a fresh ring reports an unread slot")
	}
	s, _ := p.Reserve()
	p.Stage(s)
	if ring.Unread() {
		t.Fatal("a staged, unpublished slot reads as unread")
	}
	p.Flush()
	if !ring.Unread() {
		t.Fatal("a published slot does not read as unread")
	}
	c.Retire(c.Poll())
	if ring.Unread() {
		t.Fatal("a retired slot still reads as unread")
	}
}
