package knit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
)

// Which pools steal: those that ask (with 31 lanes at most on a ring), and by default the
// goroutine pools of 2 to 31 lanes with the default balancer, stealing from each other.
func TestStealModeChosen(t *testing.T) {
	cases := []struct {
		cfg  knit.Config
		want knit.Steal
	}{
		{knit.Config{Lanes: 2}, knit.StealLocal},
		{knit.Config{Lanes: 31}, knit.StealLocal},
		{knit.Config{Lanes: 2, Runtime: knit.Process}, knit.StealOff},
		{knit.Config{Lanes: 1}, knit.StealOff},
		{knit.Config{Lanes: 2, Balancer: knit.RoundRobin}, knit.StealOff},
		{knit.Config{Lanes: 2, Steal: knit.StealOff}, knit.StealOff},
		{knit.Config{Lanes: 1, Steal: knit.StealTicket}, knit.StealTicket},
		{knit.Config{Lanes: 3, Steal: knit.StealDekker}, knit.StealDekker},
		{knit.Config{Lanes: 2, Balancer: knit.Random, Steal: knit.StealTicket}, knit.StealTicket},
		{knit.Config{Lanes: 1, Steal: knit.StealLocal}, knit.StealLocal},
		{knit.Config{Lanes: 32}, knit.StealOff},
		{knit.Config{Lanes: 32, Steal: knit.StealTicket}, knit.StealOff},
		{knit.Config{Lanes: 40, Steal: knit.StealLocal}, knit.StealLocal},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d/%v/%v", c.cfg.Lanes, c.cfg.Steal, c.cfg.Balancer), func(t *testing.T) {
			c.cfg.Logger = quiet()
			p, err := knit.NewPool(c.cfg, add)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			if got := p.Stats().Steal; got != c.want {
				t.Errorf("Stats.Steal = %v, want %v", got, c.want)
			}
			if v, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil || v != 5 {
				t.Errorf("add: %d, %v", v, err)
			}
		})
	}
	if _, err := knit.NewPool(knit.Config{Lanes: 2, Steal: knit.StealDekker, MaxCallsPerLane: 10, Logger: quiet()}, add); err == nil {
		t.Error("a recycling StealDekker pool was accepted")
	}
	if _, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Steal: knit.StealLocal, Logger: quiet()}, add); !errors.Is(err, knit.ErrInvalidArgument) {
		t.Errorf("a StealLocal pool of process lanes: %v, want INVALID_ARGUMENT", err)
	}
}

// With one lane busy on a call that does not end, every other call runs on the free lane,
// whichever lane the busy call went to, on both runtimes and with both disciplines (a
// claim takes at most half of what waits); the lanes' Claimed counters account for every
// call.
func TestStealFreeLaneTakesCalls(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
			t.Run(rt.String()+"/"+mode.String(), func(t *testing.T) {
				p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Steal: mode, Logger: quiet()}, stealTasks...)
				if err != nil {
					t.Fatal(err)
				}
				knit.StealAlways(p) // the calls under test go through the shared ring
				defer p.Close(context.Background())
				knit.StopStealBackstop(p) // no watchdog rings a lane for a call left waiting
				ctx, cancel := context.WithCancel(context.Background())
				held := sleepy.Go(ctx, p, 0)
				callAdds(t, p, 200)
				holding(t, p, 1, "the busy call") // it may share a batch with adds whose finish lags
				cancel()
				if _, err := held.Wait(); !errors.Is(err, context.Canceled) {
					t.Errorf("held call: %v", err)
				}
				holding(t, p, 0, "the cancelled call's end")
				var claimed uint64
				for _, l := range p.Stats().Lanes {
					claimed += l.Claimed
				}
				if claimed < 200 { // the cancelled call's answer may come later
					t.Errorf("lanes claimed %d calls, want every add (200) at least", claimed)
				}
			})
		}
	}
}

// callAdds makes n add calls one after the other. A call that waits 10 s for a lane is
// stuck: it fails the test, with the ring and the lanes as they were.
func callAdds(t *testing.T, p *knit.Pool, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := add.Call(ctx, p, [2]int64{int64(i), 1})
		cancel()
		if err != nil || v != int64(i)+1 {
			t.Fatalf("add %d: %d, %v; %s", i, v, err, knit.StealState(p))
		}
	}
}

// holding waits until the lanes' journals hold n shared calls in all (LaneStats.Holding),
// for at most 10 s: a lane's journal lags the result it sent by a few instructions.
func holding(t *testing.T, p *knit.Pool, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sum := 0
		for _, l := range p.Stats().Lanes {
			sum += l.Holding
		}
		if sum == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the lanes hold %d shared calls, want %d; %s", what, sum, n, knit.StealState(p))
		}
		runtime.Gosched()
	}
}

// A lane killed while it runs a call from the shared ring: that call fails as started
// (WORKER_CRASHED), or runs again on another lane if its task is Idempotent; the calls
// waiting on the ring and on the other lane go on, and the lane's successor claims again.
func TestStealLaneDeathSettlesItsCalls(t *testing.T) {
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		for _, idem := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/idempotent=%v", mode, idem), func(t *testing.T) {
				rec := newRecorder()
				p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Steal: mode, Logger: quiet(),
					OnEvent: rec.record, Restart: eager}, stealTasks...)
				if err != nil {
					t.Fatal(err)
				}
				knit.StealAlways(p) // the calls under test go through the shared ring
				defer p.Close(context.Background())
				file := filepath.Join(t.TempDir(), "pid")
				task := holdPID
				if idem {
					task = holdOnce
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				held := task.Go(ctx, p, file)
				pid := awaitPID(t, file)
				var adds []*knit.Future[int64]
				for i := range 64 {
					adds = append(adds, add.Go(ctx, p, [2]int64{int64(i), 1000}))
				}
				mark := rec.mark()
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				v, err := held.Wait()
				var ke *knit.Error
				switch {
				case idem && (err != nil || v != 7):
					t.Errorf("idempotent held call: %d, %v; want 7 from a second run", v, err)
				case !idem && !(errors.As(err, &ke) && ke.Code == knit.CodeWorkerCrashed && ke.Started):
					t.Errorf("held call: %v, want WORKER_CRASHED, started", err)
				}
				for i, a := range adds {
					if v, err := a.Wait(); err != nil || v != int64(i)+1000 {
						t.Errorf("add %d: %d, %v", i, v, err)
					}
				}
				rec.awaitFrom(t, mark, "the killed lane restarts", func(e knit.Event) bool { return e.To == knit.StateReady })
				// Both lanes claim again: a call that holds one leaves the other free.
				ctx2, cancel2 := context.WithCancel(context.Background())
				h2 := sleepy.Go(ctx2, p, 0)
				for i := range 32 {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					v, err := add.Call(ctx, p, [2]int64{int64(i), 1})
					cancel()
					if err != nil || v != int64(i)+1 {
						t.Fatalf("add after restart %d: %d, %v; %+v", i, v, err, p.Stats())
					}
				}
				cancel2()
				_, _ = h2.Wait()
			})
		}
	}
}

// A caller that gives up on a call from the shared ring interrupts the task through the
// pool-wide abort bits, wherever it runs.
func TestStealCancelReachesTask(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Steal: knit.StealTicket, Logger: quiet()}, stealTasks...)
	if err != nil {
		t.Fatal(err)
	}
	knit.StealAlways(p) // the calls under test go through the shared ring
	defer p.Close(context.Background())
	for i := range 4 {
		file := filepath.Join(t.TempDir(), "pid")
		ctx, cancel := context.WithCancel(context.Background())
		f := holdPID.Go(ctx, p, file)
		awaitPID(t, file)
		cancel()
		if _, err := f.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	// The interrupted tasks returned: both lanes are free again.
	for i := range 16 {
		stuck := time.AfterFunc(10*time.Second, func() { fmt.Fprintf(os.Stderr, "STUCK add %d: %s\n", i, knit.StealState(p)) })
		v, err := add.Call(context.Background(), p, [2]int64{int64(i), 1})
		stuck.Stop()
		if err != nil || v != int64(i)+1 {
			t.Fatalf("add %d: %d, %v; %s", i, v, err, knit.StealState(p))
		}
	}
}

// Close settles what is still on the shared ring with THREAD_CLOSED, and a stealing pool
// refuses more lanes than a ring can serve.
func TestStealCloseAndResize(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 2, Steal: knit.StealTicket, Logger: quiet(), StopAckTimeout: time.Second}, stealTasks...)
	if err != nil {
		t.Fatal(err)
	}
	knit.StealAlways(p) // the calls under test go through the shared ring
	if err := p.Resize(context.Background(), 40); err == nil {
		t.Error("a stealing pool grew to 40 lanes")
	}
	if err := p.Resize(context.Background(), 3); err != nil {
		t.Fatalf("Resize to 3: %v", err)
	}
	for i := range 32 {
		if v, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || v != int64(i)+1 {
			t.Fatalf("add on 3 lanes %d: %d, %v", i, v, err)
		}
	}
	if err := p.Resize(context.Background(), 2); err != nil {
		t.Fatalf("Resize to 2: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	hold, release := context.WithCancel(context.Background())
	defer release() // the abandoned lane goroutines' tasks return
	var held []*knit.Future[int]
	for range 2 {
		held = append(held, sleepy.Go(hold, p, 0)) // the lanes: busy until stopped
	}
	queued := add.Go(context.Background(), p, [2]int64{1, 1})
	_ = p.Close(ctx)
	release()
	for _, f := range append(held, nil) {
		var err error
		if f != nil {
			_, err = f.Wait()
		} else {
			_, err = queued.Wait()
		}
		if err == nil {
			continue // the queued add may have run before the lanes were taken
		}
		var ke *knit.Error
		if !errors.As(err, &ke) || ke.Code != knit.CodeThreadClosed {
			t.Errorf("after Close: %v, want THREAD_CLOSED", err)
		}
	}
}

// awaitPID reads the PID a task wrote into file, polling the file until it appears.
func awaitPID(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(file); err == nil && len(b) > 0 {
			pid, err := strconv.Atoi(string(b))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no PID in %s", file)
	return 0
}

// A lane that has claimed a call and not started it yet will not claim another until that
// call ends: the host must not count it as a lane looking for work. The lane that claims
// the held call is stopped right after its claim (in its "claimed" debug entry, written
// inside the claim); the other lane parks; then an add is published, and the host must
// ring the parked lane for it, as the claimant will run the held call next. Issue 13's
// stuck call: the claimant's running word still said "not busy" (it was stored only when
// the call started), so the host counted it and rang no lane; the add waited until the
// watchdog's backstop rang one, forever without it.
//
// Ticket only: a Dekker claimant stopped there still holds its region's handshake, so the
// other lane keeps retrying instead of parking (and the host counts the held call as
// waiting); Dekker's window, between releasing the batch and starting it, is left to
// TestStealFreeLaneStress.
func TestStealClaimantIsNotFree(t *testing.T) {
	for _, mode := range []knit.Steal{knit.StealTicket} {
		t.Run(mode.String(), func(t *testing.T) {
			hook := &claimHook{claimed: make(chan int, 1), release: make(chan struct{}), once: new(sync.Once)}
			p, err := knit.NewPool(knit.Config{Lanes: 2, Steal: mode, Logger: zap.New(hook)}, stealTasks...)
			if err != nil {
				t.Fatal(err)
			}
			knit.StealAlways(p) // the calls under test go through the shared ring
			defer p.Close(context.Background())
			knit.StopStealBackstop(p)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			held := sleepy.Go(ctx, p, 0)
			c := <-hook.claimed // the claimant, stopped between its claim and the held call
			other := 1 - c      // the two lanes have consumer ids 0 and 1
			for knit.StealAwake(p, other) {
				runtime.Gosched() // the other lane finds nothing to claim and parks
			}
			f := add.Go(context.Background(), p, [2]int64{2, 3}) // published and woken for
			// Rung: the other lane is awake now, or has already run the add and parked
			// again (it settles the add before it parks: read in this order).
			rung := knit.StealAwake(p, other) || !f.Pending()
			state := knit.StealState(p)
			close(hook.release)
			if !rung {
				t.Errorf("an add waits and the free lane (consumer %d) is parked, not rung, while the claimant of the held call (consumer %d) was counted as looking for work: %s", other, c, state)
				cancel() // the claimant then takes the add after the held call
			}
			if v, err := f.Wait(); err != nil || v != 5 {
				t.Errorf("add: %d, %v", v, err)
			}
			cancel()
			if _, err := held.Wait(); !errors.Is(err, context.Canceled) {
				t.Errorf("held call: %v", err)
			}
		})
	}
}

// claimHook is a logger core that stops the first lane to claim from a shared ring inside
// its claim (its "claimed" debug entry): it sends the lane's consumer id on claimed, then
// waits for release. It drops every other entry.
type claimHook struct {
	claimed chan int
	release chan struct{}
	once    *sync.Once
	fields  []zapcore.Field
}

func (h *claimHook) Enabled(zapcore.Level) bool { return true }
func (h *claimHook) With(f []zapcore.Field) zapcore.Core {
	return &claimHook{claimed: h.claimed, release: h.release, once: h.once, fields: append(h.fields[:len(h.fields):len(h.fields)], f...)}
}
func (h *claimHook) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "claimed" && e.LoggerName == "knit.steal" {
		return ce.AddCore(e, h)
	}
	return ce
}
func (h *claimHook) Write(_ zapcore.Entry, fs []zapcore.Field) error {
	for _, f := range fs {
		if f.Key == "consumer" {
			first := false
			h.once.Do(func() { first = true })
			if first {
				h.claimed <- int(f.Integer)
				<-h.release
			}
		}
	}
	return nil
}
func (h *claimHook) Sync() error { return nil }

// A stealing pool whose shared ring is empty sends a call straight to an idle lane's own
// ring, the lowest first: a lone call costs no claim. A lane holding a call of its own is
// not idle, so the next call goes to the other lane, and never waits behind the first.
func TestStealIdleLaneTakesCallDirectly(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
			t.Run(rt.String()+"/"+mode.String(), func(t *testing.T) {
				p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Steal: mode, Logger: quiet()}, stealTasks...)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close(context.Background())
				callAdds(t, p, 50)
				ctx, cancel := context.WithCancel(context.Background())
				held := sleepy.Go(ctx, p, 0)
				callAdds(t, p, 50) // beside the held call
				cancel()
				if _, err := held.Wait(); !errors.Is(err, context.Canceled) {
					t.Errorf("held call: %v", err)
				}
				served := 0
				for _, l := range p.Stats().Lanes {
					if l.Claimed != 0 {
						t.Errorf("lane %d claimed %d calls from the shared ring, want none: it was empty", l.Lane, l.Claimed)
					}
					if l.TotalCompleted+l.TotalFailed > 0 {
						served++
					}
				}
				if served != 2 {
					t.Errorf("%d lanes served calls, want both: the held call's lane was not idle", served)
				}
			})
		}
	}
}

// StealLocal, the stealing of goroutine lanes (actors.LocalGroup): each lane keeps its own
// queue, and one that has run dry takes the calls waiting on a stuck one.

// With RoundRobin, half the calls go to a lane stuck in a call that does not end: the free
// lane takes them, and every call settles while the stuck one still runs. With StealOff
// the same calls would wait for the stuck one.
func TestStealLocalTakesStuckLanesCalls(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 2, Steal: knit.StealLocal, Balancer: knit.RoundRobin})
	if got := p.Stats().Steal; got != knit.StealLocal {
		t.Fatalf("Stats.Steal = %v, want local", got)
	}
	release := stuckLane(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var futs []*knit.Future[int64]
	for i := range 20 {
		futs = append(futs, add.Go(ctx, p, [2]int64{int64(i), 1}))
	}
	for i, f := range futs {
		if v, err := f.Wait(); err != nil || v != int64(i)+1 {
			t.Fatalf("add %d behind a stuck lane: %d, %v; %+v", i, v, err, p.Stats().Lanes)
		}
	}
	var claimed uint64
	for _, l := range p.Stats().Lanes {
		claimed += l.Claimed
	}
	if claimed == 0 {
		t.Fatal("every add settled, yet no lane took one from the stuck lane")
	}
	if v, err := release(); err != nil || v != "opened" {
		t.Fatalf("stuck call: %q, %v", v, err)
	}
}

// stuckLane starts a call that blocks its lane until release is called (at the latest by
// the test's cleanup, before the pool's Close waits for it), and returns once it runs.
// release returns the call's result.
func stuckLane(t *testing.T, p *knit.Pool) (release func() (string, error)) {
	g := newGate()
	var once sync.Once
	open := func() { once.Do(func() { close(g.open) }) }
	t.Cleanup(open)
	stuck := block.Go(context.Background(), p, g)
	<-g.started
	return func() (string, error) {
		open()
		return stuck.Wait()
	}
}

// One lane is stuck and the other, which takes the calls queued behind it, dies
// (runtime.Goexit in a task) while it may hold calls it stole and calls queued behind the
// Goexit: every call settles once, the adds with their results, the one it died in with
// WORKER_EXITED; the pool serves on.
func TestStealLocalVictimDies(t *testing.T) {
	for round := range 10 {
		p := newPool(t, knit.Config{Lanes: 2, Steal: knit.StealLocal, Balancer: knit.RoundRobin})
		release := stuckLane(t, p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var futs []*knit.Future[int64]
		for i := range 40 {
			futs = append(futs, add.Go(ctx, p, [2]int64{int64(i), 1}))
			if i == 20 {
				// The free lane runs into a Goexit: it dies while it may hold stolen calls.
				futs = append(futs, nil)
				if _, err := goexit.Call(ctx, p, 0); !errors.Is(err, knit.ErrWorkerExited) {
					t.Fatalf("round %d: goexit: %v", round, err)
				}
			}
		}
		for i, f := range futs {
			if f == nil {
				continue
			}
			want := int64(i) + 1
			if i > 20 {
				want-- // the nil placeholder
			}
			if v, err := f.Wait(); err != nil || v != want {
				t.Fatalf("round %d: add %d: %d, %v", round, i, v, err)
			}
		}
		if v, err := release(); err != nil || v != "opened" {
			t.Fatalf("round %d: stuck call: %q, %v", round, v, err)
		}
		cancel()
	}
}

// TestTicketSurvivesKills: a Ticket pool whose lanes are killed by hard timeouts again and
// again while 50 goroutines call serves afterwards and closes (issue 30's scenario: 2 lanes,
// a call that spins until a kill, under a HardTimeout of 300 ms, every 300 ms; a 2 ms call
// under a Timeout of 300 ms from 50 goroutines; Backlog 256). The report had the pool jam
// for good: every lane ready and holding claimed calls, none run, a fresh call OVERLOADED,
// and Close waiting for its whole context. The cause was a spin that waited on the ring, or
// behind another call of its batch, past its hard deadline: the host looked for its lane at
// that deadline only, never killed it, and the lane spun for good with the calls claimed
// behind it (TestStealHardTimeoutAfterWait). Close returns only once every call has settled
// and left the ring's count (its drain waits for that, with a context that never ends here):
// a spin never killed, or a count that leaked, would hold it for good.
func TestTicketSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of kills")
	}
	rec := newRecorder()
	p := newProcessPool(t, knit.Config{Lanes: 2, Steal: knit.StealTicket, Backlog: 256, Logger: quiet(),
		Restart: knit.Restart{MaxRestarts: 100000}, OnEvent: rec.record}, hardSpin, nap2ms, add)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // every 300 ms a call that spins until its lane is killed, 20 of them
		defer wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		var spins []*knit.Future[int]
		for k := range 20 {
			spins = append(spins, hardSpin.Go(context.Background(), p, k))
			<-tick.C
		}
		for _, f := range spins {
			_, _ = f.Wait()
		}
		close(stop)
	}()
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = nap2ms.Call(context.Background(), p, g*1000+i)
			}
		}()
	}
	wg.Wait()
	rec.await(t, "a lane killed by a hard timeout", func(e knit.Event) bool { return ended(e) && strings.Contains(e.Reason, "hard timeout") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 20 {
		if sum, err := add.Call(ctx, p, [2]int64{int64(i), 1}); err != nil || sum != int64(i)+1 {
			t.Fatalf("fresh call %d after the kills: %d, %v; %s", i, sum, err, knit.StealState(p))
		}
	}
	// Lanes killed mid-claim are no reason to give the ring up: their journals say exactly
	// what they held (a ring given up would serve, but steal no more).
	if knit.StealDegraded(p) {
		t.Errorf("the pool gave its shared ring up: %s", knit.StealState(p))
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("Close did not return: %s", knit.StealState(p))
	}
	if s := p.Stats(); s.Shared != 0 {
		t.Errorf("after Close the shared ring counts %d calls", s.Shared)
	}
}

// TestStealHardTimeoutAfterWait: issue 30's jam at its root. A call with a HardTimeout that
// still waits when its caller's deadline passes — claimed in a batch behind a slow call —
// gets its lane killed once it has run HardTimeout there. Until 606ee7c the host looked for
// the call's lane once, at that deadline, by the claim journals: a call not started then was
// never looked at again, and once it started it spun for good, its lane never killed and
// the calls claimed behind it never run. Here the only lane, held by a call, finds three
// calls waiting once it is let go, and claims half, rounded up: a 600 ms call and a spin
// under a HardTimeout of 300 ms. The spin's caller times out while the slow call runs; the
// spin starts after it, and its lane must die of the hard timeout, come back and serve.
func TestStealHardTimeoutAfterWait(t *testing.T) {
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := newRecorder()
			p := newProcessPool(t, knit.Config{Lanes: 1, Steal: mode, Logger: quiet(), Restart: eager, OnEvent: rec.record,
				Process: knit.ProcessConfig{Env: quickExit}}, holdPID, hardNap, hardSpin, add)
			knit.StealAlways(p)
			ctx := context.Background()
			file := filepath.Join(t.TempDir(), "pid")
			hctx, release := context.WithCancel(ctx)
			held := holdPID.Go(hctx, p, file)
			awaitPID(t, file) // the lane runs it: the next three wait on the ring together
			slow := hardNap.Go(ctx, p, 600)
			spin := hardSpin.Go(ctx, p, 0)
			after := add.Go(ctx, p, [2]int64{1, 2})
			release()
			if _, err := held.Wait(); !errors.Is(err, context.Canceled) {
				t.Errorf("held call: %v", err)
			}
			if _, err := spin.Wait(); !errors.Is(err, knit.ErrTimeout) {
				t.Errorf("spin: %v, want TIMEOUT (its hard deadline)", err)
			}
			if _, err := slow.Wait(); err != nil {
				t.Errorf("nap: %v", err)
			}
			rec.await(t, "the spin's lane killed by its hard timeout", func(e knit.Event) bool {
				return e.Lane == 0 && ended(e) && strings.Contains(e.Reason, "hard timeout")
			})
			if v, err := after.Wait(); err != nil || v != 3 {
				t.Errorf("the call behind the spin: %d, %v", v, err)
			}
			callAdds(t, p, 10)
		})
	}
}

// TestStealSharedCountBeforeResult: a call of the shared ring leaves the ring's count
// (Stats.Shared) before its caller wakes, so a caller that reads Stats after its call
// returned never counts it. It used to leave the count after: 4 of 20,000 sequential calls
// read 1 on process lanes, which made TestTicketSurvivesKills report a leak that was not one.
func TestStealSharedCountBeforeResult(t *testing.T) {
	n := 20000
	if raceEnabled || testing.Short() {
		n = 2000
	}
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Steal: knit.StealTicket, Logger: quiet()}, stealTasks...)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			knit.StealAlways(p)
			counted := 0
			for i := range n {
				if v, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || v != int64(i)+1 {
					t.Fatalf("add %d: %d, %v", i, v, err)
				}
				if p.Stats().Shared != 0 {
					counted++
				}
			}
			if counted > 0 {
				t.Errorf("%d of %d calls still counted on the shared ring once they had returned", counted, n)
			}
		})
	}
}

// TestStealCloseKillsStubbornLanes (issue 30): Close of a stealing pool escalates on its own,
// whatever the caller's context says (here one that has ended: Close waits for no call).
// Both lanes run calls they stole that ignore SIGTERM, and an add waits on the shared ring
// behind them: Close asks the lanes to stop, sends SIGTERM once StopAckTimeout passes and
// SIGKILL after KillGrace, and returns nil; the stubborn calls fail THREAD_CLOSED after
// SIGKILL, the waiting add THREAD_CLOSED, the ring counts nothing, and no lane outlives it.
func TestStealCloseKillsStubbornLanes(t *testing.T) {
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := newRecorder()
			p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Steal: mode, Logger: quiet(),
				KillGrace: 100 * time.Millisecond, OnEvent: rec.record, Process: knit.ProcessConfig{Env: quickExit}}, stubborn, add)
			if err != nil {
				t.Fatal(err)
			}
			knit.StealAlways(p) // every call goes through the shared ring
			var held []*knit.Future[int]
			for i := range 2 {
				fifo := filepath.Join(t.TempDir(), "started"+strconv.Itoa(i))
				if err := syscall.Mkfifo(fifo, 0o600); err != nil {
					t.Fatal(err)
				}
				held = append(held, stubborn.Go(context.Background(), p, fifo))
				fifoRead(t, fifo, "a stubborn call starting") // a lane now runs it, ignoring SIGTERM
			}
			var pids []int
			for _, ls := range p.Stats().Lanes {
				pids = append(pids, ls.PID)
			}
			queued := add.Go(context.Background(), p, [2]int64{1, 2})
			ended, end := context.WithCancel(context.Background())
			end()
			if err := p.Close(ended); err != nil {
				t.Errorf("Close: %v, want nil: the lanes were killed, so they ended, and their calls settled", err)
			}
			for i, f := range held {
				if _, err := f.Wait(); !errors.Is(err, knit.ErrThreadClosed) || !strings.Contains(err.Error(), "SIGKILL") {
					t.Errorf("stubborn call %d: %v, want THREAD_CLOSED after SIGKILL", i, err)
				}
			}
			if _, err := queued.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
				t.Errorf("the add waiting on the ring: %v, want THREAD_CLOSED", err)
			}
			if s := p.Stats(); s.Shared != 0 {
				t.Errorf("after Close the shared ring counts %d calls", s.Shared)
			}
			for _, pid := range pids {
				if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("lane process %d outlived Close: %v", pid, err)
				}
			}
			for lane := range 2 {
				es := rec.events(lane)
				if last := es[len(es)-1]; last.To != knit.StateClosed || last.Code != knit.CodeThreadClosed {
					t.Errorf("lane %d ended %+v", lane, last)
				}
			}
		})
	}
}

// TestStealGrantDoesNotAllocate: a call on a stealing pool of process lanes through the
// shared ring — claimed, noticed, granted, forwarded to the claimant's own ring, answered —
// costs no allocation, as on private lanes (TestScalarCallDoesNotAllocate).
func TestStealGrantDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are only meaningful without -race and -cover")
	}
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 2, Steal: mode, Logger: quiet()}, add)
			knit.StealAlways(p)
			ctx := context.Background()
			failures := 0
			allocs := testing.AllocsPerRun(10_000, func() {
				if _, err := add.Call(ctx, p, [2]int64{1, 2}); err != nil {
					failures++
				}
			})
			if failures != 0 || allocs != 0 {
				t.Fatalf("%v allocs per call through the shared ring (%d failures), want 0", allocs, failures)
			}
			if knit.StealDegraded(p) {
				t.Fatalf("the ring was given up: %s", knit.StealState(p))
			}
			claimed := uint64(0)
			for _, ls := range p.Stats().Lanes {
				claimed += uint64(ls.Claimed)
			}
			if claimed < 10_000 {
				t.Errorf("%d calls claimed from the shared ring, want every call", claimed)
			}
		})
	}
}
