package actors

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// Tests of the LocalLane, driven the way the pool's lane drives it (lane.go in the root,
// submitLocal): count the call, name the lane in its record, push; and on a push that
// finds the lane ended, take the call back with a CAS on its record's Lane field.

const localKey int32 = 7

// localOwner is the pool's side of a LocalLane in these tests.
type localOwner struct {
	held    atomic.Int32
	closing atomic.Bool
	idle    atomic.Int32 // Idle calls
	done    atomic.Int32 // CallDone calls
}

func (o *localOwner) Idle()                                   { o.idle.Add(1) }
func (o *localOwner) CallDone()                               { o.done.Add(1) }
func (o *localOwner) Wrap(_ Def, oc Outcome, err error) error { return &wrapped{o: oc, err: err} }

type localHarness struct {
	t      *testing.T
	key    int32
	x      *LocalLane
	owner  *localOwner
	region *fastpath.Region
	ended  chan struct{}
	err    error // Run's error, once ended is closed
	exited bool  // the lane goroutine ended without Run returning (Goexit)
}

func newLocalHarness(t *testing.T, cfg LocalConfig) *localHarness {
	t.Helper()
	layout := fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	o := &localOwner{}
	if cfg.Key == 0 {
		cfg.Key = localKey
	}
	cfg.Owner, cfg.Held, cfg.Closing, cfg.Region = o, &o.held, &o.closing, region
	if cfg.Capacity == 0 {
		cfg.Capacity = 1 << 20
	}
	if cfg.Group != nil {
		region.Open().Store(1) // as the pool's lane.Open does
	}
	return &localHarness{t: t, key: cfg.Key, x: NewLocalLane(cfg), owner: o, region: region, ended: make(chan struct{})}
}

// start runs the lane on a goroutine of its own; the test stops it at its end if it still
// runs.
func (h *localHarness) start() *localHarness {
	go func() {
		returned := false
		defer func() {
			h.exited = !returned
			close(h.ended)
		}()
		h.err = h.x.Run()
		returned = true
	}()
	h.t.Cleanup(func() {
		select {
		case <-h.ended:
		default:
			h.stop()
		}
	})
	return h
}

// stop asks the lane to stop and waits for it to end.
func (h *localHarness) stop() {
	h.region.Stop().Store(fastpath.StopRequested)
	h.x.Nudge()
	<-h.ended
}

// submit queues r as the pool does; false: the lane had ended, and r was taken back.
func submit[In, Out any](h *localHarness, r *Record[In, Out]) bool {
	h.owner.held.Add(1)
	r.Lane.Store(h.key)
	if h.x.Push(r, h.owner.held.Load() > 1) {
		return true
	}
	if !r.Lane.CompareAndSwap(h.key, -1) {
		return true // the lane's end has it
	}
	h.owner.held.Add(-1)
	return false
}

// await returns r's result once it has settled, and lets go of the caller's reference.
func await[In, Out any](t *testing.T, task *Task[In, Out], r *Record[In, Out]) (Out, error) {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("call did not settle")
	}
	out, err := r.Out, r.Err
	task.Records.Release(r)
	return out, err
}

// Calls pushed in a burst run once each, oldest first, and settle with their results; the
// lane counts them, and its owner's count of held calls goes back to zero.
func TestLocalLaneRunsCallsInOrder(t *testing.T) {
	var order []int // appended by the lane goroutine only
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		order = append(order, n)
		return 2 * n, nil
	}, Options{})
	h := newLocalHarness(t, LocalConfig{})
	const n = 500
	rs := make([]*Record[int, int], n)
	for i := range rs { // pushed before the lane runs: one batch, newest on top
		rs[i] = startCall(t, task, context.Background(), i, 1, -1)
		if !submit(h, rs[i]) {
			t.Fatal("push refused by a running lane")
		}
	}
	h.start()
	for i, r := range rs {
		if out, err := await(t, task, r); err != nil || out != 2*i {
			t.Fatalf("call %d: %d, %v", i, out, err)
		}
	}
	h.stop()
	for i, v := range order {
		if v != i {
			t.Fatalf("call %d ran in place %d: order %v", v, i, order[:min(len(order), 20)])
		}
	}
	if len(order) != n {
		t.Fatalf("%d calls ran, want %d", len(order), n)
	}
	if got := h.region.Stats().Snapshot().Completed; got != n {
		t.Fatalf("Completed = %d, want %d", got, n)
	}
	if h.owner.held.Load() != 0 || h.owner.idle.Load() == 0 {
		t.Fatalf("held %d, idle %d", h.owner.held.Load(), h.owner.idle.Load())
	}
	if h.err != nil || h.region.Stop().Load() != fastpath.StopAcknowledged {
		t.Fatalf("Run: %v, stop word %d", h.err, h.region.Stop().Load())
	}
}

// Submitters on many goroutines, each waiting for one call at a time or pushing bursts, with
// the lane parking and waking in between: every call runs exactly once, each submitter's
// calls in its order.
func TestLocalLaneManySubmitters(t *testing.T) {
	const submitters, calls = 4, 3000
	var ran [submitters][]int // appended by the lane goroutine only
	type in struct{ from, n int }
	task := defineTest(t, func(_ context.Context, v in) (int, error) {
		ran[v.from] = append(ran[v.from], v.n)
		return v.n + 1, nil
	}, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	var wg sync.WaitGroup
	for s := range submitters {
		wg.Go(func() {
			burst := 1 + s*3 // submitter 0 waits for each call; the others push bursts
			for i := 0; i < calls; i += burst {
				var rs []*Record[in, int]
				for k := i; k < min(i+burst, calls); k++ {
					r := startCall(t, task, context.Background(), in{s, k}, 1, -1)
					if !submit(h, r) {
						t.Error("push refused by a running lane")
						return
					}
					rs = append(rs, r)
				}
				for k, r := range rs {
					if out, err := await(t, task, r); err != nil || out != i+k+1 {
						t.Errorf("submitter %d call %d: %d, %v", s, i+k, out, err)
						return
					}
				}
				if i%7 == 0 {
					runtime.Gosched() // let the lane run dry and park now and then
				}
			}
		})
	}
	wg.Wait()
	h.stop()
	for s := range submitters {
		if len(ran[s]) != calls {
			t.Fatalf("submitter %d: %d calls ran, want %d", s, len(ran[s]), calls)
		}
		for i, v := range ran[s] {
			if v != i {
				t.Fatalf("submitter %d: call %d ran in place %d", s, v, i)
			}
		}
	}
}

// An idle lane sleeps on its bell with the asleep mark in head; a push hands the call over
// on the bell, and a stop request with a Nudge ends the lane.
func TestLocalLaneSleepsAndStops(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	for i := range 50 {
		waitFor(t, "the lane to sleep", func() bool { return h.x.head.Load() == localAsleep })
		r := startCall(t, task, context.Background(), i, 1, -1)
		submit(h, r)
		if out, err := await(t, task, r); err != nil || out != 2*i {
			t.Fatalf("call %d: %d, %v", i, out, err)
		}
	}
	waitFor(t, "the lane to sleep", func() bool { return h.x.head.Load() == localAsleep })
	h.stop()
	if h.err != nil || h.region.Stop().Load() != fastpath.StopAcknowledged {
		t.Fatalf("Run: %v, stop word %d", h.err, h.region.Stop().Load())
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// holdZero defines a task whose call with input 0 says it has started and blocks until
// release (which may be called more than once); other inputs return at once. A test
// registers release as a cleanup after starting its lanes, so that it runs before their
// cleanups wait for them to end.
func holdZero(t *testing.T) (task *Task[int, int], started <-chan struct{}, release func()) {
	hold, start := make(chan struct{}), make(chan struct{}, 1)
	task = defineTest(t, func(_ context.Context, n int) (int, error) {
		if n == 0 {
			start <- struct{}{}
			<-hold
		}
		return n, nil
	}, Options{})
	return task, start, sync.OnceFunc(func() { close(hold) })
}

// A lane asked to stop runs the calls it has first, then acknowledges; a push after its
// end is refused once the queue is sealed, and its submitter takes the call back.
func TestLocalLaneStopAfterQueuedCalls(t *testing.T) {
	task, started, release := holdZero(t)
	h := newLocalHarness(t, LocalConfig{}).start()
	t.Cleanup(release) // a failed test: let the lane end
	rs := []*Record[int, int]{startCall(t, task, context.Background(), 0, 1, -1)}
	submit(h, rs[0])
	<-started
	for i := 1; i <= 3; i++ {
		r := startCall(t, task, context.Background(), i, 1, -1)
		submit(h, r)
		rs = append(rs, r)
	}
	h.region.Stop().Store(fastpath.StopRequested)
	h.x.Nudge() // the lane is busy: nothing to wake
	release()
	for i, r := range rs {
		if out, err := await(t, task, r); err != nil || out != i {
			t.Fatalf("call %d: %d, %v", i, out, err)
		}
	}
	<-h.ended
	if h.err != nil || h.region.Stop().Load() != fastpath.StopAcknowledged {
		t.Fatalf("Run: %v, stop word %d", h.err, h.region.Stop().Load())
	}
	h.x.Seal()
	late := startCall(t, task, context.Background(), 9, 1, -1)
	if submit(h, late) {
		t.Fatal("a sealed lane took a call")
	}
	if late.Lane.Load() != -1 || h.owner.held.Load() != 0 {
		t.Fatalf("refused call: lane %d, held %d", late.Lane.Load(), h.owner.held.Load())
	}
	releaseCall(task, late)
}

// A panicking task fails its call with the panic and the lane serves on; with Panic set
// the lane ends with the panic instead, and the call stays the lane's, marked running.
func TestLocalLanePanic(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		if n < 0 {
			panic(fmt.Sprintf("bad %d", n))
		}
		return n, nil
	}, Options{})
	t.Run("fails the call", func(t *testing.T) {
		h := newLocalHarness(t, LocalConfig{}).start()
		for i := range 3 {
			r := startCall(t, task, context.Background(), -1, 1, -1)
			submit(h, r)
			_, err := await(t, task, r)
			w := wrappedOf(t, err)
			var pe *PanicError
			if w.o != Panicked || !errors.As(w.err, &pe) || pe.Value != "bad -1" || len(pe.Stack) == 0 {
				t.Fatalf("panicking call %d: %v", i, err)
			}
			ok := startCall(t, task, context.Background(), i, 1, -1)
			submit(h, ok)
			if out, err := await(t, task, ok); err != nil || out != i {
				t.Fatalf("call after a panic: %d, %v", out, err)
			}
		}
		if got := h.region.Stats().Snapshot(); got.Failed != 3 || got.Completed != 3 {
			t.Fatalf("counters %+v, want 3 failed and 3 completed", got)
		}
	})
	t.Run("crashes the lane", func(t *testing.T) {
		h := newLocalHarness(t, LocalConfig{Panic: true}).start()
		r := startCall(t, task, context.Background(), -2, 1, -1)
		submit(h, r)
		<-h.ended
		var pe *PanicError
		if !errors.As(h.err, &pe) || pe.Value != "bad -2" {
			t.Fatalf("Run: %v, want the task's panic", h.err)
		}
		if h.x.Running() != LocalCall(r) || !r.Pending() || r.Lane.Load() != localKey {
			t.Fatalf("running %v, pending %v, lane %d", h.x.Running(), r.Pending(), r.Lane.Load())
		}
		releaseCall(task, r)
	})
}

// A task that calls runtime.Goexit ends the lane goroutine in the middle of its call:
// Running names that call afterwards.
func TestLocalLaneGoexit(t *testing.T) {
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		if n < 0 {
			runtime.Goexit()
		}
		return n, nil
	}, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	ok := startCall(t, task, context.Background(), 1, 1, -1)
	submit(h, ok)
	if out, err := await(t, task, ok); err != nil || out != 1 {
		t.Fatalf("call: %d, %v", out, err)
	}
	r := startCall(t, task, context.Background(), -1, 1, -1)
	submit(h, r)
	<-h.ended
	if !h.exited || h.x.Running() != LocalCall(r) || !r.Pending() {
		t.Fatalf("exited %v, running %v, pending %v", h.exited, h.x.Running(), r.Pending())
	}
	releaseCall(task, r)
}

// A call the host fenced while the lane ran it (the lane was abandoned, and FailLane
// settled it) is the host's: the lane neither settles it nor counts it nor lets go of it.
func TestLocalLaneFencedCall(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		started <- struct{}{}
		<-release
		return n, nil
	}, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	r := startCall(t, task, context.Background(), 5, 1, -1)
	submit(h, r)
	<-started
	end := newLaneEnd(1, localKey, 0, false)
	end.Local = true
	if n := task.FailLane(end.LaneEnd); n != 1 {
		t.Fatalf("FailLane found %d calls, want 1", n)
	}
	<-r.Done()
	endErrOf(t, r.Err) // settled by the host, with the lane's end error
	close(release)
	h.stop()
	if h.owner.held.Load() != 1 || h.owner.idle.Load() != 0 {
		t.Fatalf("the lane counted a fenced call: held %d, idle %d", h.owner.held.Load(), h.owner.idle.Load())
	}
	if r.Lane.Load() != fenced || r.refs.Load() != 2 {
		t.Fatalf("fenced call: lane %d, refs %d; want fenced and both references kept", r.Lane.Load(), r.refs.Load())
	}
}

// Pushes racing with the lane's end: every call either runs, or is found by the end's
// FailLane and requeued (it never started), or is taken back by its submitter. None is
// lost, none is handled twice.
func TestLocalLaneEndRacesSubmitters(t *testing.T) {
	var ran atomic.Int64
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		ran.Add(1)
		return n, nil
	}, Options{})
	for round := range 30 {
		h := newLocalHarness(t, LocalConfig{}).start()
		ran.Store(0)
		var refused atomic.Int64
		var mu sync.Mutex
		var pushed []*Record[int, int]
		var wg sync.WaitGroup
		stopAt := make(chan struct{})
		for s := range 3 {
			wg.Go(func() {
				for i := range 200 {
					if s == 0 && i == 20 {
						close(stopAt) // the lane stops while every submitter pushes
					}
					r := startCall(t, task, context.Background(), i, 1, -1)
					if submit(h, r) {
						mu.Lock()
						pushed = append(pushed, r)
						mu.Unlock()
					} else {
						refused.Add(1)
						releaseCall(task, r)
					}
				}
			})
		}
		<-stopAt
		h.region.Stop().Store(fastpath.StopRequested)
		h.x.Nudge()
		<-h.ended
		h.x.Seal()
		end := newLaneEnd(1, localKey, 0, true)
		end.Local = true
		end.Running = h.x.Running()
		held := task.FailLane(end.LaneEnd)
		wg.Wait()
		requeued := map[uint32]bool{}
		for _, rt := range end.retries {
			requeued[rt.ID] = true
		}
		if len(requeued) != held {
			t.Fatalf("round %d: FailLane held %d calls, requeued %d", round, held, len(requeued))
		}
		settled := 0
		for _, r := range pushed {
			switch {
			case requeued[r.ID]:
				if !r.Pending() || r.Lane.Load() != -1 {
					t.Fatalf("round %d: requeued call: pending %v lane %d", round, r.Pending(), r.Lane.Load())
				}
				releaseCall(task, r)
			default:
				if _, err := await(t, task, r); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				settled++
			}
		}
		if int64(settled) != ran.Load() || settled+held+int(refused.Load()) != 600 {
			t.Fatalf("round %d: %d ran, %d settled, %d requeued, %d refused", round, ran.Load(), settled, held, refused.Load())
		}
		if got := h.owner.held.Load(); got != int32(held) {
			t.Fatalf("round %d: held count %d, want the %d FailLane found", round, got, held)
		}
	}
}

// A full lane's error carries a Space to wait on with BlockWhenFull, closed once a call has
// settled (or the lane is sealed); without it, a closed one.
func TestLocalLaneFull(t *testing.T) {
	release := make(chan struct{})
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		<-release
		return n, nil
	}, Options{})
	space := func(err error) <-chan struct{} {
		var full *BacklogFull
		if !errors.As(err, &full) {
			t.Fatalf("Full: %v", err)
		}
		return full.Space
	}
	open := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	h := newLocalHarness(t, LocalConfig{Capacity: 1}).start()
	r := startCall(t, task, context.Background(), 1, 1, -1)
	submit(h, r)
	if !open(space(h.x.Full())) {
		t.Fatal("without BlockWhenFull there is nothing to wait for")
	}
	close(release)
	await(t, task, r)

	release = make(chan struct{})
	b := newLocalHarness(t, LocalConfig{Capacity: 1, BlockWhenFull: true}).start()
	r = startCall(t, task, context.Background(), 2, 1, -1)
	submit(b, r)
	sp := space(b.x.Full())
	if open(sp) {
		t.Fatal("Space open while the lane is full")
	}
	close(release)
	await(t, task, r)
	select {
	case <-sp:
	case <-time.After(10 * time.Second):
		t.Fatal("Space not closed after the call settled")
	}
	b.owner.held.Add(1) // full again, as if a call were held
	sp = space(b.x.Full())
	b.stop()
	b.x.Seal()
	if !open(sp) || !open(space(b.x.Full())) {
		t.Fatal("Space not closed once the lane is sealed")
	}
}

// A lane stuck in a call with calls waiting behind it: a peer of its group that has run dry
// takes them (once the stuck lane has finished none for stallAfter) and runs them, while the
// stuck call goes on; the calls are the peer's from then on, in its count.
func TestLocalGroupStealsFromStuckLane(t *testing.T) {
	task, started, release := holdZero(t)
	g := NewLocalGroup(false)
	a := newLocalHarness(t, LocalConfig{Key: 1, Group: g}).start()
	t.Cleanup(release) // a failed test: let the stuck lane end
	stuck := startCall(t, task, context.Background(), 0, 1, -1)
	submit(a, stuck)
	<-started
	b := newLocalHarness(t, LocalConfig{Key: 2, Group: g}).start() // it cannot take the stuck call now
	var waiting []*Record[int, int]
	for i := 1; i <= 5; i++ {
		r := startCall(t, task, context.Background(), i, 1, -1)
		submit(a, r)
		waiting = append(waiting, r)
	}
	// b has run dry long ago, and parked: the next call it gets wakes it, and when it has
	// run that one it hunts.
	kick := startCall(t, task, context.Background(), 9, 1, -1)
	submit(b, kick)
	if out, err := await(t, task, kick); err != nil || out != 9 {
		t.Fatalf("call on the free lane: %d, %v", out, err)
	}
	for _, r := range waiting {
		if out, err := await(t, task, r); err != nil || out == 0 {
			t.Fatalf("waiting call: %d, %v", out, err)
		}
	}
	if got := b.x.Claimed(); got != 5 {
		t.Fatalf("the free lane claimed %d calls, want the 5 waiting", got)
	}
	if a.owner.held.Load() != 1 || b.owner.held.Load() != 0 {
		t.Fatalf("held: stuck lane %d (want its 1 call), free lane %d", a.owner.held.Load(), b.owner.held.Load())
	}
	release()
	if out, err := await(t, task, stuck); err != nil || out != 0 {
		t.Fatalf("stuck call: %d, %v", out, err)
	}
}

// A thief racing its victim's end: every call the victim held runs once, on the victim or
// the thief, or is found by the victim's end (FailLane) and requeued; none is lost, none is
// both.
func TestLocalGroupStealRacesVictimEnd(t *testing.T) {
	var ran sync.Map
	var exit chan struct{}
	started := make(chan struct{}, 1)
	task := defineTest(t, func(ctx context.Context, n int) (int, error) {
		if n < 0 {
			started <- struct{}{}
			<-exit
			runtime.Goexit()
		}
		if _, dup := ran.LoadOrStore(n, true); dup {
			return 0, fmt.Errorf("call %d ran twice", n)
		}
		return n, nil
	}, Options{})
	stolen, requeuedAll := uint64(0), 0
	for round := range 40 {
		exit = make(chan struct{})
		g := NewLocalGroup(false)
		a := newLocalHarness(t, LocalConfig{Key: 1, Group: g}).start()
		dying := startCall(t, task, context.Background(), -1, 1, -1)
		submit(a, dying)
		<-started
		b := newLocalHarness(t, LocalConfig{Key: 2, Group: g}).start() // it cannot take the dying call now
		var rs []*Record[int, int]
		for i := range 40 {
			r := startCall(t, task, context.Background(), round*1000+i, 1, -1)
			submit(a, r)
			rs = append(rs, r)
		}
		kick := startCall(t, task, context.Background(), round*1000+999, 1, -1)
		submit(b, kick) // b wakes, runs it, runs dry and hunts while a dies
		if round%2 == 1 {
			waitFor(t, "a steal", func() bool { return b.x.Claimed() > 0 })
		}
		close(exit)
		<-a.ended
		a.x.Seal()
		end := newLaneEnd(1, 1, 0, true)
		end.Local = true
		end.Running = a.x.Running()
		task.FailLane(end.LaneEnd)
		requeued := map[uint32]bool{}
		for _, rt := range end.retries {
			requeued[rt.ID] = true
		}
		if _, err := await(t, task, kick); err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if requeued[r.ID] {
				if !r.Pending() {
					t.Fatalf("round %d: call %d both requeued and settled", round, r.In)
				}
				releaseCall(task, r)
				continue
			}
			want := r.In
			if out, err := await(t, task, r); err != nil || out != want {
				t.Fatalf("round %d: call %d: %d, %v", round, want, out, err)
			}
		}
		<-dying.Done()
		endErrOf(t, dying.Err) // the call it died in fails with the lane's end
		task.Records.Release(dying)
		stolen += b.x.Claimed()
		requeuedAll += len(requeued)
		b.stop()
	}
	if stolen == 0 || requeuedAll == 0 {
		t.Fatalf("over 40 rounds %d calls were stolen and %d requeued: the race was not run", stolen, requeuedAll)
	}
}

// Batches pushed with PushBatch run once each, in order, batch after batch, whether the lane
// sleeps (the first batch is handed over on its bell) or is busy (the next ones go on its
// stack); each call of a batch settles its Batch, whose last call wakes the waiter once.
func TestLocalLanePushBatch(t *testing.T) {
	var order []int // appended by the lane goroutine only
	task := defineTest(t, func(_ context.Context, n int) (int, error) {
		order = append(order, n)
		return 2 * n, nil
	}, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	done := NewBatchDone()
	const batches, per = 20, 17
	bs := make([]Batch, batches)
	rs := make([]*Record[int, int], 0, batches*per)
	for b := range batches {
		bs[b].Reset(per, done)
		calls := make([]LocalCall, per)
		for i := range per {
			r, err := task.Records.Alloc()
			if err != nil {
				t.Fatal(err)
			}
			r.StartIn(context.Background(), b*per+i, 1, &bs[b])
			rs = append(rs, r)
			calls[i] = r
		}
		h.owner.held.Add(per)
		NameLane(calls, h.key)
		if !h.x.PushBatch(calls, h.owner.held.Load() > per) {
			t.Fatal("a running lane refused a batch")
		}
		if b == 0 {
			bs[0].Wait() // the lane parks again before the next batches
			runtime.Gosched()
		}
	}
	for b := range bs {
		bs[b].Wait()
	}
	for i, r := range rs {
		if r.Pending() || r.Out != 2*i || r.Err != nil {
			t.Fatalf("call %d: pending %v, %d, %v", i, r.Pending(), r.Out, r.Err)
		}
		if !task.Records.Reuse(r) {
			t.Fatalf("call %d: its record is still held by the lane after it settled", i)
		}
		task.Records.Release(r)
	}
	if len(order) != len(rs) {
		t.Fatalf("%d calls ran, want %d", len(order), len(rs))
	}
	for i, n := range order {
		if n != i {
			t.Fatalf("call %d ran in place %d: %v", n, i, order)
		}
	}
	if h.owner.held.Load() != 0 {
		t.Fatalf("the owner still counts %d calls", h.owner.held.Load())
	}
}

// A batch pushed onto an ended lane is refused whole, and each of its calls is taken back
// with TakeBack.
func TestLocalLanePushBatchEnded(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := newLocalHarness(t, LocalConfig{}).start()
	h.stop()
	h.x.Seal()
	var calls []LocalCall
	for i := range 3 {
		r := startCall(t, task, context.Background(), i, 1, -1)
		calls = append(calls, r)
	}
	NameLane(calls, h.key)
	if h.x.PushBatch(calls, false) {
		t.Fatal("an ended lane took a batch")
	}
	for i, c := range calls {
		if !TakeBack(c, h.key) {
			t.Errorf("call %d could not be taken back", i)
		}
	}
}
