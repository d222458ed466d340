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
)

// Tests of Future: settling once through its record, the references it holds (the caller's
// and its context hook's), waiting with a Helper, and FailFuture.

// eventually waits for cond by polling it. The deadline is a watchdog against a hang, not a
// claim about speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		runtime.Gosched()
	}
}

// waitAll calls f.Wait from n goroutines and returns what each got.
func waitAll[Out any](f *Future[Out], n int) (outs []Out, errs []error) {
	outs, errs = make([]Out, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = f.Wait()
		}()
	}
	wg.Wait()
	return outs, errs
}

func TestFutureFailFuture(t *testing.T) {
	f := NewFuture[int]()
	if !f.Pending() {
		t.Fatal("a new future is not pending")
	}
	select {
	case <-f.Done():
		t.Fatal("a new future's Done is closed")
	default:
	}
	boom := errors.New("never started")
	if got := FailFuture(f, boom); got != f {
		t.Fatal("FailFuture returned another future")
	}
	<-f.Done()
	if f.Pending() {
		t.Fatal("a failed future is pending")
	}
	outs, errs := waitAll(f, 8)
	for i := range outs {
		if outs[i] != 0 || errs[i] != boom {
			t.Fatalf("Wait = %v, %v; want 0, %v", outs[i], errs[i], boom)
		}
	}
}

// attached starts a call and attaches a future to it as Task.Go does; cancels counts calls
// of the cancel function, reg is the pool (unless the test brings its own helper): it
// counts the future's registrations for a drainer.
type attached struct {
	r       *Record[int, int]
	f       *Future[int]
	reg     registrations
	cancels atomic.Int32
	expires atomic.Int32
	ctx     context.Context
	cancel  context.CancelFunc
}

func attach(t *testing.T, task *Task[int, int], withExpire bool, help Helper) *attached {
	t.Helper()
	a := &attached{f: NewFuture[int]()}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.r = startCall(t, task, a.ctx, 1, 1, 0)
	var expire func()
	if withExpire {
		expire = func() {
			a.expires.Add(1)
			a.r.Fail(a.ctx.Err()) // what the pool's expire does: settle by the context's rules
		}
	}
	if help == nil {
		help = &a.reg
	}
	a.r.Attach(a.f, a.ctx, func() { a.cancels.Add(1); a.cancel() }, expire, help)
	return a
}

// registrations is a Helper that does not help: it counts Block (less Unblock) and Poll.
type registrations struct{ n, blocks, polls atomic.Int64 }

func (*registrations) Help(Pender) {}
func (g *registrations) Block()    { g.n.Add(1); g.blocks.Add(1) }
func (g *registrations) Unblock()  { g.n.Add(-1) }
func (g *registrations) Poll()     { g.polls.Add(1) }

func TestFutureResolvesOnce(t *testing.T) {
	task := defineTest(t, double, Options{})
	a := attach(t, task, true, nil)
	if !a.f.Pending() || a.r.refs.Load() != 3 {
		t.Fatalf("attached future: pending %v, %d references; want pending, 3 (caller, dispatch, hook)", a.f.Pending(), a.r.refs.Load())
	}
	var outs []int
	var errs []error
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		outs, errs = waitAll(a.f, 8)
	}()
	if !a.r.Resolve(7) || a.r.Resolve(8) || a.r.Fail(errors.New("late")) {
		t.Fatal("settle did not win exactly once")
	}
	<-waited
	for i := range outs {
		if outs[i] != 7 || errs[i] != nil {
			t.Fatalf("Wait = %v, %v; want 7, nil", outs[i], errs[i])
		}
	}
	if a.reg.n.Load() != 0 || a.cancels.Load() != 1 {
		t.Fatalf("after settling: %d registrations for a drainer left, %d cancels; want 0, 1", a.reg.n.Load(), a.cancels.Load())
	}
	// Settled before its context ended: the hook was stopped, and its reference dropped with
	// the caller's. Only the dispatch side holds the record now.
	if a.r.refs.Load() != 1 || a.expires.Load() != 0 {
		t.Fatalf("%d references, %d expires; want 1, 0", a.r.refs.Load(), a.expires.Load())
	}
	if a.ctx.Err() == nil {
		t.Fatal("settling did not cancel the call's context")
	}
	if n := nextAlloc(t, &task.Records); n == a.r {
		t.Fatal("record reused while the dispatch side holds it")
	}
	task.Records.Release(a.r)
	if !isFree(a.r) {
		t.Fatal("record not free after every holder let go")
	}
	// The future keeps its result after its record is reused.
	if out, err := a.f.Wait(); out != 7 || err != nil {
		t.Fatalf("Wait after reuse = %v, %v", out, err)
	}
}

// Racing settles, with the context ending too: exactly one wins, every waiter sees the
// winner's result, the future counts as settled once, and the record is freed exactly
// when its last holder lets go.
func TestFutureConcurrentSettle(t *testing.T) {
	task := defineTest(t, double, Options{})
	const racers = 12
	for range 50 {
		a := attach(t, task, true, nil)
		var wins atomic.Int32
		winners := make(chan int, racers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				switch i % 3 {
				case 0:
					if a.r.Resolve(100 + i) {
						wins.Add(1)
						winners <- 100 + i
					}
				case 1:
					if a.r.Fail(fmt.Errorf("racer %d", i)) {
						wins.Add(1)
						winners <- -i
					}
				default:
					a.cancel() // the context's hook races the settles
				}
			}()
		}
		start.Done()
		outs, errs := waitAll(a.f, 4)
		wg.Wait()
		<-a.f.Done()
		won := int(wins.Load())
		if a.expires.Load() > 0 && a.f.err == context.Canceled {
			won++ // the hook's settle won
		}
		if won != 1 {
			t.Fatalf("%d settles won (%d by racers, %d expires), want exactly 1", won, wins.Load(), a.expires.Load())
		}
		for i := range outs {
			if outs[i] != outs[0] || errs[i] != errs[0] {
				t.Fatalf("waiters disagree: %v, %v and %v, %v", outs[0], errs[0], outs[i], errs[i])
			}
		}
		if wins.Load() == 1 {
			w := <-winners
			if w >= 100 && (outs[0] != w || errs[0] != nil) || w < 0 && (errs[0] == nil || errs[0].Error() != fmt.Sprintf("racer %d", -w)) {
				t.Fatalf("winner %d, future holds %v, %v", w, outs[0], errs[0])
			}
		}
		// The settle winner may be the hook, on its own goroutine, and the hook lets go after
		// its expire returns: wait for both references, dropped last.
		eventually(t, "the caller's and the hook's references dropped", func() bool { return a.r.refs.Load() == 1 })
		if a.reg.n.Load() != 0 || a.cancels.Load() != 1 {
			t.Fatalf("%d registrations for a drainer left, %d cancels after one settle; want 0, 1", a.reg.n.Load(), a.cancels.Load())
		}
		task.Records.Release(a.r)
		if !isFree(a.r) {
			t.Fatal("record not free")
		}
	}
}

// A call whose context ends first is settled by its hook, which holds its own reference
// until it is done: the record is not reused while the hook runs, even after the caller's
// and the lane's references are gone.
func TestFutureExpireHoldsRecord(t *testing.T) {
	task := defineTest(t, double, Options{})
	f := NewFuture[int]()
	ctx, cancel := context.WithCancel(context.Background())
	r := startCall(t, task, ctx, 1, 1, 0)
	gen := r.Gen.Load()
	payload, _ := task.OutCdc.Append(nil, 2)
	inHook := make(chan error, 1)
	expire := func() {
		r.Fail(ctx.Err())
		// The lane's late result arrives while the hook still runs: it drops the dispatch
		// reference and settles nothing.
		if err := task.SettleResult(1, 0, r.ID, gen, OK, payload, false, 0, testWrapper{}); err != nil {
			inHook <- err
			return
		}
		if isFree(r) || nextAlloc(t, &task.Records) == r {
			inHook <- errors.New("record freed while the context hook holds it")
			return
		}
		inHook <- nil
	}
	r.Attach(f, ctx, nil, expire, nil)
	cancel()
	if out, err := f.Wait(); out != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("expired future = %v, %v; want the context's error", out, err)
	}
	if err := <-inHook; err != nil {
		t.Fatal(err)
	}
	eventually(t, "record freed by the hook", func() bool { return isFree(r) })
	if r.Gen.Load() != gen+1 {
		t.Fatalf("generation %d after release, want %d", r.Gen.Load(), gen+1)
	}
}

// helper settles the call while Wait asks for help, as a pool draining results does.
type helper struct {
	calls   atomic.Int32
	pending bool
	settle  func()
}

func (h *helper) Block()   { panic("Wait blocked although its helper settled the call") }
func (h *helper) Unblock() { panic("Unblock without Block") }
func (h *helper) Poll()    {}

func (h *helper) Help(p Pender) {
	h.calls.Add(1)
	h.pending = p.Pending()
	h.settle()
	if p.Pending() {
		panic("settled call still pending for its helper")
	}
}

func TestFutureWaitHelps(t *testing.T) {
	task := defineTest(t, double, Options{})
	h := &helper{}
	a := attach(t, task, false, h)
	h.settle = func() { a.r.Resolve(3) }
	if out, err := a.f.Wait(); out != 3 || err != nil {
		t.Fatalf("Wait = %v, %v", out, err)
	}
	if h.calls.Load() != 1 || !h.pending {
		t.Fatalf("helper called %d times (pending %v), want once for a pending call", h.calls.Load(), h.pending)
	}
	// A settled future needs no help.
	if _, err := a.f.Wait(); err != nil || h.calls.Load() != 1 {
		t.Fatalf("Wait on a settled future asked for help (%d calls)", h.calls.Load())
	}
	if a.r.refs.Load() != 1 {
		t.Fatalf("%d references after settling without a hook, want the dispatch side's 1", a.r.refs.Load())
	}
	task.Records.Release(a.r)
}

// blocker is a Helper whose spin never catches the result: Wait must register (Block)
// before it blocks, and the test settles the call only once it has.
type blocker struct {
	registrations
	blocked chan struct{}
}

func (b *blocker) Block() { b.registrations.Block(); b.blocked <- struct{}{} }

func TestFutureWaitBlocksAfterHelp(t *testing.T) {
	task := defineTest(t, double, Options{})
	b := &blocker{blocked: make(chan struct{}, 1)}
	a := attach(t, task, false, b)
	type result struct {
		out int
		err error
	}
	got := make(chan result, 1)
	go func() {
		out, err := a.f.Wait()
		got <- result{out, err}
	}()
	<-b.blocked // Wait registered for a drainer: now the "drainer" settles the call
	if b.n.Load() != 1 {
		t.Fatalf("%d registrations while Wait blocks, want 1", b.n.Load())
	}
	a.r.Resolve(5)
	if r := <-got; r.out != 5 || r.err != nil {
		t.Fatalf("Wait = %v, %v; want 5, nil", r.out, r.err)
	}
	if b.n.Load() != 0 || b.blocks.Load() != 1 {
		t.Fatalf("after Wait: %d registrations left of %d; want 0 of 1", b.n.Load(), b.blocks.Load())
	}
	task.Records.Release(a.r)
}

func TestFutureDoneRegistersUntilSettled(t *testing.T) {
	task := defineTest(t, double, Options{})
	a := attach(t, task, false, nil)
	d := a.f.Done()
	if a.f.Done() != d {
		t.Fatal("Done returned another channel")
	}
	if a.reg.n.Load() != 1 || a.reg.blocks.Load() != 1 {
		t.Fatalf("Done on a pending future: %d registrations (%d Block calls), want 1 (1)", a.reg.n.Load(), a.reg.blocks.Load())
	}
	select {
	case <-d:
		t.Fatal("Done closed before the call settled")
	default:
	}
	a.r.Resolve(9)
	<-d // closed by the settle
	if a.reg.n.Load() != 0 {
		t.Fatalf("%d registrations after the settle, want 0", a.reg.n.Load())
	}
	if out, err := a.f.Wait(); out != 9 || err != nil {
		t.Fatalf("Wait = %v, %v; want 9, nil", out, err)
	}
	task.Records.Release(a.r)

	// Done first asked for after the settle: a closed channel, and no registration.
	b := attach(t, task, false, nil)
	b.r.Resolve(1)
	<-b.f.Done()
	if b.reg.blocks.Load() != 0 {
		t.Fatalf("Done on a settled future registered %d times", b.reg.blocks.Load())
	}
	task.Records.Release(b.r)
}

// poller settles the call from Poll, as a pool whose drain finds the result does.
type poller struct {
	registrations
	settle func()
}

func (p *poller) Poll() { p.registrations.Poll(); p.settle() }

func TestFuturePendingPolls(t *testing.T) {
	task := defineTest(t, double, Options{})
	p := &poller{}
	a := attach(t, task, false, p)
	p.settle = func() { a.r.Resolve(4) }
	if a.f.Pending() {
		t.Fatal("Pending did not drain: the result was waiting")
	}
	if p.polls.Load() != 1 {
		t.Fatalf("Pending polled %d times, want 1", p.polls.Load())
	}
	a.f.Pending()
	if p.polls.Load() != 1 {
		t.Fatal("Pending polled for a settled future")
	}
	task.Records.Release(a.r)
}

// A Future is one allocation: its channel is made only for a caller of Done, before or
// after the settle, and closed either way.
func TestFutureOneAllocationDoneLazily(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		f := NewFuture[int]()
		FailFuture(f, nil)
		_, _ = f.Wait()
	}); n != 1 {
		t.Errorf("a future settled and waited for without Done: %v allocations, want 1", n)
	}
	task := defineTest(t, double, Options{})
	a := attach(t, task, false, nil)
	d := a.f.Done()
	if a.f.Done() != d {
		t.Fatal("Done returned another channel")
	}
	select {
	case <-d:
		t.Fatal("Done closed before the call settled")
	default:
	}
	a.r.Resolve(9)
	<-d // closed by the settle
	task.Records.Release(a.r)

	b := attach(t, task, false, nil)
	b.r.Resolve(1)
	<-b.f.Done() // made after the settle: closed at once
	if out, err := b.f.Wait(); out != 1 || err != nil {
		t.Fatalf("Wait = %v, %v; want 1, nil", out, err)
	}
	task.Records.Release(b.r)
}

// Done racing the settle: whichever comes first, the channel Done made is closed exactly
// once (a close by both would panic) and Pending is false once Wait has returned.
func TestFutureDoneRacesSettle(t *testing.T) {
	task := defineTest(t, double, Options{})
	for range 2000 {
		a := attach(t, task, false, nil)
		got := make(chan (<-chan struct{}), 1)
		go func() { got <- a.f.Done() }()
		a.r.Resolve(2)
		<-<-got
		if _, err := a.f.Wait(); err != nil || a.f.Pending() {
			t.Fatalf("after Wait: %v, pending %v", err, a.f.Pending())
		}
		task.Records.Release(a.r)
	}
}
