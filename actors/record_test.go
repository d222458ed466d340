package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// Tests of a call record's life: settling once, SettleResult's binding of a result to the
// lane that holds the call, and FailLane's sorting of a dead lane's calls.

func TestRecordSettlesOnce(t *testing.T) {
	task := defineTest(t, double, Options{})
	r := startCall(t, task, context.Background(), 1, 1, 0)
	if !r.Pending() {
		t.Fatal("a started call is not pending")
	}
	if !r.Resolve(5) {
		t.Fatal("first settle lost")
	}
	if r.Pending() {
		t.Fatal("a settled call is pending")
	}
	if r.Fail(errors.New("late")) || r.Resolve(6) || r.SettleLane(nil) {
		t.Fatal("a second settle won")
	}
	<-r.Done()
	select {
	case <-r.Done():
		t.Fatal("Done delivered a second token")
	default:
	}
	if r.Out != 5 || r.Err != nil {
		t.Fatalf("result %v, %v; want the first settle's 5, nil", r.Out, r.Err)
	}
	task.Records.Release(r)
	task.Records.Release(r)
}

// Many goroutines settling one call at once: exactly one wins, and the result is the
// winner's.
func TestRecordConcurrentSettle(t *testing.T) {
	task := defineTest(t, double, Options{})
	const racers = 16
	for range 50 {
		r := startCall(t, task, context.Background(), 1, 1, 0)
		var wins atomic.Int32
		winner := make(chan int, racers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				var won bool
				switch i % 3 {
				case 0:
					won = r.Resolve(i)
				case 1:
					won = r.Fail(fmt.Errorf("racer %d", i))
				default:
					won = r.SettleLane(fmt.Errorf("racer %d", i))
				}
				if won {
					wins.Add(1)
					winner <- i
				}
			}()
		}
		start.Done()
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%d settles won, want exactly 1", wins.Load())
		}
		<-r.Done()
		w := <-winner
		switch w % 3 {
		case 0:
			if r.Out != w || r.Err != nil {
				t.Fatalf("winner %d resolved, result %v, %v", w, r.Out, r.Err)
			}
		default:
			if r.Err == nil || r.Err.Error() != fmt.Sprintf("racer %d", w) {
				t.Fatalf("winner %d failed, result %v, %v", w, r.Out, r.Err)
			}
		}
		task.Records.Release(r)
		task.Records.Release(r)
	}
}

// testWrapper stands in for the pool's Wrapper: it keeps the outcome and the lane's error.
type testWrapper struct{}

type wrapped struct {
	o   Outcome
	err error
}

func (w *wrapped) Error() string { return fmt.Sprintf("%v: %v", w.o, w.err) }
func (w *wrapped) Unwrap() error { return w.err }

func (testWrapper) Wrap(_ Def, o Outcome, err error) error { return &wrapped{o: o, err: err} }

func wrappedOf(t *testing.T, err error) *wrapped {
	t.Helper()
	var w *wrapped
	if !errors.As(err, &w) {
		t.Fatalf("error %v (%T) did not go through the Wrapper", err, err)
	}
	return w
}

func TestSettleResultEncoded(t *testing.T) {
	task := defineTest(t, func(_ context.Context, s string) (string, error) { return s, nil }, Options{})
	enc := func(s string) []byte { b, _ := task.OutCdc.Append(nil, s); return b }
	corrupt := []byte{0xff, 0xff, 0xff}
	cases := []struct {
		name    string
		o       Outcome
		payload []byte
		check   func(t *testing.T, out string, err error)
	}{
		{"ok", OK, enc("hello"), func(t *testing.T, out string, err error) {
			if out != "hello" || err != nil {
				t.Fatalf("result %q, %v", out, err)
			}
		}},
		{"failed", Failed, EncodeWireError(nil, "SOME_CODE", "it broke"), func(t *testing.T, _ string, err error) {
			w := wrappedOf(t, err)
			var we WireError
			if w.o != Failed || !errors.As(err, &we) || we.Code != "SOME_CODE" || we.Message != "it broke" {
				t.Fatalf("failed call settled with %v", err)
			}
		}},
		{"failed, report does not decode", Failed, corrupt, func(t *testing.T, _ string, err error) {
			if w := wrappedOf(t, err); w.o != BadOutput || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("corrupt error report settled with %v", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startCall(t, task, context.Background(), "in", 3, 4)
			if err := task.SettleResult(3, 4, r.ID, r.Gen.Load(), c.o, c.payload, false, 0, testWrapper{}); err != nil {
				t.Fatalf("SettleResult: %v", err)
			}
			<-r.Done()
			c.check(t, r.Out, r.Err)
			if r.Lane.Load() != -1 {
				t.Fatalf("settled call still on lane %d", r.Lane.Load())
			}
			if isFree(r) || r.refs.Load() != 1 {
				t.Fatalf("after the lane's settle: %d references, want the caller's alone", r.refs.Load())
			}
			task.Records.Release(r)
		})
	}
	// An OK result whose value does not decode fails the call as BadOutput.
	num := defineTest(t, double, Options{})
	r := startCall(t, num, context.Background(), 1, 3, 4)
	if err := num.SettleResult(3, 4, r.ID, r.Gen.Load(), OK, []byte{1, 2, 3}, false, 0, testWrapper{}); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if w := wrappedOf(t, r.Err); w.o != BadOutput || !errors.Is(r.Err, ErrCorrupt) {
		t.Fatalf("undecodable value settled with %v", r.Err)
	}
	num.Records.Release(r)
}

func TestSettleResultLocal(t *testing.T) {
	boom := errors.New("boom")
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		if n < 0 {
			return 0, boom
		}
		return n + 1, nil
	}, Options{})
	r := startCall(t, task, context.Background(), 1, 3, 4)
	o := task.RunLocal(r.ID, r.Gen.Load())
	if err := task.SettleResult(3, 4, r.ID, r.Gen.Load(), o, nil, true, 0, testWrapper{}); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if o != OK || r.Out != 2 || r.Err != nil {
		t.Fatalf("local call: %v, %v, %v", o, r.Out, r.Err)
	}
	task.Records.Release(r)

	r = startCall(t, task, context.Background(), -1, 3, 4)
	o = task.RunLocal(r.ID, r.Gen.Load())
	if err := task.SettleResult(3, 4, r.ID, r.Gen.Load(), o, nil, true, 0, testWrapper{}); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if w := wrappedOf(t, r.Err); o != Failed || w.o != Failed || !errors.Is(r.Err, boom) {
		t.Fatalf("local failed call: %v, %v", o, r.Err)
	}
	task.Records.Release(r)
}

// A result is bound to the (owner, lane, id, generation) that holds the call: any other is
// refused as the work of a broken or hostile lane, settles nothing and drops no reference.
func TestSettleResultRefusesForeignResult(t *testing.T) {
	task := defineTest(t, double, Options{})
	// An older generation of the same record.
	old := startCall(t, task, context.Background(), 1, 3, 4)
	oldGen := old.Gen.Load()
	releaseCall(task, old)
	r := startCall(t, task, context.Background(), 1, 3, 4)
	if r != old {
		t.Fatal("record not reused")
	}
	gen := r.Gen.Load()
	backlog := startCall(t, task, context.Background(), 1, 3, -1)
	payload, _ := task.OutCdc.Append(nil, 42)
	cases := []struct {
		name   string
		owner  uint64
		lane   int32
		id     uint32
		gen    uint32
		target *Record[int, int]
	}{
		{"older generation", 3, 4, r.ID, oldGen, r},
		{"newer generation", 3, 4, r.ID, gen + 1, r},
		{"another lane", 3, 5, r.ID, gen, r},
		{"another pool", 2, 4, r.ID, gen, r},
		{"call in a backlog", 3, 4, backlog.ID, backlog.Gen.Load(), backlog},
		{"no such call", 3, 4, 1 << 20, 0, nil},
		{"hostile index", 3, 4, 1<<32 - 1, 0, nil},
	}
	for _, c := range cases {
		err := task.SettleResult(c.owner, c.lane, c.id, c.gen, OK, payload, false, 0, testWrapper{})
		if err == nil {
			t.Errorf("%s: result accepted", c.name)
		}
		if c.target != nil && (!c.target.Pending() || c.target.refs.Load() != 2) {
			t.Errorf("%s: refused result touched the call (pending %v, %d references)", c.name, c.target.Pending(), c.target.refs.Load())
		}
	}
	// The holding lane's result still settles it.
	if err := task.SettleResult(3, 4, r.ID, gen, OK, payload, false, 0, testWrapper{}); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if r.Out != 42 {
		t.Fatalf("result %v", r.Out)
	}
	// A second result for the call it no longer holds is refused too.
	if err := task.SettleResult(3, 4, r.ID, gen, OK, payload, false, 0, testWrapper{}); err == nil {
		t.Error("a second result for a settled call was accepted")
	}
	task.Records.Release(r)
	releaseCall(task, backlog)
}

// A call whose caller gave up is settled by the caller's context, not by the lane's late
// failure (the context's rules apply: timeout, TimeoutDefault); the lane's reference is
// still dropped.
func TestSettleResultAfterCallerGaveUp(t *testing.T) {
	task := defineTest(t, double, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	r := startCall(t, task, ctx, 1, 3, 4)
	cancel()
	report := EncodeWireError(nil, "", "context canceled")
	if err := task.SettleResult(3, 4, r.ID, r.Gen.Load(), Failed, report, false, 0, testWrapper{}); err != nil {
		t.Fatal(err)
	}
	if !r.Pending() {
		t.Fatalf("the lane's late failure settled the call: %v", r.Err)
	}
	if r.refs.Load() != 1 || r.Lane.Load() != -1 {
		t.Fatalf("lane reference kept: %d references, lane %d", r.refs.Load(), r.Lane.Load())
	}
	r.Fail(ctx.Err()) // what the caller's context handler does
	<-r.Done()
	task.Records.Release(r)
	if !isFree(r) {
		t.Fatal("record not free")
	}
}

// laneEnd is a LaneEnd whose errors and requeues the test can see.
type laneEnd struct {
	LaneEnd
	retries []Retry
	refuse  bool // Requeue reports that the pool is closing
}

type endErr struct{ started, poison bool }

func (e *endErr) Error() string {
	return fmt.Sprintf("lane died (started %v, poison %v)", e.started, e.poison)
}

func newLaneEnd(owner uint64, lane int32, started uint64, release bool) *laneEnd {
	e := &laneEnd{}
	e.LaneEnd = LaneEnd{Owner: owner, Lane: lane, Started: started, Release: release,
		Err: func(started, poison bool) error { return &endErr{started, poison} },
		Requeue: func(r Retry) bool {
			if e.refuse {
				return false
			}
			e.retries = append(e.retries, r)
			return true
		}}
	return e
}

// publishedAs marks r as published on its lane with sequence number seq (0: not published).
func publishedAs[In, Out any](r *Record[In, Out], seq uint64) *Record[In, Out] {
	r.Seq.Store(seq)
	return r
}

func endErrOf(t *testing.T, err error) *endErr {
	t.Helper()
	var e *endErr
	if !errors.As(err, &e) {
		t.Fatalf("call failed with %v, not the lane's end error", err)
	}
	return e
}

// What a dead lane's calls become: never started → requeued whatever their task; started →
// failed with started=true, unless the task is Idempotent (run again once).
func TestFailLaneSortsCalls(t *testing.T) {
	for _, idem := range []bool{false, true} {
		t.Run(fmt.Sprintf("idempotent=%v", idem), func(t *testing.T) {
			task := defineTest(t, double, Options{Idempotent: idem})
			backlogged := publishedAs(startCall(t, task, context.Background(), 1, 1, 0), 0)
			unstarted := publishedAs(startCall(t, task, context.Background(), 2, 1, 0), 11)
			started := publishedAs(startCall(t, task, context.Background(), 3, 1, 0), 10)
			earlier := publishedAs(startCall(t, task, context.Background(), 4, 1, 0), 9)
			other := publishedAs(startCall(t, task, context.Background(), 5, 1, 1), 3) // another lane
			started.Abort.Store(7)
			e := newLaneEnd(1, 0, 10, true)
			if n := task.FailLane(e.LaneEnd); n != 4 {
				t.Fatalf("FailLane reported %d held calls, want 4", n)
			}
			retried := map[uint32]Retry{}
			for _, rt := range e.retries {
				retried[rt.ID] = rt
			}
			for _, r := range []*Record[int, int]{backlogged, unstarted} {
				rt, ok := retried[r.ID]
				if !ok {
					t.Fatalf("never-started call %d not requeued", r.In)
				}
				if rt.Gen != r.Gen.Load() || rt.Def != Def(task) || rt.Lane != &r.Lane || rt.Seq != &r.Seq {
					t.Fatalf("retry of call %d names another call: %+v", r.In, rt)
				}
				if !r.Pending() || r.Lane.Load() != -1 || r.Seq.Load() != 0 || r.refs.Load() != 2 || r.deaths != 0 {
					t.Fatalf("requeued call %d: pending %v lane %d seq %d refs %d deaths %d", r.In, r.Pending(), r.Lane.Load(), r.Seq.Load(), r.refs.Load(), r.deaths)
				}
			}
			for _, r := range []*Record[int, int]{started, earlier} {
				if idem {
					if _, ok := retried[r.ID]; !ok || !r.Pending() || r.deaths != 1 || r.Lane.Load() != -1 || r.Abort.Load() != -1 {
						t.Fatalf("started idempotent call %d: requeued %v pending %v deaths %d lane %d abort %d",
							r.In, ok, r.Pending(), r.deaths, r.Lane.Load(), r.Abort.Load())
					}
					continue
				}
				if _, ok := retried[r.ID]; ok {
					t.Fatalf("started call %d of a non-idempotent task was requeued", r.In)
				}
				<-r.Done()
				if ee := endErrOf(t, r.Err); !ee.started || ee.poison {
					t.Fatalf("started call %d failed with %+v, want started and not poison", r.In, ee)
				}
				if r.refs.Load() != 1 || r.Lane.Load() != -1 {
					t.Fatalf("failed call %d: %d references, lane %d; want the caller's only, lane -1", r.In, r.refs.Load(), r.Lane.Load())
				}
			}
			if !other.Pending() || other.Lane.Load() != 1 || other.refs.Load() != 2 {
				t.Fatal("FailLane touched a call of another lane")
			}
			// A retry that cannot be placed fails through Fail, which lets go of the record.
			for _, rt := range e.retries {
				rt.Fail(errors.New("no lane"))
			}
			for _, r := range []*Record[int, int]{backlogged, unstarted, started, earlier} {
				if r.Pending() {
					t.Fatalf("call %d still pending", r.In)
				}
				if _, ok := retried[r.ID]; ok { // the others' tokens were taken above
					<-r.Done()
				}
				task.Records.Release(r)
				if !isFree(r) {
					t.Fatalf("call %d not free after the caller let go", r.In)
				}
			}
			releaseCall(task, other)
		})
	}
}

// An Idempotent call runs again once; started on a second lane that dies too, it is poison.
func TestFailLanePoisonAfterSecondDeath(t *testing.T) {
	task := defineTest(t, double, Options{Idempotent: true})
	r := publishedAs(startCall(t, task, context.Background(), 1, 1, 0), 5)
	first := newLaneEnd(1, 0, 5, true)
	task.FailLane(first.LaneEnd)
	if len(first.retries) != 1 || !r.Pending() {
		t.Fatalf("first death: %d retries, pending %v", len(first.retries), r.Pending())
	}
	// The pool places it on lane 1, where it starts.
	r.Lane.Store(1)
	r.Seq.Store(2)
	second := newLaneEnd(1, 1, 2, true)
	task.FailLane(second.LaneEnd)
	if len(second.retries) != 0 {
		t.Fatal("a call that started on two dead lanes was requeued")
	}
	<-r.Done()
	if ee := endErrOf(t, r.Err); !ee.started || !ee.poison {
		t.Fatalf("second death failed the call with %+v, want started and poison", ee)
	}
	task.Records.Release(r)
	if !isFree(r) {
		t.Fatal("poisoned call's record not released")
	}

	// Had it not started on the second lane, it would run again: the poison counts starts.
	r = publishedAs(startCall(t, task, context.Background(), 2, 1, 0), 5)
	task.FailLane(newLaneEnd(1, 0, 5, true).LaneEnd)
	r.Lane.Store(1)
	r.Seq.Store(3)
	third := newLaneEnd(1, 1, 2, true)
	task.FailLane(third.LaneEnd)
	if len(third.retries) != 1 || !r.Pending() {
		t.Fatalf("a call that never started on its second lane: %d retries, pending %v", len(third.retries), r.Pending())
	}
	third.retries[0].Fail(errors.New("done"))
	<-r.Done()
	task.Records.Release(r)
}

// With an exact end (a lane that runs its calls in order and says which it was running), a
// call before the one running had finished, its result lost: it runs again without counting
// a death, so a second death does not make it poison; the running one counts as before.
// Without Exact, every started call counts.
func TestFailLaneExactCountsTheRunningCallOnly(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact=%v", exact), func(t *testing.T) {
			task := defineTest(t, double, Options{Idempotent: true})
			finished := publishedAs(startCall(t, task, context.Background(), 1, 1, 0), 4)
			running := publishedAs(startCall(t, task, context.Background(), 2, 1, 0), 5)
			e := newLaneEnd(1, 0, 5, true)
			e.Exact = exact
			task.FailLane(e.LaneEnd)
			if len(e.retries) != 2 || !finished.Pending() || !running.Pending() {
				t.Fatalf("%d retries, want both calls requeued", len(e.retries))
			}
			if want := map[bool]uint8{false: 1, true: 0}[exact]; finished.deaths != want || running.deaths != 1 {
				t.Fatalf("deaths: finished %d (want %d), running %d (want 1)", finished.deaths, want, running.deaths)
			}
			// Both start on lane 1, which dies running the second of them.
			for i, r := range []*Record[int, int]{finished, running} {
				r.Lane.Store(1)
				r.Seq.Store(uint64(2 + i))
			}
			second := newLaneEnd(1, 1, 3, true)
			second.Exact = exact
			task.FailLane(second.LaneEnd)
			<-running.Done()
			if ee := endErrOf(t, running.Err); !ee.poison {
				t.Fatalf("the call running at both deaths failed with %+v, want poison", ee)
			}
			if exact {
				if len(second.retries) != 1 || !finished.Pending() {
					t.Fatalf("a call that had finished before both deaths: %d retries, pending %v", len(second.retries), finished.Pending())
				}
				second.retries[0].Fail(errors.New("done"))
			}
			<-finished.Done()
			if !exact {
				if ee := endErrOf(t, finished.Err); !ee.poison {
					t.Fatalf("without Exact, a call started at both deaths failed with %+v, want poison", ee)
				}
			}
			task.Records.Release(finished)
			task.Records.Release(running)
		})
	}
}

// Calls that cannot run again fail instead: the pool is closing, the caller gave up, or the
// call already settled.
func TestFailLaneNoRequeue(t *testing.T) {
	task := defineTest(t, double, Options{Idempotent: true})
	closing := publishedAs(startCall(t, task, context.Background(), 1, 1, 0), 0)
	e := newLaneEnd(1, 0, 0, true)
	e.refuse = true
	task.FailLane(e.LaneEnd)
	<-closing.Done()
	if ee := endErrOf(t, closing.Err); ee.started || ee.poison {
		t.Fatalf("unplaced never-started call failed with %+v, want not started", ee)
	}
	task.Records.Release(closing)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gaveUp := publishedAs(startCall(t, task, ctx, 2, 1, 0), 0)
	e = newLaneEnd(1, 0, 0, true)
	task.FailLane(e.LaneEnd)
	if len(e.retries) != 0 {
		t.Fatal("a call whose caller gave up was requeued")
	}
	<-gaveUp.Done()
	task.Records.Release(gaveUp)

	settled := publishedAs(startCall(t, task, context.Background(), 3, 1, 0), 0)
	settled.Resolve(9) // e.g. by its caller's timeout
	e = newLaneEnd(1, 0, 0, true)
	task.FailLane(e.LaneEnd)
	<-settled.Done()
	if len(e.retries) != 0 || settled.Out != 9 || settled.Err != nil {
		t.Fatalf("settled call: %d retries, result %v, %v", len(e.retries), settled.Out, settled.Err)
	}
	task.Records.Release(settled)
	for _, r := range []*Record[int, int]{closing, gaveUp, settled} {
		if !isFree(r) {
			t.Fatalf("call %d not released", r.In)
		}
	}
}

// A lane that may still be running (abandoned) keeps its records: its calls fail, and the
// records are fenced, never reused, never seen again by Held.
func TestFailLaneAbandoned(t *testing.T) {
	task := defineTest(t, double, Options{Idempotent: true})
	r := publishedAs(startCall(t, task, context.Background(), 1, 1, 0), 0)
	e := newLaneEnd(1, 0, 0, false)
	if n := task.FailLane(e.LaneEnd); n != 1 || len(e.retries) != 0 {
		t.Fatalf("abandoned lane: %d held, %d retries", n, len(e.retries))
	}
	<-r.Done()
	endErrOf(t, r.Err)
	task.Records.Release(r) // the caller
	if isFree(r) || r.Lane.Load() != fenced {
		t.Fatalf("abandoned lane's record: free %v, lane %d; want kept and fenced", isFree(r), r.Lane.Load())
	}
	if n := nextAlloc(t, &task.Records); n == r {
		t.Fatal("a fenced record was handed out again")
	}
	if n := task.FailLane(e.LaneEnd); n != 0 {
		t.Fatalf("a second FailLane for the lane found %d calls", n)
	}
}
