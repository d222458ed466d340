package actors

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// Tests of the record table: allocation, generations, reference counts and Held. They
// drive a Table as the pool does (Alloc, Start, the lane's Lane store, Release by each
// holder) without a pool.

var testTaskSeq atomic.Uint64

// defineTest registers a fresh task for one test: task names are global and unique, and a
// fresh task has a fresh record table.
func defineTest[In, Out any](t testing.TB, fn func(context.Context, In) (Out, error), opts Options) *Task[In, Out] {
	t.Helper()
	name := fmt.Sprintf("test.actors.%s.%d", t.Name(), testTaskSeq.Add(1))
	return Define(name, fn, opts)
}

func double(_ context.Context, n int) (int, error) { return 2 * n, nil }

// startCall allocates and starts a call of owner, held by lane (-1: in a backlog), the way
// Task.Call and lane.accept do: the record then holds the caller's and the dispatch
// references.
func startCall[In, Out any](t testing.TB, task *Task[In, Out], ctx context.Context, in In, owner uint64, lane int32) *Record[In, Out] {
	t.Helper()
	r, err := task.Records.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx, in, owner)
	r.Lane.Store(lane)
	return r
}

// isFree reports whether r is free for the next Alloc.
func isFree[In, Out any](r *Record[In, Out]) bool { return r.refs.free() }

// nextAlloc takes the next record from table and gives it straight back (it is never
// started: the state of the table is otherwise unchanged).
func nextAlloc[In, Out any](t testing.TB, table *Table[In, Out]) *Record[In, Out] {
	t.Helper()
	r, err := table.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	r.refs.Store(1)
	table.Release(r)
	return r
}

func TestTableGenerationBumpsOnReuse(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 7, 0)
	id, gen := r.ID, r.Gen.Load()
	if got := task.Records.Get(id); got != r {
		t.Fatalf("Get(%d) = %p, want the allocated record %p", id, got, r)
	}
	r.Resolve(2)
	<-r.Done()
	task.Records.Release(r) // dispatch
	if isFree(r) {
		t.Fatal("record is free while the caller still holds it")
	}
	task.Records.Release(r) // caller
	if !isFree(r) {
		t.Fatal("record is not free after both holders let go")
	}
	if got := r.Gen.Load(); got != gen+1 {
		t.Fatalf("generation after release = %d, want %d", got, gen+1)
	}
	if r.Out != 0 || r.Err != nil || r.ctx != nil || r.fut != nil {
		t.Fatalf("a free record keeps its last call: out %v err %v ctx %v", r.Out, r.Err, r.ctx)
	}
	again := startCall(t, task, context.Background(), 2, 7, 0)
	if again != r || again.ID != id {
		t.Fatalf("reuse gave record %d, want %d back from the free list", again.ID, id)
	}
	if again.Gen.Load() != gen+1 {
		t.Fatalf("reused record has generation %d, want %d", again.Gen.Load(), gen+1)
	}
	// A lane still naming the old generation finds the record stale: nothing runs.
	ran := false
	probe := defineTest(t, func(_ context.Context, n int) (int, error) { ran = true; return n, nil }, Options{})
	p := startCall(t, probe, context.Background(), 1, 7, 0)
	oldGen := p.Gen.Load()
	releaseCall(probe, p)
	p = startCall(t, probe, context.Background(), 1, 7, 0)
	if o := probe.RunLocal(p.ID, oldGen); o != Stale || ran {
		t.Fatalf("RunLocal of an older generation: outcome %v, ran %v; want stale and not run", o, ran)
	}
	if o := probe.RunLocal(p.ID, p.Gen.Load()); o != OK || !ran || p.LaneOut != 1 {
		t.Fatalf("RunLocal of the current generation: outcome %v, ran %v, out %v", o, ran, p.LaneOut)
	}
}

// releaseCall settles r if it is pending and lets go of both its references.
func releaseCall[In, Out any](task *Task[In, Out], r *Record[In, Out]) {
	if r.Fail(errors.New("test: released")) {
		<-r.Done()
	}
	task.Records.Release(r)
	task.Records.Release(r)
}

// A record returns to the free list only when every holder has let go: while one still
// holds it, allocation hands out other records, whichever holder lets go first (the lane,
// settling the call; or the caller, which gave up before the lane's result came).
func TestTableReleaseWaitsForEveryHolder(t *testing.T) {
	for _, callerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("callerFirst=%v", callerFirst), func(t *testing.T) {
			task := defineTest(t, double, Options{})
			r := startCall(t, task, context.Background(), 1, 1, 0)
			gen := r.Gen.Load()
			payload, _ := task.OutCdc.Append(nil, 2)
			lane := func() {
				if err := task.SettleResult(1, 0, r.ID, gen, OK, payload, false, 0, testWrapper{}); err != nil {
					t.Fatal(err)
				}
			}
			caller := func() { task.Records.Release(r) }
			first, second := lane, caller
			if callerFirst {
				r.Fail(errors.New("caller gave up"))
				first, second = caller, lane
			}
			first()
			if n := nextAlloc(t, &task.Records); n == r {
				t.Fatal("a record still held by one side was handed out again")
			}
			<-r.Done()
			if r.Gen.Load() != gen || isFree(r) {
				t.Fatalf("a held record changed: gen %d->%d, free %v", gen, r.Gen.Load(), isFree(r))
			}
			if callerFirst && r.Err == nil || !callerFirst && r.Out != 2 {
				t.Fatalf("result %v, %v", r.Out, r.Err)
			}
			second()
			if !isFree(r) || r.Gen.Load() != gen+1 {
				t.Fatal("record not free after the last holder let go")
			}
		})
	}
}

// The refcount is exact: three holders (caller, dispatch, a future's context hook) need
// three releases.
func TestTableReleaseCountsReferences(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 1, 0)
	r.refs.Add(1) // a third holder, as Attach adds for a context hook
	for i := range 2 {
		task.Records.Release(r)
		if isFree(r) {
			t.Fatalf("free after %d of 3 releases", i+1)
		}
	}
	task.Records.Release(r)
	if !isFree(r) {
		t.Fatal("not free after 3 of 3 releases")
	}
}

func TestTableAllocFull(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 1, 0)
	// Pretend every record of the table exists and is in flight: allocating 4 M records of
	// real memory would prove nothing more.
	task.Records.mu.Lock()
	task.Records.n = maxRecords
	task.Records.mu.Unlock()
	_, err := task.Records.Alloc()
	if err == nil {
		t.Fatal("Alloc on a full table succeeded")
	}
	if want := fmt.Sprintf("more than %d calls in flight on one task", maxRecords); !strings.Contains(err.Error(), want) {
		t.Fatalf("full-table error %q does not say %q", err, want)
	}
	// A call that ends makes room again.
	releaseCall(task, r)
	got, err := task.Records.Alloc()
	if err != nil || got != r {
		t.Fatalf("Alloc after a release: %v, %v; want the released record", got, err)
	}
}

// Get never returns a record for an index that names none: hostile indexes from a slot.
func TestTableGetHostileIndex(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 1, 0)
	defer releaseCall(task, r)
	for _, id := range []uint32{r.ID + 1, firstLevel - 1, firstLevel, 3*firstLevel - 1, 3 * firstLevel, 5000, maxRecords - 1, maxRecords, 1<<32 - firstLevel, 1<<32 - 1} {
		if got := task.Records.Get(id); got != nil {
			t.Errorf("Get(%d) = record %d, want nil", id, got.ID)
		}
	}
	if o := task.RunLocal(1<<32-1, 0); o != Stale {
		t.Errorf("RunLocal of a hostile index: %v, want stale", o)
	}
}

// Held visits exactly the records that one lane of one owner holds.
func TestTableHeld(t *testing.T) {
	task := defineTest(t, double, Options{})
	type holder struct {
		owner uint64
		lane  int32
	}
	holders := []holder{{1, 0}, {1, 0}, {1, 1}, {2, 0}, {1, -1}, {1, fenced}, {1, 0}}
	var recs []*Record[int, int]
	want := map[uint32]bool{}
	for i, h := range holders {
		r := startCall(t, task, context.Background(), i, h.owner, h.lane)
		recs = append(recs, r)
		if h == (holder{1, 0}) {
			want[r.ID] = true
		}
	}
	// A call of (1, 0) that settled and left the lane (Lane -1) and was freed is not held.
	gone := startCall(t, task, context.Background(), 99, 1, 0)
	gone.Resolve(0)
	<-gone.Done()
	gone.Lane.Store(-1)
	task.Records.Release(gone)
	task.Records.Release(gone)

	got := map[uint32]bool{}
	task.Records.Held(1, 0, func(r *Record[int, int]) {
		if got[r.ID] {
			t.Errorf("record %d visited twice", r.ID)
		}
		got[r.ID] = true
	})
	if len(got) != len(want) {
		t.Errorf("Held(1, 0) visited %v, want %v", got, want)
	}
	for id := range want {
		if !got[id] {
			t.Errorf("Held(1, 0) missed record %d", id)
		}
	}
	n := 0
	task.Records.Held(3, 0, func(*Record[int, int]) { n++ })
	if n != 0 {
		t.Errorf("Held of an owner with no calls visited %d records", n)
	}
	for _, r := range recs {
		releaseCall(task, r)
	}
}

// The cache of free records may drop them all (sync.Pool does at a garbage collection):
// a dropped record is still free, and Alloc finds it again rather than making a new one.
func TestTableFindsDroppedRecords(t *testing.T) {
	task := defineTest(t, double, Options{})
	var recs []*Record[int, int]
	for i := range 200 {
		recs = append(recs, startCall(t, task, context.Background(), i, 1, 0))
	}
	for _, r := range recs {
		releaseCall(task, r)
	}
	runtime.GC() // the first moves the cache to its victim, the second drops it
	runtime.GC()
	r, err := task.Records.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	task.Records.mu.Lock()
	n := task.Records.n
	task.Records.mu.Unlock()
	if n != 200 || r.ID >= 200 {
		t.Fatalf("Alloc after the cache dropped 200 free records made record %d (table of %d), want one of them", r.ID, n)
	}
}

// A record the cache holds twice (a scan took it while it was cached, and it was freed
// again) goes to one taker only.
func TestTableCachedTwiceTakenOnce(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 1, 0)
	releaseCall(task, r)
	task.Records.cache.Put(r) // now cached twice
	a, err := task.Records.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	b, err := task.Records.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatalf("record %d handed out twice", a.ID)
	}
}

// AllocN takes distinct free records, from the free ones first; Reuse readies a settled
// record its caller alone holds for another call (a new generation), and refuses one the
// dispatch side still holds.
func TestTableAllocNAndReuse(t *testing.T) {
	task := defineTest(t, double, Options{})
	first := make([]*Record[int, int], 40)
	if n, err := task.Records.AllocN(first); n != len(first) || err != nil {
		t.Fatalf("AllocN: %d, %v", n, err)
	}
	seen := map[*Record[int, int]]bool{}
	for _, r := range first {
		if seen[r] || isFree(r) {
			t.Fatalf("record %d handed out twice, or free", r.ID)
		}
		seen[r] = true
	}
	for _, r := range first[:20] {
		task.Records.Release(r)
	}
	again := make([]*Record[int, int], 30)
	if n, err := task.Records.AllocN(again); n != len(again) || err != nil {
		t.Fatalf("AllocN: %d, %v", n, err)
	}
	reused := 0
	for _, r := range again {
		if seen[r] {
			reused++
		}
	}
	if reused != 20 {
		t.Errorf("AllocN took %d of the 20 free records first", reused)
	}
	r := first[20]
	r.Start(context.Background(), 1, 1) // caller and dispatch side
	r.Resolve(2)
	<-r.Done()
	if task.Records.Reuse(r) {
		t.Fatal("Reuse took a record the dispatch side still holds")
	}
	gen := r.Gen.Load()
	task.Records.Release(r) // the dispatch side lets go
	if !task.Records.Reuse(r) || r.Gen.Load() != gen+1 || r.Out != 0 || isFree(r) {
		t.Fatalf("Reuse: generation %d (was %d), out %d, free %v", r.Gen.Load(), gen, r.Out, isFree(r))
	}
	task.Records.Release(r)
}
