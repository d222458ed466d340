package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/knitgo/knit/fastpath"
)

// takeAll takes every pending request slot as an Executor does, bundles call by call: each
// call's id, sequence number and input, and how many calls each slot carried.
func (tr *testRing) takeAll(t *testing.T) (calls []taken, inputs []string, perSlot []int) {
	t.Helper()
	if err := tr.req.Take(tr.req.Poll(), func(i int) error {
		s := tr.req.Slot(i)
		p, err := tr.req.Payload(i)
		if err != nil {
			return err
		}
		if s.Flags()&Bundle == 0 {
			calls = append(calls, taken{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort(), seq: s.Seq(), deadline: s.Deadline()})
			inputs, perSlot = append(inputs, string(p)), append(perSlot, 1)
			return nil
		}
		seq, n := s.Seq(), 0
		for len(p) > 0 {
			var w work
			var in []byte
			if in, p, err = nextInBundle(p, &w); err != nil {
				return err
			}
			calls = append(calls, taken{fn: w.fn, id: w.id, gen: w.gen, abort: w.abort, seq: seq, deadline: w.deadline})
			inputs = append(inputs, string(in))
			seq++
			n++
		}
		perSlot = append(perSlot, n)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return calls, inputs, perSlot
}

// Calls that wait in the backlog move into slots several at a time (a slot's arena room
// permitting), numbered one after the other as if each had its slot: the lane sees each
// call's header and input, and each record its sequence number.
func TestHostRingBundlesTheBacklog(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), func(c *RingConfig, _ *fastpath.Region) { c.Bundles, c.Backlog = true, 16 })
	var recs []*Record[int, int]
	for k := range fastpath.Slots + 12 {
		c, r := ringCall(t, task, context.Background(), k)
		c.Deadline = int64(1000 + k)
		recs = append(recs, r)
		if _, err := tr.Submit(&c); err != nil {
			t.Fatal(err)
		}
	}
	if calls, _, _ := tr.takeAll(t); len(calls) != fastpath.Slots {
		t.Fatalf("the lane took %d calls, want %d", len(calls), fastpath.Slots)
	}
	var calls []taken
	var inputs []string
	var perSlot []int
	for range 12 { // the arena holds a few calls at a time: each flush moves what fits
		tr.Flush()
		c, in, per := tr.takeAll(t)
		calls, inputs, perSlot = append(calls, c...), append(inputs, in...), append(perSlot, per...)
	}
	if len(calls) != 12 || len(perSlot) >= 12 || tr.Queued() != 0 {
		t.Fatalf("the backlog's 12 calls moved in %d slots (%v), %d left", len(perSlot), perSlot, tr.Queued())
	}
	for k, c := range calls {
		r := recs[fastpath.Slots+k]
		want := uint64(fastpath.Slots + k + 1)
		if c.id != r.ID || c.gen != r.Gen.Load() || c.fn != task.Index() || c.seq != want || r.Seq.Load() != want ||
			c.deadline != int64(1000+fastpath.Slots+k) || inputs[k] != fmt.Sprintf("in %d", fastpath.Slots+k) {
			t.Errorf("call %d: %+v %q, record seq %d, want seq %d", k, c, inputs[k], r.Seq.Load(), want)
		}
	}
}

// The Executor runs a bundle's calls one by one and answers each on a result slot of its
// own; a bundle that breaks the framing ends Run with ErrCorrupt.
func TestExecutorRunsBundles(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 4096}, served(task), nil)
	var calls []Call
	for k := range 40 { // more than a batch of slots holds
		in, _ := task.InCodec.Append(nil, k)
		calls = append(calls, Call{Def: task, ID: uint32(k), Gen: 1, Abort: new(atomic.Int32), Payload: in})
		calls[k].Abort.Store(-1)
	}
	stageBundle := func(calls []Call) {
		i, ok := h.req.Reserve()
		if !ok {
			t.Fatal("request ring full")
		}
		buf, err := h.req.Put(i, bundleSize(calls))
		if err != nil {
			t.Fatal(err)
		}
		putBundle(buf, calls)
		s := h.req.Slot(i)
		s.SetFlags(Bundle)
		s.SetSeq(h.seq + 1)
		h.seq += uint64(len(calls))
		h.req.Stage(i)
	}
	stageBundle(calls[:20])
	h.stage(callSlot{fn: task.Index(), id: 20, gen: 1, payload: calls[20].Payload})
	stageBundle(calls[21:])
	h.flush()
	got := h.receive(40)
	for k, r := range got {
		out, err := task.OutCdc.Decode(r.payload)
		if r.id != uint32(k) || r.o != OK || err != nil || out != 2*k {
			t.Errorf("result %d: call %d, %v, %d, %v", k, r.id, r.o, out, err)
		}
	}
	if w := h.region.Running().Load(); fastpath.Started(w) != 40 {
		t.Errorf("running word names call %d, want 40", fastpath.Started(w))
	}
	h.stopAndWait()

	h = startExecutor(t, fastpath.Layout{Arena: 4096}, served(task), nil)
	i2, _ := h.req.Reserve()
	buf, _ := h.req.Put(i2, bundleSize(calls[:2]))
	putBundle(buf, calls[:2])
	buf[24] = 0xff // the first call's length runs past the payload
	s := h.req.Slot(i2)
	s.SetFlags(Bundle)
	s.SetSeq(1)
	h.req.Stage(i2)
	h.flush()
	if err := h.wait(); !errors.Is(err, fastpath.ErrCorrupt) {
		t.Fatalf("Run after a corrupt bundle: %v", err)
	}
}

// FuzzBundle feeds a lane hostile bundles: reading one never panics, and what it accepts
// it reads within the payload.
func FuzzBundle(f *testing.F) {
	task := defineTest(f, double, Options{})
	calls := []Call{{Def: task, ID: 1, Gen: 2, Abort: new(atomic.Int32), Payload: []byte("abc")},
		{Def: task, ID: 3, Gen: 4, Abort: new(atomic.Int32)}}
	good := make([]byte, bundleSize(calls))
	putBundle(good, calls)
	f.Add(good)
	f.Add(good[:bundleHead+1])
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		for p := b; len(p) > 0; {
			var w work
			in, rest, err := nextInBundle(p, &w)
			if err != nil {
				if !errors.Is(err, fastpath.ErrCorrupt) {
					t.Fatalf("error %v is not ErrCorrupt", err)
				}
				return
			}
			if len(rest) >= len(p) {
				t.Fatal("no progress")
			}
			total += bundleHead + len(in)
			p = rest
		}
		if total != len(b) {
			t.Fatalf("read %d bytes of %d", total, len(b))
		}
	})
}
