package knit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

func TestMapInOrder(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		p, err := knit.NewPool(knit.Config{Runtime: rt, Lanes: 2, Logger: quiet()}, mapSquare)
		if err != nil {
			t.Fatal(err)
		}
		in := make([]int, 5000) // more than Map's window and a task's records
		for i := range in {
			in[i] = i
		}
		out, err := mapSquare.Map(context.Background(), p, in)
		if err != nil {
			t.Fatalf("%v: %v", rt, err)
		}
		for i, v := range out {
			if v != i*i {
				t.Fatalf("%v: out[%d] = %d", rt, i, v)
			}
		}
		if out, err := mapSquare.Map(context.Background(), p, nil); err != nil || len(out) != 0 {
			t.Errorf("%v: empty input: %v, %v", rt, out, err)
		}
		_ = p.Close(context.Background())
	}
}

// A Map whose elements partly fail returns every result that succeeded and a *MapError
// naming each element that failed; errors.Is sees their codes.
func TestMapReportsEveryFailure(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 2}, mapSquare)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	in := []int{1, -2, 3, -4, 5}
	out, err := mapSquare.Map(context.Background(), p, in)
	var me *knit.MapError
	if !errors.As(err, &me) || len(me.Failed) != 2 || me.Failed[0].Index != 1 || me.Failed[1].Index != 3 || me.Calls != 5 {
		t.Fatalf("err = %#v", err)
	}
	if !errors.Is(err, knit.ErrTaskError) || errors.Is(err, knit.ErrWorkerCrashed) {
		t.Errorf("errors.Is: %v", err)
	}
	if out[0] != 1 || out[2] != 9 || out[4] != 25 || out[1] != 0 {
		t.Errorf("out = %v", out)
	}
}

// On process lanes, an element that crashes its lane fails with WORKER_CRASHED; the calls
// the lane held that had not started run elsewhere, so every other element succeeds.
func TestMapLaneCrash(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet()}, mapCrash)
	in := make([]int, 200)
	for i := range in {
		in[i] = i
	}
	out, err := mapCrash.Map(context.Background(), p, in)
	var me *knit.MapError
	if !errors.As(err, &me) || !errors.Is(err, knit.ErrWorkerCrashed) {
		t.Fatalf("err = %v, want a MapError with WORKER_CRASHED", err)
	}
	crashed := map[int]bool{}
	for _, f := range me.Failed {
		if f.Err.Code == knit.CodeWorkerCrashed && f.Err.Started {
			crashed[f.Index] = true
		}
	}
	if !crashed[13] {
		t.Errorf("element 13 did not fail with a started WORKER_CRASHED: %v", me.Failed)
	}
	for i, v := range out {
		if v != i*i && !crashed[i] {
			t.Errorf("out[%d] = %d", i, v)
		}
	}
}

// A cancelled context fails the elements not started yet; none is lost.
func TestMapCancelled(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	ctx, cancel := context.WithCancel(context.Background())
	g := newGate()
	in := make([]*gate, 3000)
	for i := range in {
		in[i] = g
	}
	go func() {
		<-g.started // the first element runs and blocks: the rest wait behind it
		cancel()
		close(g.open)
	}()
	_, err := block.Map(ctx, p, in)
	var me *knit.MapError
	if !errors.As(err, &me) || !errors.Is(err, knit.ErrCanceled) || len(me.Failed) == 0 {
		t.Fatalf("err = %v", err)
	}
	for _, f := range me.Failed {
		if f.Err.Code != knit.CodeCanceled {
			t.Errorf("element %d: %v", f.Index, f.Err)
		}
	}
	if _, err := mapSquare.Map(ctx, nil, []int{1}); !errors.Is(err, knit.ErrInvalidArgument) {
		t.Errorf("nil pool: %v", err)
	}
}

// On goroutine lanes a Map allocates per Map, not per element: a Map of 10,000 elements
// allocates no more than one of 100 (give or take one allocation the lanes' own machinery
// may make meanwhile), and a Map's own allocations are a handful.
func TestMapDoesNotAllocatePerElement(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("coverage and the race detector change allocation counts (CI runs this without them)")
	}
	p, err := knit.NewPool(knit.Config{Lanes: 2}, mapSquare)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	allocs := func(n int) float64 {
		in := make([]int, n)
		return testing.AllocsPerRun(20, func() {
			if _, err := mapSquare.Map(context.Background(), p, in); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := allocs(100), allocs(10000)
	if large > small+1 || small > 6 {
		t.Errorf("%.0f allocations for a Map of 100, %.0f for a Map of 10000", small, large)
	}
}

// On pools with a shared submit ring, a Map's chunks go call by call (the ring decides which
// lane takes each): the results are the same.
func TestMapStealing(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		p, err := knit.NewPool(knit.Config{Runtime: rt, Lanes: 2, Steal: knit.StealTicket, Logger: quiet()}, mapSquare)
		if err != nil {
			t.Fatal(err)
		}
		in := make([]int, 3000)
		for i := range in {
			in[i] = i
		}
		out, err := mapSquare.Map(context.Background(), p, in)
		if err != nil {
			t.Fatalf("%v: %v", rt, err)
		}
		for i, v := range out {
			if v != i*i {
				t.Fatalf("%v: out[%d] = %d", rt, i, v)
			}
		}
		_ = p.Close(context.Background())
	}
}

// On process lanes a Map's elements travel in chunks, each one call of the task's twin: a
// Map of 1,000 elements is a handful of calls on the lanes, and its results are the same.
func TestMapChunksOnProcessLanes(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet()}, mapSquare)
	in := make([]int, 1000)
	for i := range in {
		in[i] = i - 10 // ten negative elements fail, each by itself
	}
	out, err := mapSquare.Map(context.Background(), p, in)
	var me *knit.MapError
	if !errors.As(err, &me) || len(me.Failed) != 10 {
		t.Fatalf("err = %v, want 10 failed elements", err)
	}
	for i, f := range me.Failed {
		if f.Index != i || f.Err.Code != knit.CodeTaskError || f.Err.Task != mapSquare.Name() || f.Err.Lane < 0 || f.Err.Lane > 1 {
			t.Errorf("failure %d: element %d: %v", i, f.Index, f.Err)
		}
	}
	for i := 10; i < len(in); i++ {
		if out[i] != in[i]*in[i] {
			t.Fatalf("out[%d] = %d", i, out[i])
		}
	}
	var calls uint64
	for _, l := range p.Stats().Lanes {
		calls += l.TotalCompleted + l.TotalFailed
	}
	if calls == 0 || calls > uint64(len(in))/32 {
		t.Errorf("the lanes ran %d calls for a Map of %d elements, want a few chunks", calls, len(in))
	}
}

// MaxCallsPerLane counts a Map chunk's elements, not the one call of the task's twin that
// carries them: a Map of 1,000 elements (8 chunks) recycles a lane that may take 500 calls.
func TestMapChunkCountsForRecycling(t *testing.T) {
	recycled := make(chan knit.Event, 1)
	p := newProcessPool(t, knit.Config{Lanes: 1, MaxCallsPerLane: 500, Logger: quiet(), OnEvent: func(e knit.Event) {
		if e.To == knit.StateRecycling {
			select {
			case recycled <- e:
			default:
			}
		}
	}}, mapSquare)
	in := make([]int, 1000)
	if _, err := mapSquare.Map(context.Background(), p, in); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-recycled:
		t.Logf("recycled: %s", e.Reason)
	case <-time.After(time.Minute): // the request was made before Map returned: a bound, not a wait
		t.Fatalf("no recycle after a Map of %d elements, MaxCallsPerLane 500: %+v", len(in), p.Stats().Tasks)
	}
}

// When a lane dies running a chunk, the chunk's elements that had started fail as the calls
// it was running would (WORKER_CRASHED, started), and the rest run by themselves: no element
// after the one that crashed the lane fails. An Idempotent task's elements all run again,
// and only the one that crashes every lane fails.
func TestMapChunkLaneCrashIsPrecise(t *testing.T) {
	mapCrashIsPrecise(t, 200, 13, func(task *knit.Task[int, int]) *knit.Pool {
		return newProcessPool(t, knit.Config{Lanes: 2, Logger: quiet()}, task)
	})
}

// The same on a stealing pool of process lanes, where a chunk sent while others are in flight
// reaches its lane through the shared submit ring (the host grants it to the lane's own ring).
func TestMapChunkLaneCrashIsPreciseStealing(t *testing.T) {
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		mapCrashIsPrecise(t, 2000, 1500, func(task *knit.Task[int, int]) *knit.Pool {
			return newProcessPool(t, knit.Config{Lanes: 2, Steal: mode, Logger: quiet()}, task)
		})
	}
}

// mapCrashIsPrecise is TestMapChunkLaneCrashIsPrecise on the pools newPool makes: a Map of
// n elements whose element at crashes its lane.
func mapCrashIsPrecise(t *testing.T, n, at int, newPool func(*knit.Task[int, int]) *knit.Pool) {
	t.Helper()
	in := make([]int, n)
	for i := range in {
		in[i] = i + 14 // 13 crashes the lane
	}
	in[at] = 13
	for _, task := range []*knit.Task[int, int]{mapCrash, mapCrashIdempotent} {
		p := newPool(task)
		out, err := task.Map(context.Background(), p, in)
		var me *knit.MapError
		if !errors.As(err, &me) {
			t.Fatalf("%s: err = %v, want a MapError", task.Name(), err)
		}
		failed := map[int]bool{}
		for _, f := range me.Failed {
			failed[f.Index] = true
			if f.Err.Code != knit.CodeWorkerCrashed && f.Err.Code != knit.CodePoisonCall {
				t.Errorf("%s: element %d: %v", task.Name(), f.Index, f.Err)
			}
			if f.Index > at {
				t.Errorf("%s: element %d failed: it started after the lane died", task.Name(), f.Index)
			}
		}
		if !failed[at] || task == mapCrashIdempotent && len(me.Failed) != 1 {
			t.Errorf("%s: failed %v", task.Name(), me.Failed)
		}
		for i, v := range out {
			if v != in[i]*in[i] && !failed[i] {
				t.Errorf("%s: out[%d] = %d", task.Name(), i, v)
			}
		}
	}
}

// A chunk's result holds at most half the call limit before its lane stops starting
// elements: the rest run by themselves, and every result arrives. An element whose result
// no longer fits fails PAYLOAD_TOO_LARGE, or runs again by itself if the task is Idempotent.
func TestMapChunkResultLimit(t *testing.T) {
	const limit = 16 << 10
	in := []int{5000, 12000}
	for range 40 {
		in = append(in, 3000)
	}
	for _, task := range []*knit.Task[int, []byte]{mapBig, mapBigIdempotent} {
		p := newProcessPool(t, knit.Config{Lanes: 1, Payload: knit.Payload{MaxCall: limit}, Logger: quiet()}, task)
		out, err := task.Map(context.Background(), p, in)
		var me *knit.MapError
		switch {
		case task == mapBigIdempotent && err != nil:
			t.Errorf("%s: %v", task.Name(), err)
		case task == mapBig && (!errors.As(err, &me) || len(me.Failed) != 1 || me.Failed[0].Index != 1 ||
			me.Failed[0].Err.Code != knit.CodePayloadTooLarge):
			t.Errorf("%s: err = %v, want element 1 to fail PAYLOAD_TOO_LARGE", task.Name(), err)
		}
		for i, v := range out {
			if len(v) != in[i] && !(task == mapBig && i == 1) {
				t.Errorf("%s: out[%d] has %d bytes, want %d", task.Name(), i, len(v), in[i])
			}
		}
	}
}
