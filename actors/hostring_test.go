package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// Tests of HostRing, the host end of a lane's rings, over a heap region: the test plays the
// lane with the region's request Consumer and return Producer, and the owner with ringOwner.

// ringOwner records what a HostRing asks of its owner.
type ringOwner struct {
	admit                       error
	accepted, published, raised int
	dropped                     int
	settled                     []Result
	settle                      func(Result) error // nil: record and accept every result
}

func (o *ringOwner) Admit() error  { return o.admit }
func (o *ringOwner) Accept(int)    { o.accepted++ }
func (o *ringOwner) Published()    { o.published++ }
func (o *ringOwner) AbortRaised()  { o.raised++ }
func (o *ringOwner) Dropped(n int) { o.dropped += n }
func (o *ringOwner) SettleResult(r Result) error {
	r.Payload = bytes.Clone(r.Payload)
	o.settled = append(o.settled, r)
	if o.settle != nil {
		return o.settle(r)
	}
	return nil
}

type testRing struct {
	*HostRing
	mu     sync.Mutex
	owner  *ringOwner
	region *fastpath.Region
	req    *fastpath.Consumer // the lane's side of the request ring
	ret    *fastpath.Producer // the lane's side of the return ring
}

const testRingKey = 5

// newTestRing builds a HostRing over a fresh heap region, serving tasks; configure may
// change its configuration.
func newTestRing(t *testing.T, tasks []Def, configure func(*RingConfig, *fastpath.Region)) *testRing {
	t.Helper()
	layout := fastpath.Layout{Inline: 64, Arena: 256, AbortBits: 8}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr := &testRing{owner: &ringOwner{}, region: region, req: region.Requests().Consumer(), ret: region.Returns().Producer()}
	c := RingConfig{Mu: &tr.mu, Owner: tr.owner, Submit: &LaneProducer{Producer: region.Requests().Producer()},
		Key: testRingKey, Backlog: 4, Returns: region.Returns().Consumer(), Tasks: tasks, Settle: tr.owner}
	if configure != nil {
		configure(&c, region)
	}
	tr.HostRing = NewHostRing(c)
	return tr
}

// served is the tasks by function index, as a pool gives them to its rings.
func served(ds ...Def) []Def {
	var out []Def
	for _, d := range ds {
		for int(d.Index()) >= len(out) {
			out = append(out, nil)
		}
		out[d.Index()] = d
	}
	return out
}

// ringCall starts a call of task, as Task.Call does before dispatch.
func ringCall(t *testing.T, task *Task[int, int], ctx context.Context, in int) (Call, *Record[int, int]) {
	t.Helper()
	r := startCall(t, task, ctx, in, 1, -1)
	return Call{Def: task, ID: r.ID, Gen: r.Gen.Load(), Lane: &r.Lane, Abort: &r.Abort, Seq: &r.Seq,
		Payload: fmt.Appendf(nil, "in %d", in), Done: ctx.Done()}, r
}

// taken is a request slot's header as the lane read it.
type taken struct {
	fn, id, gen, abort uint32
	seq                uint64
	deadline           int64
}

// take takes every pending request slot as a lane would.
func (tr *testRing) take(t *testing.T) []taken {
	t.Helper()
	var got []taken
	if err := tr.req.Take(tr.req.Poll(), func(i int) error {
		s := tr.req.Slot(i)
		got = append(got, taken{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort(), seq: s.Seq(), deadline: s.Deadline()})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// answer publishes a result on the return ring as the lane's Executor does; edit may
// change its header before it is published.
func (tr *testRing) answer(t *testing.T, fn, id, gen, abort, flags uint32, payload []byte, edit func(fastpath.Slot)) {
	t.Helper()
	j, ok := tr.ret.Reserve()
	if !ok {
		t.Fatal("return ring full")
	}
	buf, err := tr.ret.Put(j, len(payload))
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, payload)
	s := tr.ret.Slot(j)
	s.SetFn(fn)
	s.SetCall(id, gen)
	s.SetAbort(abort)
	s.SetFlags(flags)
	s.SetSeq(7)
	if edit != nil {
		edit(s)
	}
	tr.ret.Publish(j)
}

func TestHostRingSubmitPublishes(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), nil)
	for k := range 3 {
		c, r := ringCall(t, task, context.Background(), k)
		c.Deadline = int64(1000 + k)
		if queued, err := tr.Submit(&c); queued || err != nil {
			t.Fatalf("Submit: queued %v, %v", queued, err)
		}
		if r.Lane.Load() != testRingKey || r.Seq.Load() != uint64(k+1) {
			t.Fatalf("record: lane %d seq %d, want %d and %d", r.Lane.Load(), r.Seq.Load(), testRingKey, k+1)
		}
	}
	if tr.owner.accepted != 3 || tr.owner.published != 3 {
		t.Fatalf("owner: %d accepted, %d published, want 3 and 3", tr.owner.accepted, tr.owner.published)
	}
	slots := tr.take(t)
	if len(slots) != 3 {
		t.Fatalf("the lane sees %d calls, want 3", len(slots))
	}
	for k, s := range slots {
		if s.fn != task.Index() || s.seq != uint64(k+1) || s.deadline != int64(1000+k) {
			t.Errorf("slot %d: %+v", k, s)
		}
	}
	tr.owner.admit = errors.New("not ready")
	c, _ := ringCall(t, task, context.Background(), 9)
	if _, err := tr.Submit(&c); err != tr.owner.admit {
		t.Fatalf("Submit to a ring its owner closed: %v", err)
	}
	if tr.owner.accepted != 3 || tr.owner.published != 3 || len(tr.take(t)) != 0 {
		t.Fatalf("a refused call was counted (%d) or published (%d)", tr.owner.accepted, tr.owner.published)
	}
}

// Calls beyond the 32 slots wait in the backlog, in order, until a Flush (or a Drain) finds
// slots free; a full backlog refuses with a channel that is closed when it has room.
func TestHostRingBacklog(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), func(c *RingConfig, _ *fastpath.Region) { c.BlockWhenFull = true })
	var recs []*Record[int, int]
	for k := range fastpath.Slots + 4 {
		c, r := ringCall(t, task, context.Background(), k)
		recs = append(recs, r)
		queued, err := tr.Submit(&c)
		if err != nil || queued != (k >= fastpath.Slots) {
			t.Fatalf("call %d: queued %v, %v", k, queued, err)
		}
	}
	if tr.Queued() != 4 || recs[fastpath.Slots].Seq.Load() != 0 {
		t.Fatalf("backlog holds %d, first queued call's seq %d", tr.Queued(), recs[fastpath.Slots].Seq.Load())
	}
	c, r := ringCall(t, task, context.Background(), 99)
	_, err := tr.Submit(&c)
	var full *BacklogFull
	if !errors.As(err, &full) {
		t.Fatalf("Submit to a full backlog: %v", err)
	}
	if tr.owner.accepted != fastpath.Slots+4 || r.Lane.Load() == testRingKey {
		t.Fatalf("the call a full backlog refused was taken: %d calls counted, want %d", tr.owner.accepted, fastpath.Slots+4)
	}
	if got := len(tr.take(t)); got != fastpath.Slots {
		t.Fatalf("the lane took %d calls, want %d", got, fastpath.Slots)
	}
	published := tr.owner.published
	tr.Flush()
	if tr.Queued() != 0 || tr.owner.published != published+1 {
		t.Fatalf("after Flush: %d queued, %d wake-ups", tr.Queued(), tr.owner.published-published)
	}
	select {
	case <-full.Space:
	default:
		t.Fatal("the backlog had room again, and its Space channel stayed open")
	}
	for k, s := range tr.take(t) {
		if want := uint64(fastpath.Slots + k + 1); s.seq != want || recs[fastpath.Slots+k].Seq.Load() != want {
			t.Errorf("backlog call %d published as %d (record %d), want %d", k, s.seq, recs[fastpath.Slots+k].Seq.Load(), want)
		}
	}
	tr.mu.Lock()
	tr.CloseLocked()
	tr.mu.Unlock()
	tr.Flush()
	if !tr.Closed() || tr.Queued() != 0 {
		t.Fatal("a closed ring is not closed")
	}
}

// Drain hands each result to the owner, checked and in order, retires the slots, and then
// moves backlog calls into the slots they freed.
func TestHostRingDrainSettles(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), func(c *RingConfig, _ *fastpath.Region) { c.Remote = true })
	for k := range fastpath.Slots + 1 {
		c, _ := ringCall(t, task, context.Background(), k)
		if _, err := tr.Submit(&c); err != nil {
			t.Fatal(err)
		}
	}
	slots := tr.take(t)
	for k, s := range slots[:3] {
		tr.answer(t, s.fn, s.id, s.gen, 0, uint32(Failed), fmt.Appendf(nil, "out %d", k), nil)
	}
	n, err := tr.Drain()
	if n != 3 || err != nil {
		t.Fatalf("Drain: %d, %v", n, err)
	}
	for k, r := range tr.owner.settled {
		s := slots[k]
		if r.Def != task || r.Key != testRingKey || r.Shared || r.ID != s.id || r.Gen != s.gen ||
			r.Outcome != Failed || r.Ran != 7 || string(r.Payload) != fmt.Sprint("out ", k) {
			t.Errorf("result %d: %+v", k, r)
		}
	}
	if tr.Waiting() || tr.Queued() != 0 {
		t.Fatalf("after Drain: results waiting %v, %d calls queued", tr.Waiting(), tr.Queued())
	}
	if got := len(tr.take(t)); got != 1 {
		t.Fatalf("Drain moved %d backlog calls to the freed slots, want 1", got)
	}
	// Fence settles what the lane published before it ended, and Drain reads no more.
	tr.answer(t, slots[3].fn, slots[3].id, slots[3].gen, 0, uint32(OK), nil, nil)
	tr.Fence(true)
	tr.answer(t, slots[4].fn, slots[4].id, slots[4].gen, 0, uint32(OK), nil, nil)
	if n, err := tr.Drain(); n != 0 || err != nil || len(tr.owner.settled) != 4 {
		t.Fatalf("Drain after Fence: %d, %v; %d settled, want 4", n, err, len(tr.owner.settled))
	}
}

// SettleLocal hands an in-process lane's result to the owner as Drain would, leaves the
// backlog to FlushBacklogs (once per batch, not per call), refuses a result it cannot attribute, and settles
// nothing once the ring is fenced (an abandoned lane that finishes late).
func TestHostRingSettleLocal(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), nil)
	for k := range fastpath.Slots + 1 {
		c, _ := ringCall(t, task, context.Background(), k)
		if _, err := tr.Submit(&c); err != nil {
			t.Fatal(err)
		}
	}
	slots := tr.take(t)
	s := slots[0]
	if err := tr.SettleLocal(s.fn, s.id, s.gen, OK, false, 9); err != nil {
		t.Fatal(err)
	}
	if got := tr.owner.settled; len(got) != 1 || got[0].Def != task || got[0].Key != testRingKey || got[0].Shared ||
		got[0].ID != s.id || got[0].Gen != s.gen || got[0].Outcome != OK || got[0].Ran != 9 || got[0].Payload != nil {
		t.Fatalf("settled %+v", got)
	}
	if tr.Queued() != 1 {
		t.Fatalf("after SettleLocal %d calls queued, want 1: the lane flushes once per batch", tr.Queued())
	}
	tr.FlushBacklogs()
	if got := len(tr.take(t)); got != 1 || tr.Queued() != 0 {
		t.Fatalf("FlushBacklogs moved %d backlog calls to the freed slots (%d still queued), want 1", got, tr.Queued())
	}
	if tr.Waiting() {
		t.Fatal("a local result was published on the return ring")
	}
	for _, bad := range []struct {
		fn     uint32
		shared bool
	}{{fn: 99}, {fn: s.fn, shared: true}} {
		if err := tr.SettleLocal(bad.fn, s.id, s.gen, OK, bad.shared, 0); !errors.Is(err, fastpath.ErrCorrupt) {
			t.Errorf("result for function %d, shared %v: %v, want ErrCorrupt", bad.fn, bad.shared, err)
		}
	}
	tr.Fence(false)
	if err := tr.SettleLocal(slots[1].fn, slots[1].id, slots[1].gen, OK, false, 0); err != nil || len(tr.owner.settled) != 1 {
		t.Fatalf("SettleLocal after Fence: %v; %d settled, want 1", err, len(tr.owner.settled))
	}
}

// A result that breaks the protocol is an error wrapping fastpath.ErrCorrupt, never a
// panic, and settles nothing.
func TestHostRingCorruptResult(t *testing.T) {
	task := defineTest(t, double, Options{})
	cases := []struct {
		name        string
		fn, abort   uint32
		flags       uint32
		edit        func(t *testing.T, tr *testRing)
		ownerRefuse bool
	}{
		{name: "function out of range", fn: task.Index() + 2},
		{name: "function not served", fn: task.Index() + 1},
		{name: "shared result without a shared ring", flags: SharedResult},
		{name: "abort bit it does not hold", abort: 3},
		{name: "payload outside the arena", edit: func(t *testing.T, tr *testRing) {
			const marker = 0x6b6e69745f726574
			tr.answer(t, task.Index(), 1, 1, 0, uint32(OK), make([]byte, 100), func(s fastpath.Slot) { s.SetSeq(marker) })
			hdr := slotHeader(t, tr.region, marker)
			le := binary.LittleEndian
			if le.Uint32(hdr[hdrTag:]) != fastpath.TagArena {
				t.Fatal("slot header offsets do not match fastpath's")
			}
			le.PutUint32(hdr[hdrOff:], 1<<20)
		}},
		{name: "the owner refuses it", ownerRefuse: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTestRing(t, append(served(task), nil), func(rc *RingConfig, region *fastpath.Region) {
				rc.Remote, rc.Aborts = true, region.Aborts()
			})
			if c.ownerRefuse {
				tr.owner.settle = func(Result) error { return fmt.Errorf("%w: not mine", fastpath.ErrCorrupt) }
			}
			if c.edit != nil {
				c.edit(t, tr)
			} else {
				fn := task.Index()
				if c.fn != 0 {
					fn = c.fn
				}
				tr.answer(t, fn, 1, 1, c.abort, c.flags, nil, nil)
			}
			n, err := tr.Drain()
			if n != 1 || !errors.Is(err, fastpath.ErrCorrupt) {
				t.Fatalf("Drain: %d, %v; want 1 and an error wrapping fastpath.ErrCorrupt", n, err)
			}
			if len(tr.owner.settled) != 0 && !c.ownerRefuse {
				t.Fatalf("a corrupt result was settled: %+v", tr.owner.settled)
			}
			if tr.Waiting() {
				t.Fatal("the corrupt result was not retired")
			}
		})
	}
}

// A cancellable call gets an abort bit when its ring accepts it; a call whose caller gave
// up while it looked for a lane (its expiry found it on no lane) gets its bit raised as the
// ring accepts it: otherwise a task that waits for its context would hold its lane for good,
// and every call behind it. The bit goes back with the call's result, and only its call's.
func TestHostRingAbortBits(t *testing.T) {
	task := defineTest(t, double, Options{})
	for _, base := range []int32{0, 1 << 16} {
		t.Run(fmt.Sprint("base ", base), func(t *testing.T) {
			tr := newTestRing(t, served(task), func(c *RingConfig, region *fastpath.Region) {
				c.Remote, c.Aborts, c.AbortBase = true, region.Aborts(), base
			})
			for _, cancelled := range []bool{false, true} {
				ctx, cancel := context.WithCancel(context.Background())
				if cancelled {
					cancel()
				}
				c, r := ringCall(t, task, ctx, 1)
				if _, err := tr.Submit(&c); err != nil {
					t.Fatal(err)
				}
				bit := r.Abort.Load()
				if bit < base {
					t.Fatal("a cancellable call got no abort bit")
				}
				if raised := tr.region.Aborts().Test(int(bit - base)); raised != cancelled {
					t.Errorf("caller gave up: %v; abort bit raised: %v", cancelled, raised)
				}
				if err := tr.FreeAbort(bit, task.Index(), r.ID+1); !errors.Is(err, fastpath.ErrCorrupt) {
					t.Errorf("another call's result gave the bit back: %v", err)
				}
				if err := tr.FreeAbort(bit, task.Index(), r.ID); err != nil {
					t.Fatal(err)
				}
				if tr.region.Aborts().Test(int(bit - base)) {
					t.Error("a freed bit stays raised")
				}
				if err := tr.FreeAbort(bit, task.Index(), r.ID); !errors.Is(err, fastpath.ErrCorrupt) {
					t.Errorf("a bit was given back twice: %v", err)
				}
				cancel()
			}
			if tr.owner.raised != 1 {
				t.Fatalf("the owner woke the abort watchers %d times, want 1", tr.owner.raised)
			}
			// RaiseAbortLocked raises a bit only for the call that holds it.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c, r := ringCall(t, task, ctx, 2)
			if _, err := tr.Submit(&c); err != nil {
				t.Fatal(err)
			}
			bit := r.Abort.Load()
			tr.mu.Lock()
			tr.RaiseAbortLocked(bit, task.Index(), r.ID+1)
			stale := tr.region.Aborts().Test(int(bit - base))
			tr.RaiseAbortLocked(bit, task.Index(), r.ID)
			raised := tr.region.Aborts().Test(int(bit - base))
			tr.mu.Unlock()
			if stale || !raised {
				t.Fatalf("raised for another call: %v; for its own: %v", stale, raised)
			}
			tr.ReleaseAbort(bit)
			if tr.region.Aborts().Test(int(bit-base)) || tr.FreeAbort(bit, task.Index(), r.ID) == nil {
				t.Fatal("a released bit is still held")
			}
			// Once every bit is taken a call gets none (-1): its caller can settle it, the
			// lane cannot interrupt it. A call that cannot be cancelled gets none either.
			for k := range tr.region.Aborts().Len() + 1 {
				c, r := ringCall(t, task, ctx, k)
				if _, err := tr.Submit(&c); err != nil {
					t.Fatal(err)
				}
				if got := r.Abort.Load(); (got == -1) != (k == tr.region.Aborts().Len()) {
					t.Fatalf("call %d got abort bit %d", k, got)
				}
			}
			c, r = ringCall(t, task, context.Background(), 0)
			if _, err := tr.Submit(&c); err != nil {
				t.Fatal(err)
			}
			if r.Abort.Load() != -1 {
				t.Fatalf("a call that cannot be cancelled got abort bit %d", r.Abort.Load())
			}
		})
	}
}

// Submit, Flush and Drain do not allocate: they are on every call's path.
func TestHostRingDoesNotAllocate(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), nil)
	c, _ := ringCall(t, task, context.Background(), 1)
	c.Payload = nil // a goroutine lane's: the value stays on the record
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := tr.Submit(&c); err != nil {
			t.Fatal(err)
		}
		if err := tr.req.Take(tr.req.Poll(), func(i int) error {
			s := tr.req.Slot(i)
			tr.answer(t, s.Fn(), s.Call(), s.Gen(), 0, uint32(OK), nil, nil)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		tr.owner.settled = tr.owner.settled[:0]
		if _, err := tr.Drain(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per call, want 0", allocs)
	}
}

// settleNothing is a Settler that settles nothing.
type settleNothing struct{}

func (settleNothing) SettleResult(Result) error { return nil }

// BenchmarkHostRingCycle is one call's way through a lane's HostRing with the lane played
// inline: Submit, the lane taking it and answering, Drain settling the result.
func BenchmarkHostRingCycle(b *testing.B) {
	task := defineTest(b, double, Options{})
	layout := fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	o := &ringOwner{}
	h := NewHostRing(RingConfig{Mu: &mu, Owner: o, Submit: &LaneProducer{Producer: region.Requests().Producer()},
		Backlog: 4, Returns: region.Returns().Consumer(), Tasks: served(task),
		Settle: settleNothing{}})
	req, ret := region.Requests().Consumer(), region.Returns().Producer()
	r := startCall(b, task, context.Background(), 1, 1, -1)
	c := Call{Def: task, ID: r.ID, Gen: r.Gen.Load(), Lane: &r.Lane, Abort: &r.Abort, Seq: &r.Seq}
	for b.Loop() {
		if _, err := h.Submit(&c); err != nil {
			b.Fatal(err)
		}
		_ = req.Take(req.Poll(), func(i int) error {
			s := req.Slot(i)
			j, _ := ret.Reserve()
			_, _ = ret.Put(j, 0)
			rs := ret.Slot(j)
			rs.SetFn(s.Fn())
			rs.SetCall(s.Call(), s.Gen())
			ret.Publish(j)
			return nil
		})
		if n, err := h.Drain(); n != 1 || err != nil {
			b.Fatalf("Drain: %d, %v", n, err)
		}
	}
}

// A backlog call whose caller has gone (its context ended, and the caller settled it)
// leaves without running: at the flush, and at once when the backlog is full and a new call
// needs room. The owner uncounts it and the ring lets go of its record.
func TestHostRingDropsGoneCalls(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), nil)
	for k := range fastpath.Slots {
		c, _ := ringCall(t, task, context.Background(), k)
		if _, err := tr.Submit(&c); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*Record[int, int]
	var cancels []context.CancelFunc
	for k := range 4 { // the backlog, full
		ctx, cancel := context.WithCancel(context.Background())
		c, r := ringCall(t, task, ctx, 100+k)
		if queued, err := tr.Submit(&c); err != nil || !queued {
			t.Fatalf("backlog call %d: %v, %v", k, queued, err)
		}
		recs, cancels = append(recs, r), append(cancels, cancel)
	}
	for _, k := range []int{0, 2} { // their callers give up, and settle them
		cancels[k]()
		recs[k].Fail(context.Canceled)
	}
	c, _ := ringCall(t, task, context.Background(), 99)
	if queued, err := tr.Submit(&c); err != nil || !queued {
		t.Fatalf("a call to a backlog full of gone calls: %v, %v", queued, err)
	}
	if tr.owner.dropped != 2 || tr.Queued() != 3 {
		t.Fatalf("dropped %d, %d queued; want 2 and 3", tr.owner.dropped, tr.Queued())
	}
	cancels[1]() // gone, not settled yet by its caller: it leaves at the flush all the same
	for _, k := range []int{0, 2} {
		if recs[k].Lane.Load() != -1 {
			t.Errorf("dropped call %d still names the ring", k)
		}
	}
	tr.take(t)
	tr.Flush()
	var ids []uint32
	for _, s := range tr.take(t) {
		ids = append(ids, s.id)
	}
	if want := []uint32{recs[3].ID, c.ID}; !slices.Equal(ids, want) {
		t.Fatalf("published %v, want %v (the live backlog calls, in order)", ids, want)
	}
	if tr.owner.dropped != 3 || recs[1].Lane.Load() != -1 || !recs[1].Pending() {
		t.Fatalf("dropped %d; the pending gone call names lane %d", tr.owner.dropped, recs[1].Lane.Load())
	}
	recs[1].Fail(context.Canceled) // as its caller does
	for _, cancel := range cancels {
		cancel()
	}
}

// SubmitBatch publishes what the free slots take with one wake-up of the owner, queues the
// rest in the backlog in order, and stops at a full backlog: the calls it took are the first
// ones.
func TestHostRingSubmitBatch(t *testing.T) {
	task := defineTest(t, double, Options{})
	tr := newTestRing(t, served(task), nil) // a backlog of 4
	var calls []Call
	var recs []*Record[int, int]
	for k := range fastpath.Slots + 6 {
		c, r := ringCall(t, task, context.Background(), k)
		calls, recs = append(calls, c), append(recs, r)
	}
	taken, err := tr.SubmitBatch(calls)
	var full *BacklogFull
	if taken != fastpath.Slots+4 || !errors.As(err, &full) {
		t.Fatalf("SubmitBatch: %d taken, %v; want %d and a full backlog", taken, err, fastpath.Slots+4)
	}
	if tr.owner.accepted != taken || tr.owner.published != 1 || tr.Queued() != 4 {
		t.Fatalf("owner: %d accepted, %d wake-ups, %d queued", tr.owner.accepted, tr.owner.published, tr.Queued())
	}
	for k, r := range recs {
		if want := k < taken; (r.Lane.Load() == testRingKey) != want {
			t.Errorf("call %d: lane %d", k, r.Lane.Load())
		}
	}
	slots := tr.take(t)
	if len(slots) != fastpath.Slots {
		t.Fatalf("the lane sees %d calls, want %d", len(slots), fastpath.Slots)
	}
	for k, s := range slots {
		if s.id != recs[k].ID || s.seq != uint64(k+1) {
			t.Fatalf("slot %d holds call %d (seq %d), want %d", k, s.id, s.seq, recs[k].ID)
		}
	}
	tr.Flush()
	for k, s := range tr.take(t) {
		if want := recs[fastpath.Slots+k].ID; s.id != want {
			t.Errorf("backlog call %d published as call %d, want %d", k, s.id, want)
		}
	}
	tr.owner.admit = errors.New("not ready")
	if taken, err := tr.SubmitBatch(calls[taken:]); taken != 0 || err != tr.owner.admit {
		t.Fatalf("SubmitBatch to a ring its owner closed: %d, %v", taken, err)
	}
}

// blockingOwner's Published waits until released: a submitter descheduled between
// publishing its calls and ringing the lane.
type blockingOwner struct {
	*ringOwner
	entered, release chan struct{}
}

func (o *blockingOwner) Published() { close(o.entered); <-o.release }

// A submitter rings the lane after it let go of mu, and the ring may touch the region;
// Quiesce, which the owner calls between closing the ring and unmapping the region, waits
// for it (TestEndedLaneWakeStateIsNotRead has the fault an unmapped region makes).
func TestQuiesceWaitsForRingingSubmitters(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (int, error) { return n, nil }, Options{})
	bo := &blockingOwner{ringOwner: &ringOwner{}, entered: make(chan struct{}), release: make(chan struct{})}
	tr := newTestRing(t, served(task), func(c *RingConfig, _ *fastpath.Region) { c.Owner = bo })
	c, r := ringCall(t, task, context.Background(), 1)
	submitted := make(chan error, 1)
	go func() {
		_, err := tr.Submit(&c)
		submitted <- err
	}()
	<-bo.entered
	tr.mu.Lock()
	tr.CloseLocked()
	tr.mu.Unlock()
	if n := tr.publishing.Load(); n != 1 {
		t.Fatalf("%d submitters counted while one rings the lane, want 1", n)
	}
	quiesced := make(chan struct{})
	go func() {
		tr.Quiesce()
		close(quiesced)
	}()
	close(bo.release)
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	select {
	case <-quiesced:
	case <-time.After(time.Minute): // a watchdog against a hang, not a speed claim
		t.Fatal("Quiesce did not return once the submitter had rung")
	}
	tr.take(t)
	r.Lane.Store(-1)
	releaseCall(task, r)
}
