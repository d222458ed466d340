package knit

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/remote"
)

// A node packs a frame's run of quick calls of one task into a chunk of its twin, and splits
// the chunk's result into theirs: these tests drive a node's session directly (no network),
// with its lanes process lanes of this test binary.

var (
	// packSquare squares its input; 13 kills its lane process mid-call.
	packSquare = Define("test.node.pack.square", func(_ context.Context, x int) (int, error) {
		if x == 13 {
			os.Exit(3)
		}
		return x * x, nil
	})
	// packBytes answers n zero bytes.
	packBytes = Define("test.node.pack.bytes", func(_ context.Context, n int) ([]byte, error) { return make([]byte, n), nil })
)

// packOut is a node lane's LaneOut that keeps what the lane sends its host.
type packOut struct {
	mu      sync.Mutex
	results map[uint64]remote.Result
	more    chan struct{}
	ended   chan remote.Ended
}

func newPackOut() *packOut {
	return &packOut{results: map[uint64]remote.Result{}, more: make(chan struct{}, 1), ended: make(chan remote.Ended, 1)}
}

func (o *packOut) Result(r remote.Result) { o.Results([]remote.Result{r}) }

func (o *packOut) Results(rs []remote.Result) {
	o.mu.Lock()
	for _, r := range rs {
		r.Payload = bytes.Clone(r.Payload)
		o.results[r.Seq] = r
	}
	o.mu.Unlock()
	select {
	case o.more <- struct{}{}:
	default:
	}
}

func (o *packOut) Flush()                {}
func (o *packOut) Ended(e *remote.Ended) { o.ended <- *e }

// await waits for the results of seqs.
func (o *packOut) await(t *testing.T, seqs ...uint64) map[uint64]remote.Result {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		o.mu.Lock()
		got := 0
		for _, s := range seqs {
			if _, ok := o.results[s]; ok {
				got++
			}
		}
		if got == len(seqs) {
			defer o.mu.Unlock()
			return o.results
		}
		o.mu.Unlock()
		select {
		case <-o.more:
		case <-deadline:
			t.Fatalf("%d of %d results after 2 minutes", got, len(seqs))
		}
	}
}

// packSession opens a node session for tasks (and their twins) with a call limit of
// maxCall bytes, and starts its lane 0.
func packSession(t *testing.T, maxCall int, tasks ...actors.Def) (*nodeHost, *nodeLane, *packOut, map[string]uint32) {
	t.Helper()
	n := &node{cfg: NodeConfig{Addr: "test"}, root: zap.NewNop()}
	o := &remote.Open{Reply: "test", Lanes: 1, Inline: 512, Arena: 1 << 20, MaxCall: uint32(maxCall)}
	fns := map[string]uint32{}
	for _, d := range tasks {
		for _, d := range []actors.Def{d, d.(interface{ Twin() actors.Def }).Twin()} {
			fns[d.Name()] = uint32(len(o.Tasks))
			o.Tasks = append(o.Tasks, remote.TaskRef{Name: d.Name(), Fingerprint: d.Fingerprint(), Index: uint32(len(o.Tasks))})
		}
	}
	lh, err := n.session(o)
	if err != nil {
		t.Fatal(err)
	}
	h := lh.(*nodeHost)
	h.packBelow = time.Hour // pack at any pace: a race-built lane's quick call can take longer
	out := newPackOut()
	nl, err := h.StartLane(0, 0, out)
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, nl.(*nodeLane), out, fns
}

func intCall(t *testing.T, seq uint64, fn uint32, x int, noCancel bool) remote.Call {
	t.Helper()
	in, err := packSquare.def.InCodec.Append(nil, x)
	if err != nil {
		t.Fatal(err)
	}
	return remote.Call{Seq: seq, Fn: fn, NoCancel: noCancel, Payload: in}
}

func TestNodePacksQuickCalls(t *testing.T) {
	h, nl, out, fns := packSession(t, 1<<20, packSquare.def)
	fn := fns[packSquare.Name()]
	// The first call runs alone, and tells the task's pace.
	if err := nl.Submit([]remote.Call{intCall(t, 1, fn, 3, true)}); err != nil {
		t.Fatal(err)
	}
	out.await(t, 1)
	if h.raws[fn].pace.Load() == 0 {
		t.Fatal("no pace after a call: the node's lanes do not time their calls")
	}
	frame := func(first uint64, noCancel bool) []remote.Call {
		cs := make([]remote.Call, 40)
		for i := range cs {
			cs[i] = intCall(t, first+uint64(i), fn, int(first)+i, noCancel)
		}
		return cs
	}
	check := func(first uint64) {
		t.Helper()
		seqs := make([]uint64, 40)
		for i := range seqs {
			seqs[i] = first + uint64(i)
		}
		res := out.await(t, seqs...)
		for _, s := range seqs {
			r := res[s]
			v, err := packSquare.def.OutCdc.Decode(r.Payload)
			if actors.Outcome(r.Outcome) != actors.OK || err != nil || v != int(s)*int(s) {
				t.Errorf("call %d: outcome %d, %d, %v; want %d", s, r.Outcome, v, err, s*s)
			}
		}
	}
	// Calls a Cancel may name run alone.
	if err := nl.Submit(frame(100, false)); err != nil {
		t.Fatal(err)
	}
	check(100)
	if n := h.packs.Load(); n != 0 {
		t.Fatalf("%d chunks of calls that may be cancelled", n)
	}
	// Calls nothing interrupts pack.
	if err := nl.Submit(frame(200, true)); err != nil {
		t.Fatal(err)
	}
	check(200)
	if n := h.packs.Load(); n != 1 {
		t.Fatalf("%d chunks for a frame of 40 quick calls, want 1", n)
	}
}

// When the lane dies running a chunk, the node's report names the call it was running as
// the last started, busy: the chunk's calls after it had not started, and run elsewhere.
func TestNodePackedLaneDeath(t *testing.T) {
	h, nl, out, fns := packSession(t, 1<<20, packSquare.def)
	fn := fns[packSquare.Name()]
	if err := nl.Submit([]remote.Call{intCall(t, 1, fn, 3, true)}); err != nil {
		t.Fatal(err)
	}
	out.await(t, 1)
	cs := make([]remote.Call, 20)
	for i := range cs {
		cs[i] = intCall(t, uint64(10+i), fn, 20+i, true)
	}
	cs[7] = intCall(t, 17, fn, 13, true) // the lane dies running call 17
	if err := nl.Submit(cs); err != nil {
		t.Fatal(err)
	}
	var e remote.Ended
	select {
	case e = <-out.ended:
	case <-time.After(2 * time.Minute):
		t.Fatal("no end report")
	}
	if h.packs.Load() != 1 || e.Started != 17 || !e.Busy || e.Normal {
		t.Errorf("chunks %d, end %+v: want one chunk, and call 17 started and running", h.packs.Load(), e)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	for s := range out.results {
		if s >= 10 {
			t.Errorf("a result for call %d of the chunk the lane died running", s)
		}
	}
}

// An element the chunk did not start, its result past half the call limit, runs again
// alone, and every call gets its own result.
func TestNodePackedElementRunsAgainAlone(t *testing.T) {
	h, nl, out, fns := packSession(t, 4096, packBytes.def)
	fn := fns[packBytes.Name()]
	if err := nl.Submit([]remote.Call{intCall(t, 1, fn, 8, true)}); err != nil {
		t.Fatal(err)
	}
	out.await(t, 1)
	cs := make([]remote.Call, 6)
	seqs := make([]uint64, len(cs))
	for i := range cs {
		cs[i], seqs[i] = intCall(t, uint64(10+i), fn, 1500, true), uint64(10+i)
	}
	if err := nl.Submit(cs); err != nil {
		t.Fatal(err)
	}
	res := out.await(t, seqs...)
	for _, s := range seqs {
		r := res[s]
		v, err := packBytes.def.OutCdc.Decode(r.Payload)
		if actors.Outcome(r.Outcome) != actors.OK || err != nil || len(v) != 1500 {
			t.Errorf("call %d: outcome %d, %d bytes, %v", s, r.Outcome, len(v), err)
		}
	}
	if h.packs.Load() != 1 {
		t.Errorf("%d chunks, want 1", h.packs.Load())
	}
}

// A chunk's result is the lane process's writing: an outcome no call answers with, or a
// result that breaks the chunk's framing, fails the calls it names (BadOutput, WORKER_CRASHED)
// rather than reaching the host, which would take the node for a protocol breaker; the
// results before the break go on as they are.
func TestNodeUnpackRefusesBadOutcomes(t *testing.T) {
	entry := func(b []byte, o actors.Outcome, payload string) []byte {
		b = append(b, byte(o))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
		return append(b, payload...)
	}
	ok := entry(binary.LittleEndian.AppendUint32(nil, 3), actors.OK, "a")
	for name, tc := range map[string]struct {
		o       actors.Outcome
		payload []byte
		good    int // results passed on as the lane wrote them, from the first
	}{
		"element outcome": {actors.OK, entry(entry(ok, actors.Failed, "b"), 200, "c"), 2},
		"chunk outcome":   {actors.Withdrawn, nil, 0},
		"short result":    {actors.OK, ok, 1},
		"framing":         {actors.OK, append(entry(ok, actors.OK, "b"), 1, 2), 2},
		// An element the chunk did not start, then a break: it fails too, not left hanging.
		"stale, then framing": {actors.OK, append(entry(ok, actors.Stale, ""), 1, 2), 1},
	} {
		t.Run(name, func(t *testing.T) {
			out := newPackOut()
			nl := &nodeLane{h: &nodeHost{n: &node{root: zap.NewNop()}}, l: &lane{}, out: out, bySeq: map[uint64]*rawRec{}}
			nl.unpack(&rawDef{}, []uint64{1, 2, 3}, nil, tc.o, 0, tc.payload)
			if len(out.results) != 3 {
				t.Fatalf("%d results for 3 calls", len(out.results))
			}
			for i, seq := range []uint64{1, 2, 3} {
				r := out.results[seq]
				bad := actors.Outcome(r.Outcome) == actors.BadOutput && strings.Contains(string(r.Payload), string(CodeWorkerCrashed))
				if i < tc.good == bad {
					t.Errorf("call %d: outcome %d, %q", seq, r.Outcome, r.Payload)
				}
			}
		})
	}
}

// A lane fed one call at a time polls for the next, and the node's agent awaits each
// result itself: meanwhile the lane's reaper idles, off the doorbell, so that the lane does
// not ring it (an eventfd write and a wake-up) with every result. A batch afterwards hands
// the results back to the reaper.
func TestNodeAgentDrainsCallsOneAtATime(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("a node's lanes poll only beside a free core (GOMAXPROCS ≥ 2)")
	}
	h, nl, out, fns := packSession(t, 1<<20, packSquare.def)
	fn := fns[packSquare.Name()]
	seq := uint64(0)
	one := func() {
		t.Helper()
		seq++
		if err := nl.Submit([]remote.Call{intCall(t, seq, fn, 2, true)}); err != nil {
			t.Fatal(err)
		}
		if r := out.await(t, seq)[seq]; actors.Outcome(r.Outcome) != actors.OK {
			t.Fatalf("call %d: outcome %d", seq, r.Outcome)
		}
	}
	// A loaded machine can keep the lane from polling (a descheduled spinner parks for a
	// while), and an await can run out: streaks until one ends with the agent awaiting.
	streaks := 0
	awaiting := func() {
		t.Helper()
		for ; !nl.l.agentDrains.Load(); streaks++ {
			if streaks == 20 {
				t.Skipf("the lane did not poll in 20 streaks of calls (%d awaited)", h.awaited.Load())
			}
			for range 2 * actors.OneAtATime {
				one()
			}
		}
	}
	awaiting()
	// The reaper, rung at most once since, idles until kicked.
	deadline := time.Now().Add(time.Minute)
	for !nl.l.idling.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the reaper does not idle while the agent awaits the results")
		}
		awaiting()
		runtime.Gosched()
	}
	// A batch: its results are the reaper's again.
	first := seq + 1
	cs := make([]remote.Call, 40)
	for i := range cs {
		seq++
		cs[i] = intCall(t, seq, fn, i%10, true)
	}
	if err := nl.Submit(cs); err != nil {
		t.Fatal(err)
	}
	if nl.l.agentDrains.Load() {
		t.Fatal("the agent still drains after a batch")
	}
	res := out.await(t, seqsFrom(first, seq)...)
	for i := range cs {
		s := first + uint64(i)
		if v, err := packSquare.def.OutCdc.Decode(res[s].Payload); err != nil || v != i%10*(i%10) {
			t.Errorf("call %d: %d, %v; want %d", s, v, err, i%10*(i%10))
		}
	}
}

func seqsFrom(first, last uint64) []uint64 {
	var s []uint64
	for i := first; i <= last; i++ {
		s = append(s, i)
	}
	return s
}
