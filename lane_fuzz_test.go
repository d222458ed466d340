package knit_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// heldCall is a call as the lane finds it in its request ring (a result names it without
// its abort bit).
type heldCall struct{ fn, id, gen, abort uint32 }

// seenResult is a result slot as the host will find it: the identity it names, its outcome
// and payload (nil with payloadErr when the header breaks the layout).
type seenResult struct {
	call       heldCall
	flags      uint32
	payload    []byte
	payloadErr error
}

// Fuzz ops: what FuzzHostResults's lane does with each pair of input bytes (op, arg).
const (
	opResult   = iota // a result for held call arg (or for a made-up one), sized and filled from the input
	opResult2         // the same (results are the common case)
	opHeader          // overwrite 4 bytes of a result slot's header
	opArena           // overwrite bytes of the return arena
	opProducer        // flip bits of the return ring's producer word: publish whatever the slots hold
	nOps
)

// FuzzHostResults plays a process lane that writes fuzzer-chosen results into its return
// ring and arena — honest ones, and headers, payloads, arena bytes and producer words of its
// choosing — for calls the host published to it, then has the host drain them. The host
// must not panic, and each result it finds must either settle the very call it names, one
// that lane holds, with that result, or make the host treat the lane as corrupt. A call
// settled with a value got the value its result slot carried.
func FuzzHostResults(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{opResult, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8})                          // add's result
	f.Add([]byte{opResult, 3, 5, 'h', 'e', 'l', 'l', 'o'})                         // echo's result
	f.Add([]byte{opResult | 0x40, 4, 2, 0x82, 0x61, 0x61})                         // environ's, through the arena
	f.Add([]byte{opResult, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, opResult, 0, 8, 0, 0, 0}) // twice
	f.Add([]byte{opResult, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, opHeader, 0, 8, 9, 0, 0, 0})
	f.Add([]byte{opResult, 2, 0, opHeader, 0, 0, 0xff, 0xff, 0, 0})
	f.Add([]byte{opResult, 255, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0})
	f.Add([]byte{opResult | 0x20, 5, 2, 4, 0xa1, 0x61})
	f.Add([]byte{opProducer, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{opResult | 0x40, 3, 10, opArena, 0, 0, 0, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := knit.NewResultHarness(add, echo, environ)
		if err != nil {
			t.Skip(err)
		}
		p, r := h.Pool(), h.Region()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Two calls of each task; the second of each is cancellable: it holds an abort bit.
		adds := []*knit.Future[int64]{add.Go(context.Background(), p, [2]int64{1, 2}), add.Go(ctx, p, [2]int64{3, 4})}
		echoes := []*knit.Future[[]byte]{echo.Go(context.Background(), p, []byte("a")), echo.Go(ctx, p, []byte("b"))}
		envs := []*knit.Future[[]string]{environ.Go(context.Background(), p, 0), environ.Go(ctx, p, 1)}

		// The lane takes its calls.
		req := r.Requests().Consumer()
		pending := req.Poll()
		var calls []heldCall
		for m := pending; m != 0; {
			i := req.Next(m)
			m &^= 1 << i
			s := req.Slot(i)
			calls = append(calls, heldCall{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort()})
		}
		req.Retire(pending)
		if len(calls) != 6 {
			t.Fatalf("the lane holds %d calls, want 6", len(calls))
		}

		playLane(r, calls, data)

		// What the host will find, read as it will read it.
		var found []seenResult
		look := r.Returns().Consumer()
		for m := look.Peek(); m != 0; m &= m - 1 {
			i := bitIndex(m)
			s := look.Slot(i)
			res := seenResult{call: heldCall{fn: s.Fn(), id: s.Call(), gen: s.Gen()}, flags: s.Flags()}
			pl, err := look.Payload(i)
			res.payload, res.payloadErr = bytes.Clone(pl), err
			found = append(found, res)
		}
		h.Drain()
		corrupt := h.Corrupt()

		held := map[heldCall]bool{}
		for _, c := range calls {
			held[heldCall{fn: c.fn, id: c.id, gen: c.gen}] = true
		}
		seen := map[heldCall][]seenResult{} // by the call they name
		for _, res := range found {
			if actors.Outcome(res.flags&^actors.SharedResult) == actors.Withdrawn && res.flags&actors.SharedResult == 0 {
				// "Skipped: the host took it back": an answer that settles nothing, whatever
				// call it names (lifecycle.md, "Calls queued behind a long one").
				continue
			}
			if (!held[res.call] || len(seen[res.call]) > 0) && corrupt == nil {
				t.Fatalf("the host accepted a result for call %+v, which the lane does not hold (or twice)", res.call)
			}
			seen[res.call] = append(seen[res.call], res)
		}

		// Every call settles once the lane is gone; one that settled with a value got the
		// value of a result that named it.
		h.Close()
		check := func(c heldCall, settledWith func(payload []byte) bool, pending bool, err error) {
			if pending {
				t.Fatalf("call %+v did not settle when its lane ended", c)
			}
			if err != nil {
				return
			}
			for _, res := range seen[heldCall{fn: c.fn, id: c.id, gen: c.gen}] {
				if res.flags == 0 && res.payloadErr == nil && settledWith(res.payload) {
					return
				}
			}
			t.Fatalf("call %+v settled with a value no result of its lane carried for it (results %+v)", c, found)
		}
		byTask := func(fn uint32) []heldCall {
			var out []heldCall
			for _, c := range calls {
				if c.fn == fn {
					out = append(out, c)
				}
			}
			return out
		}
		for i, c := range byTask(knit.TaskIndex(add)) {
			v, err := adds[i].Wait()
			check(c, func(b []byte) bool { return len(b) == 8 && int64(binary.LittleEndian.Uint64(b)) == v }, adds[i].Pending(), err)
		}
		for i, c := range byTask(knit.TaskIndex(echo)) {
			v, err := echoes[i].Wait()
			check(c, func(b []byte) bool { return bytes.Equal(b, v) }, echoes[i].Pending(), err)
		}
		for i, c := range byTask(knit.TaskIndex(environ)) {
			_, err := envs[i].Wait()
			check(c, func([]byte) bool { return true }, envs[i].Pending(), err)
		}
	})
}

// playLane writes the return ring and arena of r as data says, two bytes (op, arg) and the
// op's operands at a time; the operands are taken from data too (zeros once it runs out).
func playLane(r *fastpath.Region, calls []heldCall, data []byte) {
	take := func(n int) []byte {
		b := make([]byte, n)
		k := copy(b, data)
		data = data[k:]
		return b
	}
	ret := r.Returns().Producer()
	mem := r.Bytes()
	arena := partOffset(r, 4) // the return arena
	for ops := 0; len(data) >= 2 && ops < 64; ops++ {
		op, arg := data[0], data[1]
		data = data[2:]
		switch (op & 0x1f) % nOps {
		case opResult, opResult2:
			var c heldCall
			if int(arg) < len(calls)*40 {
				c = calls[int(arg)%len(calls)]
			} else { // a call the lane does not hold, or does under other names
				b := take(12)
				c = heldCall{fn: binary.LittleEndian.Uint32(b), id: binary.LittleEndian.Uint32(b[4:]), gen: binary.LittleEndian.Uint32(b[8:])}
				if k := arg % 4; k < 3 {
					c.fn %= 1 << (8 * (k + 1)) // often a small index
				}
			}
			n := int(take(1)[0])
			if op&0x40 != 0 {
				n *= 16 // past the inline area, into the arena
			}
			flags := uint32(0)
			if op&0x20 != 0 {
				flags = uint32(take(1)[0] % 8)
			}
			i, ok := ret.Reserve()
			if !ok {
				continue
			}
			buf, err := ret.Put(i, n)
			if err != nil {
				ret.Release(i)
				continue
			}
			copy(buf, take(n))
			s := ret.Slot(i)
			s.SetFn(c.fn)
			s.SetCall(c.id, c.gen)
			s.SetAbort(c.abort)
			s.SetFlags(flags)
			ret.Publish(i)
		case opHeader:
			off := int(take(1)[0]) % fastpath.HeaderBytes &^ 3
			copy(retHeader(r, int(arg)%fastpath.Slots)[off:], take(4))
		case opArena:
			off := int(binary.LittleEndian.Uint16(take(2))) % r.Layout().Arena
			copy(mem[arena+off:arena+r.Layout().Arena], take(int(arg)))
		case opProducer:
			w := shm.U32(mem, partOffset(r, partRetRing))
			w.Store(w.Load() ^ binary.LittleEndian.Uint32(take(4)))
		}
	}
}

// bitIndex is the index of the lowest set bit of m (m ≠ 0).
func bitIndex(m uint32) int {
	i := 0
	for m&1 == 0 {
		m >>= 1
		i++
	}
	return i
}

// TestHostResultsHarness shows that FuzzHostResults's harness can fail: honest results settle
// their calls with their values and leave the lane sound; a result for a call the lane does
// not hold makes the host treat it as corrupt and settles nothing.
func TestHostResultsHarness(t *testing.T) {
	for _, forge := range []bool{false, true} {
		h, err := knit.NewResultHarness(add, echo)
		if err != nil {
			t.Skip(err)
		}
		r := h.Region()
		a := add.Go(context.Background(), h.Pool(), [2]int64{1, 2})
		e := echo.Go(context.Background(), h.Pool(), []byte("in"))
		req := r.Requests().Consumer()
		pending := req.Poll()
		var data []byte
		for m, k := pending, 0; m != 0; k++ {
			i := req.Next(m)
			m &^= 1 << i
			if req.Slot(i).Fn() == knit.TaskIndex(add) {
				data = append(data, opResult, byte(k), 8, 42, 0, 0, 0, 0, 0, 0, 0)
			} else {
				data = append(data, opResult, byte(k), 3, 'o', 'u', 't')
			}
		}
		req.Retire(pending)
		calls := []heldCall{}
		for m := pending; m != 0; m &= m - 1 {
			s := req.Slot(bitIndex(m))
			calls = append(calls, heldCall{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort()})
		}
		if forge { // first, a result naming add's call with the next generation
			data = append([]byte{opResult, 255, byte(knit.TaskIndex(add)), 0, 0, 0, byte(calls[0].id), 0, 0, 0, byte(calls[0].gen + 1), 0, 0, 0, 0}, data...)
		}
		playLane(r, calls, data)
		h.Drain()
		if got := h.Corrupt(); (got != nil) != forge {
			t.Fatalf("forged %v: corrupt = %v", forge, got)
		}
		if !forge {
			if v, err := a.Wait(); err != nil || v != 42 {
				t.Fatalf("add: %d, %v", v, err)
			}
			if v, err := e.Wait(); err != nil || string(v) != "out" {
				t.Fatalf("echo: %q, %v", v, err)
			}
		}
		h.Close()
		if forge {
			if _, err := a.Wait(); err == nil {
				t.Fatal("add settled by a forged result")
			}
		}
	}
}
