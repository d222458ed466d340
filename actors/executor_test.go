package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// Tests of the Executor, the consumer side of a lane, driven over a heap region the way a
// host drives it (see lane.go): a Producer on the request ring, a Consumer on the return
// ring, the lane doorbell to wake it and the completion doorbell to sleep on.

// probeBell is a ChanBell that runs onWake before each wake-up, to see what the waker had
// done by then.
type probeBell struct {
	*fastpath.ChanBell
	onWake func()
}

func (b *probeBell) Wake(w *atomic.Uint32) {
	if b.onWake != nil {
		b.onWake()
	}
	b.ChanBell.Wake(w)
}

type testHost struct {
	t      *testing.T
	region *fastpath.Region
	req    *fastpath.Producer
	ret    *fastpath.Consumer
	wake   *fastpath.Wake
	lane   *fastpath.ChanBell
	done   *probeBell
	seq    uint64
	exec   *Executor
	ended  chan struct{}
	err    error // why Run returned, valid once ended is closed
}

// startExecutor runs an Executor for tasks over a fresh heap region; configure may change
// it before it starts. The lane is stopped at the end of the test if it is still running.
func startExecutor(t *testing.T, layout fastpath.Layout, tasks []Def, configure func(*Executor)) *testHost {
	t.Helper()
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &testHost{t: t, region: region, req: region.Requests().Producer(), ret: region.Returns().Consumer(),
		wake: region.LaneWake(), lane: fastpath.NewChanBell(), done: &probeBell{ChanBell: fastpath.NewChanBell()},
		ended: make(chan struct{})}
	h.exec = &Executor{Region: region, Lane: h.lane, Done: h.done, Tasks: tasks}
	if configure != nil {
		configure(h.exec)
	}
	go func() {
		defer close(h.ended)
		defer func() {
			if v := recover(); v != nil {
				h.err = fmt.Errorf("executor panicked: %v", v)
			}
		}()
		h.err = h.exec.Run()
	}()
	t.Cleanup(func() {
		select {
		case <-h.ended:
		default:
			h.stop()
			h.wait()
		}
	})
	return h
}

type callSlot struct {
	fn, id, gen, abort uint32
	deadline           int64
	payload            []byte
}

// stage writes c into the next request slot; the next flush publishes it. It returns the
// call's sequence number on the lane.
func (h *testHost) stage(c callSlot) uint64 {
	h.t.Helper()
	i, ok := h.req.Reserve()
	if !ok {
		h.t.Fatal("request ring full")
	}
	buf, err := h.req.Put(i, len(c.payload))
	if err != nil {
		h.t.Fatal(err)
	}
	copy(buf, c.payload)
	s := h.req.Slot(i)
	s.SetFn(c.fn)
	s.SetCall(c.id, c.gen)
	s.SetAbort(c.abort)
	h.seq++
	s.SetSeq(h.seq)
	s.SetDeadline(c.deadline)
	h.req.Stage(i)
	return h.seq
}

// flush publishes the staged calls in one store and wakes the lane.
func (h *testHost) flush() {
	h.req.Flush()
	h.wake.Ring(h.lane)
}

func (h *testHost) send(c callSlot) uint64 {
	seq := h.stage(c)
	h.flush()
	return seq
}

type result struct {
	fn, id, gen, abort uint32
	o                  Outcome
	payload            []byte
}

// receive waits for n results, sleeping on the completion doorbell as a host's reaper does,
// and retires them. The lane ending first fails the test.
func (h *testHost) receive(n int) []result {
	h.t.Helper()
	var got []result
	deadline := time.Now().Add(time.Minute) // a watchdog against a hang, not a speed claim
	done := h.region.Returns().Completion()
	for len(got) < n {
		pending := h.ret.Poll()
		if pending == 0 {
			select {
			case <-h.ended:
				h.t.Fatalf("lane ended after %d of %d results: %v", len(got), n, h.err)
			default:
			}
			if time.Now().After(deadline) {
				h.t.Fatalf("watchdog: %d of %d results", len(got), n)
			}
			done.Arm()
			if h.ret.Poll() == 0 {
				done.Wait(h.done, time.Second)
			}
			done.Disarm()
			continue
		}
		for m := pending; m != 0; {
			i := h.ret.Next(m)
			m &^= 1 << i
			s := h.ret.Slot(i)
			p, err := h.ret.Payload(i)
			if err != nil {
				h.t.Fatalf("result slot: %v", err)
			}
			got = append(got, result{fn: s.Fn(), id: s.Call(), gen: s.Gen(), abort: s.Abort(),
				o: Outcome(s.Flags()), payload: bytes.Clone(p)})
		}
		h.ret.Retire(pending)
	}
	if len(got) > n {
		h.t.Fatalf("%d results, want %d", len(got), n)
	}
	return got
}

func (h *testHost) stop() {
	h.region.Stop().Store(fastpath.StopRequested)
	h.wake.Force(h.lane)
}

// wait waits for Run to return and returns its error.
func (h *testHost) wait() error {
	h.t.Helper()
	select {
	case <-h.ended:
	case <-time.After(time.Minute):
		h.t.Fatal("watchdog: the executor did not return")
	}
	return h.err
}

func (h *testHost) stopAndWait() {
	h.t.Helper()
	h.stop()
	if err := h.wait(); err != nil {
		h.t.Fatalf("Run: %v", err)
	}
	if got := h.region.Stop().Load(); got != fastpath.StopAcknowledged {
		h.t.Fatalf("stop word %d after Run returned, want acknowledged", got)
	}
}

// A goroutine lane's calls run in the order they were published, on their records, and
// each result names its call; a slot naming a stale generation runs nothing.
func TestExecutorRunsCallsInOrder(t *testing.T) {
	var mu sync.Mutex
	var ran []int
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		mu.Lock()
		ran = append(ran, n)
		mu.Unlock()
		return 10 * n, nil
	}, Options{})
	const owner, lane = 5, 2
	h := startExecutor(t, fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) { e.Local = true })

	stale := startCall(t, task, context.Background(), -1, owner, lane)
	staleGen := stale.Gen.Load()
	releaseCall(task, stale)

	var recs []*Record[int, int]
	var want []uint32 // the ids of the result slots, in order
	var last uint64
	for burst := range 2 {
		for i := range 10 {
			n := burst*10 + i
			r := startCall(t, task, context.Background(), n, owner, lane)
			recs = append(recs, r)
			last = h.stage(callSlot{fn: 0, id: r.ID, gen: r.Gen.Load()})
			want = append(want, r.ID)
			if n == 4 { // the slot of a call that ended: the record is now call 0's
				last = h.stage(callSlot{fn: 0, id: stale.ID, gen: staleGen})
				want = append(want, stale.ID)
			}
		}
		h.flush() // a burst: ten slots, one store
	}
	got := h.receive(len(want))
	for k, res := range got {
		if res.id != want[k] || res.fn != 0 {
			t.Fatalf("result %d names call %d (fn %d), want call %d: results out of order", k, res.id, res.fn, want[k])
		}
	}
	if got[5].o != Stale || got[5].gen != staleGen {
		t.Fatalf("slot of an older generation: outcome %v gen %d, want stale", got[5].o, got[5].gen)
	}
	mu.Lock()
	for k, n := range ran {
		if n != k {
			t.Fatalf("calls ran in order %v", ran)
		}
	}
	if len(ran) != len(recs) {
		t.Fatalf("%d calls ran, want %d (the stale slot must run nothing)", len(ran), len(recs))
	}
	mu.Unlock()
	for _, res := range got {
		if res.o == Stale {
			continue
		}
		if res.o != OK {
			t.Fatalf("call %d: outcome %v", res.id, res.o)
		}
		if err := task.SettleResult(owner, lane, res.id, res.gen, res.o, res.payload, true, 0, testWrapper{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range recs {
		<-r.Done()
		if r.Out != 10*r.In || r.Err != nil {
			t.Fatalf("call %d settled with %v, %v", r.In, r.Out, r.Err)
		}
		task.Records.Release(r)
	}
	if s := fastpath.Started(h.region.Running().Load()); s != last {
		t.Fatalf("running word shows call %d started last, want %d", s, last)
	}
	if s := h.region.Stats().Snapshot(); s.Completed != 20 || s.Failed != 1 {
		t.Fatalf("stats %+v, want 20 completed, 1 failed (the stale slot)", s)
	}
	h.stopAndWait()
}

// Each result is published when its call ends, not with the rest of its burst: a result
// held back would be lost with the lane, and its call with it.
func TestExecutorPublishesEachResult(t *testing.T) {
	gate, started := make(chan struct{}), make(chan struct{})
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		if n == 2 {
			close(started)
			<-gate
		}
		return n, nil
	}, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) { e.Local = true })
	a := startCall(t, task, context.Background(), 1, 1, 0)
	b := startCall(t, task, context.Background(), 2, 1, 0)
	h.stage(callSlot{id: a.ID, gen: a.Gen.Load()})
	seqB := h.stage(callSlot{id: b.ID, gen: b.Gen.Load()})
	h.flush()
	<-started
	if got := h.receive(1); got[0].id != a.ID || got[0].o != OK {
		t.Fatalf("first result %+v, want call %d ok", got[0], a.ID)
	}
	// The lane stored, before running b, that b started: were it to die now, the host
	// would know b may have run.
	if w := h.region.Running().Load(); fastpath.Started(w) != seqB || w != fastpath.RunningWord(seqB, true) {
		t.Fatalf("running word %#x while b runs, want call %d running", w, seqB)
	}
	close(gate)
	if got := h.receive(1); got[0].id != b.ID {
		t.Fatalf("second result %+v, want call %d", got[0], b.ID)
	}
	releaseCall(task, a)
	releaseCall(task, b)
	h.stopAndWait()
}

// A stop is acknowledged only after the calls the lane has taken are finished and their
// results published, and the acknowledgement rings the completion doorbell, where the host
// may be sleeping.
func TestExecutorStopAfterTakenCalls(t *testing.T) {
	gate, started := make(chan struct{}), make(chan struct{})
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		if n == 0 {
			close(started)
			<-gate
		}
		return n, nil
	}, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) { e.Local = true })
	var ackWakes, ackResults atomic.Int32
	h.done.onWake = func() {
		if h.region.Stop().Load() == fastpath.StopAcknowledged {
			ackWakes.Add(1)
			ackResults.Store(int32(h.ret.Peek()))
		}
	}
	var recs []*Record[int, int]
	for n := range 3 {
		r := startCall(t, task, context.Background(), n, 1, 0)
		recs = append(recs, r)
		h.stage(callSlot{id: r.ID, gen: r.Gen.Load()})
	}
	h.flush()
	<-started
	h.stop()
	// The lane is inside the first call: it cannot have acknowledged.
	select {
	case <-h.ended:
		t.Fatalf("Run returned while a taken call was running: %v", h.err)
	default:
	}
	if got := h.region.Stop().Load(); got != fastpath.StopRequested {
		t.Fatalf("stop word %d while a taken call runs, want requested", got)
	}
	close(gate)
	// Sleep on the completion doorbell until the acknowledgement, as a stopping host does.
	done := h.region.Returns().Completion()
	deadline := time.Now().Add(time.Minute)
	for h.region.Stop().Load() != fastpath.StopAcknowledged {
		if time.Now().After(deadline) {
			t.Fatal("watchdog: no acknowledgement")
		}
		done.Arm()
		if h.region.Stop().Load() != fastpath.StopAcknowledged {
			done.Wait(h.done, time.Second)
		}
		done.Disarm()
	}
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if ackWakes.Load() != 1 {
		t.Fatalf("the acknowledgement rang the completion doorbell %d times, want once", ackWakes.Load())
	}
	if ackResults.Load() != 0b111 {
		t.Fatalf("results on the ring at the acknowledgement: %#b, want all three", ackResults.Load())
	}
	got := h.receive(3)
	for k, res := range got {
		if res.id != recs[k].ID || res.o != OK {
			t.Fatalf("result %d: %+v", k, res)
		}
	}
	for _, r := range recs {
		releaseCall(task, r)
	}
}

// slotHeader finds the header of a request slot in the region's bytes by a marker written
// in its sequence field, so that a test can break what Producer never writes.
func slotHeader(t *testing.T, region *fastpath.Region, marker uint64) []byte {
	t.Helper()
	var m [8]byte
	binary.LittleEndian.PutUint64(m[:], marker)
	mem := region.Bytes()
	i := bytes.Index(mem, m[:])
	if i < 0 || bytes.Index(mem[i+1:], m[:]) >= 0 {
		t.Fatal("slot marker not found exactly once")
	}
	return mem[i-hdrSeq : i-hdrSeq+fastpath.HeaderBytes]
}

// Slot header offsets (fastpath/ring.go); slotHeader and corruptSlot check them against
// what Producer.Put writes before relying on them.
const (
	hdrTag = 8
	hdrOff = 16
	hdrLen = 20
	hdrSeq = 32
)

// corruptSlot publishes a call whose payload header says tag, off, n, and returns the
// executor's error.
func corruptSlot(t *testing.T, tag, off, n uint32) error {
	t.Helper()
	task := defineTest(t, func(_ context.Context, s string) (string, error) {
		t.Error("a call with a corrupt payload ran")
		return s, nil
	}, Options{})
	layout := fastpath.Layout{Inline: 64, Arena: 256, AbortBits: 1}
	h := startExecutor(t, layout, []Def{task}, nil)
	i, ok := h.req.Reserve()
	if !ok {
		t.Fatal("ring full")
	}
	buf, err := h.req.Put(i, 5)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "hello")
	s := h.req.Slot(i)
	const marker = 0x6b6e69745f736571
	s.SetSeq(marker)
	hdr := slotHeader(t, h.region, marker)
	le := binary.LittleEndian
	if le.Uint32(hdr[hdrTag:]) != fastpath.TagHeader || le.Uint32(hdr[hdrLen:]) != 5 {
		t.Fatal("slot header offsets do not match fastpath's")
	}
	le.PutUint32(hdr[hdrTag:], tag)
	le.PutUint32(hdr[hdrOff:], off)
	le.PutUint32(hdr[hdrLen:], n)
	h.req.Stage(i)
	h.flush()
	return h.wait()
}

func isCorrupt(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !errors.Is(err, fastpath.ErrCorrupt) || strings.Contains(err.Error(), "panicked") {
		t.Errorf("%s: Run returned %v, want an error wrapping fastpath.ErrCorrupt", what, err)
	}
}

// A request slot that breaks the protocol ends Run with an error wrapping
// fastpath.ErrCorrupt (the lane must die), never a panic, and runs nothing.
func TestExecutorCorruptSlot(t *testing.T) {
	const inline, arena = 64, 256
	payloads := []struct {
		name        string
		tag, off, n uint32
	}{
		{"unknown tag", 9, 0, 5},
		{"none with a length", fastpath.TagNone, 0, 3},
		{"header over its room", fastpath.TagHeader, 0, fastpath.HeaderData + 1},
		{"inline over its room", fastpath.TagInline, 0, inline + 1},
		{"inline length huge", fastpath.TagInline, 0, 1<<32 - 1},
		{"arena offset misaligned", fastpath.TagArena, 1, 5},
		{"arena past its end", fastpath.TagArena, arena - 64, 65},
		{"arena offset past its end", fastpath.TagArena, arena, 1},
		{"arena end wraps 32 bits", fastpath.TagArena, 1<<32 - 64, 128},
	}
	for _, p := range payloads {
		t.Run(p.name, func(t *testing.T) {
			isCorrupt(t, p.name, corruptSlot(t, p.tag, p.off, p.n))
		})
	}

	local := defineTest(t, func(context.Context, int) (int, error) {
		t.Error("a call with a bad function index ran")
		return 0, nil
	}, Options{})
	for _, c := range []struct {
		name  string
		tasks []Def
		fn    uint32
	}{
		{"function index past the tasks", []Def{local}, 1},
		{"function index huge", []Def{local}, 1<<32 - 1},
		{"function not served", []Def{nil, local}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, c.tasks, func(e *Executor) { e.Local = true })
			h.send(callSlot{fn: c.fn})
			isCorrupt(t, c.name, h.wait())
			if h.ret.Poll() != 0 {
				t.Error("a result was published for a corrupt slot")
			}
		})
	}

	t.Run("carried fields", func(t *testing.T) {
		task := defineTest(t, func(_ context.Context, s string) (string, error) {
			t.Error("a call with corrupt carried fields ran")
			return s, nil
		}, Options{})
		h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) { e.Carried = true })
		// Carried fields claiming 100 bytes, followed by 3.
		h.send(callSlot{payload: append(binary.AppendUvarint(nil, 100), "abc"...)})
		err := h.wait()
		isCorrupt(t, "carried", err)
		if !errors.Is(err, ErrCarried) {
			t.Errorf("carried: %v does not wrap ErrCarried", err)
		}
	})
}

type ctxKey struct{}

// A process lane's call gets its context from Executor.Context: its abort bit (the slot's
// abort field less one), its caller's deadline and its carried fields; the context ends
// (end is called) when the call does.
func TestExecutorEncodedContext(t *testing.T) {
	type seen struct {
		bit      int
		deadline int64
		fields   map[string]string
	}
	var (
		mu    sync.Mutex
		calls []seen
		ends  int
	)
	task := defineTest(t, func(ctx context.Context, in string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		v, _ := ctx.Value(ctxKey{}).(string)
		return fmt.Sprintf("%s/%s/ended %d", in, v, ends), nil
	}, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 4096, AbortBits: 8}, []Def{task}, func(e *Executor) {
		e.Carried = true
		e.Context = func(bit int, deadline int64, carried []byte) (context.Context, func()) {
			s := seen{bit: bit, deadline: deadline, fields: map[string]string{}}
			if err := EachCarried(carried, func(k, v string) { s.fields[k] = v }); err != nil {
				t.Errorf("carried fields: %v", err)
			}
			mu.Lock()
			calls = append(calls, s)
			mu.Unlock()
			return context.WithValue(context.Background(), ctxKey{}, s.fields["trace"]), func() {
				mu.Lock()
				ends++
				mu.Unlock()
			}
		}
	})
	input := func(v string, fields map[string]string) []byte {
		b := AppendCarried(nil, func(add func(k, v string)) {
			for k, v := range fields {
				add(k, v)
			}
		})
		b, err := task.InCodec.Append(b, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	h.stage(callSlot{id: 1, abort: 3, deadline: 1234567890, payload: input("first", map[string]string{"trace": "t-1", "x": "y"})})
	h.stage(callSlot{id: 2, abort: 0, deadline: 0, payload: input("second", nil)})
	h.flush()
	got := h.receive(2)
	want := []string{"first/t-1/ended 0", "second//ended 1"}
	for k, res := range got {
		out, err := task.OutCdc.Decode(res.payload)
		if res.o != OK || err != nil || out != want[k] {
			t.Fatalf("result %d: %v %q %v; want ok %q", k, res.o, out, err, want[k])
		}
	}
	if got[0].abort != 3 || got[1].abort != 0 {
		t.Fatalf("results carry abort fields %d, %d; want the slots' 3, 0", got[0].abort, got[1].abort)
	}
	h.stopAndWait()
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || ends != 2 {
		t.Fatalf("Context called %d times, end %d times; want 2, 2", len(calls), ends)
	}
	first, second := calls[0], calls[1]
	if first.bit != 2 || first.deadline != 1234567890 || len(first.fields) != 2 || first.fields["x"] != "y" {
		t.Fatalf("first call's context: %+v", first)
	}
	if second.bit != -1 || second.deadline != 0 || len(second.fields) != 0 {
		t.Fatalf("second call's context: %+v", second)
	}
}

type codedErr struct{}

func (codedErr) Error() string       { return "coded" }
func (codedErr) KnitCode() string    { return "SOME_CODE" }
func (codedErr) KnitMessage() string { return "the message" }

// How a process lane's calls end: each outcome in its result slot with the encoded value
// or error report, and the lane serving on.
func TestExecutorEncodedOutcomes(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (string, error) {
		switch n {
		case 1:
			return "", codedErr{}
		case 2:
			return "", errors.New("plain")
		case 3:
			panic("oops")
		case 4:
			return strings.Repeat("x", 300), nil
		}
		return fmt.Sprint(n), nil
	}, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 4096, AbortBits: 1}, []Def{task}, func(e *Executor) { e.MaxCall = 200 })
	in := func(n int) []byte { b, _ := task.InCodec.Append(nil, n); return b }
	for _, p := range [][]byte{in(0), in(1), in(2), in(3), in(4), {1, 2, 3}, in(5)} {
		h.stage(callSlot{payload: p})
	}
	h.flush()
	got := h.receive(7)
	report := func(k int) WireError {
		we, err := DecodeWireError(got[k].payload)
		if err != nil {
			t.Fatalf("result %d: error report does not decode: %v", k, err)
		}
		return we
	}
	if out, err := task.OutCdc.Decode(got[0].payload); got[0].o != OK || err != nil || out != "0" {
		t.Fatalf("ok call: %v %q %v", got[0].o, out, err)
	}
	if we := report(1); got[1].o != Failed || we.Code != "SOME_CODE" || we.Message != "the message" {
		t.Fatalf("coded error: %v %+v", got[1].o, we)
	}
	if we := report(2); got[2].o != Failed || we.Code != "" || we.Message != "plain" {
		t.Fatalf("plain error: %v %+v", got[2].o, we)
	}
	if we := report(3); got[3].o != Panicked || we.Message != "oops" || len(got[3].payload) > 200 {
		t.Fatalf("panic: %v %+v", got[3].o, we)
	}
	if we := report(4); got[4].o != BadOutput || we.Code != CodePayloadTooLarge {
		t.Fatalf("result over MaxCall: %v %+v", got[4].o, we)
	}
	if we := report(5); got[5].o != BadInput || we.Code != CodeUnsupportedType {
		t.Fatalf("input that does not decode: %v %+v", got[5].o, we)
	}
	if out, _ := task.OutCdc.Decode(got[6].payload); got[6].o != OK || out != "5" {
		t.Fatalf("the lane did not serve on after failures: %v %q", got[6].o, out)
	}
	if s := h.region.Stats().Snapshot(); s.Completed != 2 || s.Failed != 5 {
		t.Fatalf("stats %+v, want 2 completed, 5 failed", s)
	}
	h.stopAndWait()
}

// With Panic set (PanicCrashesLane), a task's panic ends Run with the *PanicError, before
// any result is published for it.
func TestExecutorPanicCrashesLane(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			task := defineTest(t, func(context.Context, int) (int, error) { panic("crash me") }, Options{})
			h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) {
				e.Local, e.Panic = local, true
			})
			r := startCall(t, task, context.Background(), 1, 1, 0)
			c := callSlot{id: r.ID, gen: r.Gen.Load()}
			if !local {
				c.payload, _ = task.InCodec.Append(nil, 1)
			}
			h.send(c)
			err := h.wait()
			var pe *PanicError
			if !errors.As(err, &pe) || fmt.Sprint(pe.Value) != "crash me" || len(pe.Stack) == 0 {
				t.Fatalf("Run returned %v, want the task's *PanicError", err)
			}
			if h.ret.Poll() != 0 {
				t.Fatal("a result was published for the call that crashed the lane")
			}
			releaseCall(task, r)
		})
	}
}

// A result over the limit is replaced by a PAYLOAD_TOO_LARGE report that itself fits the
// smallest region a pool may configure (64 bytes inline, 64 of arena): a report that did
// not fit would leave the lane retrying its publication forever.
func TestExecutorTooLargeReportFitsTinyRegion(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (string, error) { return strings.Repeat("x", n), nil }, Options{})
	h := startExecutor(t, fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}, []Def{task}, nil)
	for _, n := range []int{100, 1 << 20} {
		p, _ := task.InCodec.Append(nil, n)
		h.send(callSlot{id: uint32(n), payload: p})
		got := h.receive(1)
		we, err := DecodeWireError(got[0].payload)
		if got[0].o != BadOutput || err != nil || we.Code != CodePayloadTooLarge || !strings.Contains(we.Message, "over the") {
			t.Fatalf("%d-byte result: %v %+v %v; want a PAYLOAD_TOO_LARGE report", n, got[0].o, we, err)
		}
	}
	h.stopAndWait()
}

// Without a completion bell (Done nil: never rung) the executor still publishes, even when
// the host has armed the completion doorbell: a host that sleeps there must bring its own
// wake-up.
func TestExecutorWithoutDoneBell(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) {
		e.Local, e.Done = true, nil
	})
	h.region.Returns().Completion().Arm()
	// The executor signals after each publish; it takes the second call only after it has
	// signalled the first result.
	for n := range 2 {
		r := startCall(t, task, context.Background(), n, 1, 0)
		h.send(callSlot{id: r.ID, gen: r.Gen.Load()})
		eventually(t, "a result or the lane's end", func() bool {
			select {
			case <-h.ended:
				return true
			default:
				return h.ret.Poll() != 0
			}
		})
		select {
		case <-h.ended:
			t.Fatalf("lane ended: %v", h.err)
		default:
		}
		if got := h.receive(1); got[0].id != r.ID || got[0].o != OK {
			t.Fatalf("result %+v", got[0])
		}
		releaseCall(task, r)
	}
	h.stopAndWait()
}

// A full return ring holds the lane back until the host drains it; no result is lost or
// reordered, and the request ring keeps taking calls meanwhile.
func TestExecutorWaitsForFullReturnRing(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) { e.Local = true })
	const calls = fastpath.Slots + 8
	var recs []*Record[int, int]
	for n := range calls {
		r := startCall(t, task, context.Background(), n, 1, 0)
		recs = append(recs, r)
		// The request ring has as many slots as the return ring: wait for the lane to take
		// each burst before reserving past it.
		if n == fastpath.Slots {
			eventually(t, "the lane took the first burst", func() bool { return h.region.Requests().Consumer().Peek() == 0 })
		}
		h.send(callSlot{id: r.ID, gen: r.Gen.Load()})
	}
	// One call more than the return ring holds has run; its result waits for a slot.
	eventually(t, "the lane blocked on a full return ring", func() bool {
		return h.region.Stats().Snapshot().Completed == fastpath.Slots+1
	})
	if h.ret.Poll() != 1<<fastpath.Slots-1 {
		t.Fatalf("return ring %#x, want full", h.ret.Poll())
	}
	got := h.receive(calls)
	for k, res := range got {
		if res.id != recs[k].ID || res.o != OK {
			t.Fatalf("result %d: %+v, want call %d ok", k, res, recs[k].ID)
		}
	}
	for _, r := range recs {
		releaseCall(task, r)
	}
	h.stopAndWait()
}

// A process lane whose return ring stays full parks (fastpath.Wake.ParkRoom) instead of
// spinning on a core while the host does not drain; once the host drains, it goes on, and
// no result is lost or reordered.
func TestExecutorParksOnFullReturnRing(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := startExecutor(t, fastpath.Layout{Arena: 4096, AbortBits: 1}, []Def{task}, nil)
	in := func(n int) []byte { b, _ := task.InCodec.Append(nil, n); return b }
	const calls = fastpath.Slots + 8
	for n := range calls {
		if n == fastpath.Slots { // wait for the lane to take the first burst
			eventually(t, "the lane took the first burst", func() bool { return h.region.Requests().Consumer().Peek() == 0 })
		}
		h.send(callSlot{payload: in(n)})
	}
	eventually(t, "the lane parked on its full return ring", h.wake.WaitingForRoom)
	if c := h.region.Stats().Snapshot().Completed; c != fastpath.Slots+1 {
		t.Fatalf("%d calls ran before the lane parked, want %d", c, fastpath.Slots+1)
	}
	got := h.receive(calls)
	for k, res := range got {
		if out, err := task.OutCdc.Decode(res.payload); res.o != OK || err != nil || out != 2*k {
			t.Fatalf("result %d: %v %v %v, want %d", k, res.o, out, err, 2*k)
		}
	}
	h.stopAndWait()
}

// executorSettler settles an executor's results as a lane does, and checks that each
// settles before the next call runs.
type executorSettler struct {
	owner   uint64
	ran     *atomic.Int32 // calls run so far
	settled atomic.Int32
	bad     atomic.Value
}

func (s *executorSettler) SettleResult(r Result) error {
	if n, ran := s.settled.Add(1), s.ran.Load(); n != ran {
		s.bad.Store(fmt.Errorf("result %d settled after %d calls ran, want right after its own", n, ran))
	}
	return r.Def.SettleResult(s.owner, r.Key, r.ID, r.Gen, r.Outcome, r.Payload, true, r.Ran, testWrapper{})
}

// A goroutine lane settles its results itself (Host) right after each call: calls settle
// with nobody reading the return ring, and none is published on it.
func TestExecutorDrain(t *testing.T) {
	var ran atomic.Int32
	task := defineTest(t, func(ctx context.Context, n int) (int, error) {
		ran.Add(1)
		return double(ctx, n)
	}, Options{})
	const owner, lane = 9, 3
	settler := &executorSettler{owner: owner, ran: &ran}
	var corrupt atomic.Value
	h := startExecutor(t, fastpath.Layout{Arena: 64, AbortBits: 1}, []Def{task}, func(e *Executor) {
		var mu sync.Mutex
		e.Local, e.Corrupt = true, func(err error) { corrupt.Store(err) }
		e.Host = NewHostRing(RingConfig{Mu: &mu, Key: lane, Backlog: 1, Returns: e.Region.Returns().Consumer(),
			Tasks: []Def{task}, Settle: settler})
	})
	var recs []*Record[int, int]
	for n := range 5 {
		r := startCall(t, task, context.Background(), n, owner, lane)
		recs = append(recs, r)
		h.stage(callSlot{id: r.ID, gen: r.Gen.Load()})
	}
	h.flush()
	for _, r := range recs {
		<-r.Done()
		if r.Out != 2*r.In || r.Err != nil {
			t.Fatalf("call %d: %v, %v", r.In, r.Out, r.Err)
		}
		task.Records.Release(r)
		// The lane drops its own reference right after settling, which may be after the
		// caller has woken and released its own.
		eventually(t, "the record is free after settle and both releases", func() bool { return isFree(r) })
	}
	h.stopAndWait()
	if err, _ := settler.bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if err, _ := corrupt.Load().(error); err != nil {
		t.Fatal(err)
	}
	if n := settler.settled.Load(); n != 5 {
		t.Fatalf("%d results settled, want 5", n)
	}
	if h.ret.Poll() != 0 {
		t.Fatalf("results published on the return ring: %#x", h.ret.Poll())
	}
}

// A lane whose calls come one at a time (OneAtATime single-call batches in a row) polls for
// the next for SpinOne, as a node's lane does for a host calling it sequentially: a call
// published without ringing it is still taken. Before the streak, and after a larger
// batch, it parks as soon as it is out of calls (Spin is off here).
func TestExecutorSpinsForCallsOneAtATime(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (int, error) { return n + 1, nil }, Options{})
	const owner, lane = 5, 2
	h := startExecutor(t, fastpath.Layout{Inline: 64, Arena: 64}, []Def{task}, func(e *Executor) {
		e.Local, e.Spin, e.SpinOne = true, -1, time.Hour // no spin but SpinOne's, which never runs out here
	})
	var n int
	call := func(ring bool) { // a single call, published, rung or not, and its result
		t.Helper()
		r := startCall(t, task, context.Background(), n, owner, lane)
		n++
		h.stage(callSlot{fn: 0, id: r.ID, gen: r.Gen.Load()})
		if ring {
			h.flush()
		} else {
			h.req.Flush()
		}
		res := h.receive(1)[0]
		if err := task.SettleResult(owner, lane, res.id, res.gen, res.o, res.payload, true, 0, testWrapper{}); err != nil {
			t.Fatal(err)
		}
		<-r.Done()
		task.Records.Release(r)
	}
	parks := func(what string) { // the lane parks: its wake word says so
		t.Helper()
		deadline := time.Now().Add(time.Minute) // a watchdog against a hang, not a speed claim
		for awake, _ := h.wake.Awake(); awake; awake, _ = h.wake.Awake() {
			if time.Now().After(deadline) {
				t.Fatalf("the lane still polls %s", what)
			}
			runtime.Gosched()
		}
	}
	singles := func() { // single calls short of a streak: the lane parks after each
		t.Helper()
		for k := 1; k < OneAtATime; k++ {
			call(true)
			parks(fmt.Sprintf("after %d single calls in a row", k))
		}
	}
	singles()
	// A batch of two ends the streak.
	for range 2 {
		r := startCall(t, task, context.Background(), n, owner, lane)
		n++
		h.stage(callSlot{fn: 0, id: r.ID, gen: r.Gen.Load()})
		defer func() { <-r.Done(); task.Records.Release(r) }()
	}
	h.flush()
	for _, res := range h.receive(2) {
		if err := task.SettleResult(owner, lane, res.id, res.gen, res.o, res.payload, true, 0, testWrapper{}); err != nil {
			t.Fatal(err)
		}
	}
	parks("after a batch of two calls")
	singles()
	call(true) // the streak: the lane polls from now on
	call(false)
	call(false)
	h.stopAndWait()
}
