package knit_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit"
)

// More hostile lanes (docs/process-lanes.md, "Threat model"): a lane that scribbles over its
// whole region while calls are in flight, forges results for its own calls, storms the
// doorbells, and spares that freeze. Each test asserts that the host survives, that no caller
// receives a value its lane did not compute for it, that every call settles (calls without a
// deadline included: the watchdog bounds them), the codes, and that nothing leaks: child
// processes, descriptors, mappings, /dev/shm names, goroutines.

// quickExit keeps a lane built with the race detector from sleeping a second at exit (its
// atexit_sleep_ms), which Close, once the lane has acknowledged its stop, would wait for.
var quickExit = []string{"GORACE=atexit_sleep_ms=0"}

// eager restarts a lane that a test kills again and again at once, however often.
var eager = knit.Restart{MaxRestarts: -1, Backoff: knit.Backoff{Min: -1, Jitter: -1}}

// leakBaseline is what a test's process had before its pool: descriptors, mappings of lane
// regions, goroutines.
type leakBaseline struct {
	fds        map[string]string
	maps       int
	goroutines goleak.Option
}

func takeBaseline(t *testing.T) leakBaseline {
	t.Helper()
	return leakBaseline{fds: openFDs(t), maps: regionMappings(t), goroutines: goleak.IgnoreCurrent()}
}

// openFDs maps this process's descriptors to what they are.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	dir := "/proc/self/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fds := map[string]string{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		fds[e.Name()] = target
	}
	return fds
}

// regionMappings counts this process's mappings of lane regions.
func regionMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:knit-lane")
}

// check fails t if anything the pools made since the baseline is left once they are closed:
// child processes, /dev/shm names, descriptors, region mappings, goroutines. A process being
// reaped, or a pipe being closed behind it, is waited for, within a bound.
func (b leakBaseline) check(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var left []string
	for {
		left = left[:0]
		if kids := children(t); len(kids) > 0 {
			left = append(left, "child processes "+strings.Join(kids, " "))
		}
		if names := shmNames(t); len(names) > 0 {
			left = append(left, "/dev/shm names "+strings.Join(names, " "))
		}
		for fd, target := range openFDs(t) {
			if b.fds[fd] != target {
				left = append(left, "descriptor "+fd+" -> "+target)
			}
		}
		if n := regionMappings(t); n > b.maps {
			left = append(left, strconv.Itoa(n-b.maps)+" region mappings")
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("left after Close: %s", strings.Join(left, "; "))
	}
	goleak.VerifyNone(t, b.goroutines)
}

// mark is how many events r holds now: awaitFrom looks only at later ones.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

// awaitFrom is await for the events after mark.
func (r *recorder) awaitFrom(t testing.TB, mark int, what string, match func(knit.Event) bool) knit.Event {
	t.Helper()
	expired := false
	timer := time.AfterFunc(time.Minute, func() {
		r.mu.Lock()
		expired = true
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		for _, e := range r.all[mark:] {
			if match(e) {
				return e
			}
		}
		if expired {
			t.Fatalf("no event: %s; events: %+v", what, r.all[mark:])
		}
		r.cond.Wait()
	}
}

// ended matches a lane's end by the host or on its own.
func ended(e knit.Event) bool { return e.To == knit.StateCrashed || e.To == knit.StateExited }

// settle waits for f within a bound far beyond the watchdog's, so that a call that would
// hang fails the test instead.
func settle[T any](t *testing.T, what string, f *knit.Future[T]) (T, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Wait()
	case <-time.After(time.Minute):
		t.Fatalf("%s did not settle", what)
		panic("unreachable")
	}
}

// TestHostileScribbleWholeRegion: a lane writes random bytes over all of its region, again
// and again, while calls run on every lane. The host kills it (a corrupt ring, or a
// heartbeat that stood still), callers of that lane get its coded end or a correct value,
// the other lanes serve on untouched, and the lane comes back.
func TestHostileScribbleWholeRegion(t *testing.T) {
	for _, mode := range []knit.SharedMemoryMode{knit.Inherit, knit.Named} {
		t.Run(mode.String(), func(t *testing.T) { scribbleWholeRegion(t, mode) })
	}
}

func scribbleWholeRegion(t *testing.T, mode knit.SharedMemoryMode) {
	base := takeBaseline(t)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 3, Logger: quiet(), OnEvent: rec.record,
		Liveness: 300 * time.Millisecond, Balancer: knit.RoundRobin,
		Process: knit.ProcessConfig{Env: quickExit, SharedMemory: mode}}, moreHostileTasks...)
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served atomic.Int64
	var mu sync.Mutex
	failedOn := map[int]int{} // lane → calls that failed with its end
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				a, b := rng.Int64N(1<<40), rng.Int64N(1<<40)
				sum, err := add.Call(context.Background(), p, [2]int64{a, b}) // no deadline
				var ke *knit.Error
				switch {
				case err == nil && sum == a+b:
					served.Add(1)
				case err == nil:
					t.Errorf("add(%d, %d) = %d: a value its lane did not compute", a, b, sum)
					return
				case errors.As(err, &ke) && (ke.Code == knit.CodeWorkerCrashed || ke.Code == knit.CodeUnresponsive):
					mu.Lock()
					failedOn[ke.Lane]++
					mu.Unlock()
				default:
					t.Errorf("add(%d, %d): %v", a, b, err)
					return
				}
			}
		})
	}
	_, err = settle(t, "the scribbling call", scribbleAll.Go(context.Background(), p, seed))
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed && ke.Code != knit.CodeUnresponsive {
		close(stop)
		wg.Wait()
		t.Fatalf("scribbling call: %v, want WORKER_CRASHED or WORKER_UNRESPONSIVE", err)
	}
	bad := ke.Lane
	end := rec.await(t, "scribbling lane killed", func(e knit.Event) bool { return e.Lane == bad && ended(e) })
	if end.Code != knit.CodeWorkerCrashed && end.Code != knit.CodeUnresponsive {
		t.Errorf("scribbling lane ended %s (%s), want killed by the host", end.Code, end.Reason)
	}
	t.Logf("scribbling lane %d ended %s (%s)", bad, end.Code, end.Reason)
	rec.await(t, "scribbling lane back", func(e knit.Event) bool {
		return e.Lane == bad && e.To == knit.StateReady && e.Incarnation > end.Incarnation
	})
	// Round robin: these reach every lane, the restarted one included.
	for i := range 30 {
		if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 2}); err != nil || sum != int64(i)+2 {
			t.Errorf("after the restart: %d, %v", sum, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("served %d calls; failed with a lane's end: %v", served.Load(), failedOn)
	for lane, n := range failedOn {
		if lane != bad {
			t.Errorf("%d calls failed with the end of lane %d, which did not scribble", n, lane)
		}
	}
	for lane := range 3 {
		for _, e := range rec.events(lane) {
			if lane != bad && ended(e) {
				t.Errorf("innocent lane %d ended: %+v", lane, e)
			}
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	base.check(t)
}

// forgeModes are the ways forgeOwn breaks the protocol with results for its own call. All
// but "outcome" make the host kill the lane as corrupt.
var forgeModes = []string{"tag", "offset", "arena-end", "length", "inline-length", "function", "unserved",
	"other-task", "generation", "abort-bit", "abort-range", "duplicate", "outcome"}

// TestHostileForgedOwnResults: a lane writes results for its own call with a bad tag, offset
// or length, an unknown or unserved function, another task, the wrong generation, an abort
// bit it does not hold, an unknown outcome, or twice. The lane is killed as corrupt, its
// caller gets a coded error or a value that lane returned for that very call, calls queued
// behind it are served, and the other lane is untouched.
func TestHostileForgedOwnResults(t *testing.T) {
	base := takeBaseline(t)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), OnEvent: rec.record,
		Liveness: 300 * time.Millisecond, Balancer: knit.FirstIdle, Restart: eager, Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) }) // a failure must not leave lanes to later tests
	for _, mode := range forgeModes {
		for _, cancellable := range []bool{false, true} {
			mark := rec.mark()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if cancellable { // the call holds an abort bit
				ctx, cancel = context.WithCancel(ctx)
			}
			f := forgeOwn.Go(ctx, p, mode)
			// Calls queued on the forging lane behind it, and calls on the other lane.
			var adds []*knit.Future[int64]
			for i := range 8 {
				adds = append(adds, add.Go(context.Background(), p, [2]int64{int64(i), 100}))
			}
			v, err := settle(t, mode+" forging call", f)
			cancel()
			var ke *knit.Error
			switch {
			case err == nil && (v == 42 || v == 666 && mode == "duplicate"):
				// its lane's own answer for this call
			case err == nil:
				t.Errorf("%s: forging call returned %d", mode, v)
			case errors.As(err, &ke) && ke.Code == knit.CodeWorkerCrashed:
			default:
				t.Errorf("%s: forging call: %v, want WORKER_CRASHED", mode, err)
			}
			e := rec.awaitFrom(t, mark, mode+": forging lane killed", ended)
			for i, a := range adds {
				sum, err := settle(t, mode+" add", a)
				var ke *knit.Error
				switch {
				case err == nil && sum == int64(i)+100:
				case err == nil && sum == 666 && mode == "other-task":
					// The forged result named an add call the forging lane held (record
					// ids are per task): a lane answers the calls it holds as it likes.
				case errors.As(err, &ke) && ke.Code == knit.CodeWorkerCrashed && ke.Lane == e.Lane && ke.Started:
					// it had started on the forging lane when the host killed it
				default:
					t.Errorf("%s: add %d: %d, %v", mode, i, sum, err)
				}
			}
			if mode == "outcome" {
				if err == nil || !strings.Contains(err.Error(), "lane broke the protocol") {
					t.Errorf("%s: forging call: %v, want WORKER_CRASHED, lane broke the protocol", mode, err)
				}
			} else if e.Code != knit.CodeWorkerCrashed || !strings.Contains(e.Reason, "corrupt ring") {
				t.Errorf("%s: forging lane ended %s (%s), want WORKER_CRASHED, corrupt ring", mode, e.Code, e.Reason)
			}
			rec.awaitFrom(t, mark, mode+": forging lane back", func(x knit.Event) bool {
				return x.Lane == e.Lane && x.To == knit.StateReady && x.Incarnation > e.Incarnation
			})
			for _, x := range rec.events(1 - e.Lane) {
				if ended(x) {
					t.Errorf("%s: the innocent lane ended: %+v", mode, x)
				}
			}
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	base.check(t)
}

// TestHostileDoorbellStorm: a lane rings the host's completion eventfd, wakes every futex word
// of its region, flips the completion arm word and rewrites its ring words, as fast as it can.
// The other lane serves calls meanwhile, no call settles before its lane answers it, the
// storming call gets its own answer, and no lane is killed.
func TestHostileDoorbellStorm(t *testing.T) {
	for _, spin := range []time.Duration{0, -1} { // the default, and callers that park at once
		t.Run("spin="+spin.String(), func(t *testing.T) {
			base := takeBaseline(t)
			rec := newRecorder()
			p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), OnEvent: rec.record,
				Liveness: 300 * time.Millisecond, Balancer: knit.FirstIdle, CallerSpin: spin, Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			fifos := [2]string{dir + "/started", dir + "/gate"}
			for _, f := range fifos {
				if err := syscall.Mkfifo(f, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f := storm.Go(context.Background(), p, fifos) // lane 0: FirstIdle
			if _, err := os.ReadFile(fifos[0]); err != nil {
				t.Fatal(err)
			}
			for i := range 200 { // on lane 1, the idle one
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 7}); err != nil || sum != int64(i)+7 {
					t.Fatalf("add %d during the storm: %d, %v", i, sum, err)
				}
			}
			if !f.Pending() {
				v, err := f.Wait()
				t.Fatalf("the storming call settled before its lane answered: %d, %v", v, err)
			}
			if err := os.WriteFile(fifos[1], []byte{1}, 0o600); err != nil {
				t.Fatal(err)
			}
			if v, err := settle(t, "the storming call", f); err != nil || v != 42 {
				t.Fatalf("storming call: %d, %v; want its own 42", v, err)
			}
			for i := range 20 { // both lanes again
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i)+1 {
					t.Fatalf("add %d after the storm: %d, %v", i, sum, err)
				}
			}
			for lane := range 2 {
				for _, e := range rec.events(lane) {
					if ended(e) {
						t.Errorf("lane %d ended: %+v", lane, e)
					}
				}
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			base.check(t)
		})
	}
}

// TestHostileFrozenSpare: a spare stopped (SIGSTOP) while it waits is never assigned — the
// restart spawns or takes another — and is killed; a spare that freezes once taken, before
// it reports ready, is given up within Liveness (WORKER_STARTUP_FAILED) and the next restart
// brings the lane back. Nothing is left.
func TestHostileFrozenSpare(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		base := takeBaseline(t)
		rec := newRecorder()
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), OnEvent: rec.record,
			Liveness: 300 * time.Millisecond, Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		knit.AwaitSpares(p)
		spares := p.Stats().Spares
		if len(spares) != 1 {
			t.Fatalf("spares %v, want one", spares)
		}
		frozen := spares[0]
		if err := syscall.Kill(frozen, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitState(t, frozen, "stopped", func(s byte) bool { return s == 'T' })
		if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation >= 1 })
		if pid := p.Stats().Lanes[0].PID; pid == frozen {
			t.Fatalf("the restart took the frozen spare %d", frozen)
		}
		if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
			t.Fatalf("after the restart: %d, %v", sum, err)
		}
		for _, e := range rec.events(0) {
			if e.To == knit.StateStartupFailed {
				t.Errorf("a restart failed: %+v", e)
			}
		}
		waitState(t, frozen, "killed and reaped", func(s byte) bool { return s == 0 })
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		base.check(t)
	})
	t.Run("taken", func(t *testing.T) {
		base := takeBaseline(t)
		rec := newRecorder()
		marker := t.TempDir() + "/froze"
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), OnEvent: rec.record,
			Liveness: 300 * time.Millisecond, Process: knit.ProcessConfig{Env: append([]string{"KNIT_TEST_SPARE_FREEZE=" + marker}, quickExit...)}},
			moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		knit.AwaitSpares(p)
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("the spare did not take the freezing part: %v", err)
		}
		// No deadline: the call waits for a lane through the failed restart.
		f := add.Go(context.Background(), p, [2]int64{2, 3})
		if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if sum, err := settle(t, "the call across restarts", f); err != nil && !errors.Is(err, knit.ErrWorkerCrashed) || err == nil && sum != 5 {
			t.Fatalf("call across the restarts: %d, %v", sum, err)
		}
		e := rec.await(t, "frozen spare given up", func(e knit.Event) bool { return e.To == knit.StateStartupFailed })
		if e.Code != knit.CodeStartupFailed || e.Incarnation != 1 {
			t.Errorf("the restart on the frozen spare ended %+v, want WORKER_STARTUP_FAILED of incarnation 1", e)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation >= 2 })
		if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
			t.Fatalf("after the restarts: %d, %v", sum, err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		base.check(t)
	})
}

// waitState waits, within a bound, until process pid's state (the letter in /proc/PID/stat;
// 0 once it is gone) satisfies ok.
func waitState(t *testing.T, pid int, what string, ok func(byte) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state byte
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
				state = b[i+2]
			}
		}
		if ok(state) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not %s (state %q)", pid, what, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCloseAfterBurstAcknowledged: Close right after a burst of calls on two process lanes
// sees both lanes acknowledge their stop request. (A reaper idling while another lingered
// over every lane's results missed its own lane's acknowledgement, and Close reported the
// lane as killed.)
func TestCloseAfterBurstAcknowledged(t *testing.T) {
	for k := range 3 {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2, Logger: quiet(), Process: knit.ProcessConfig{Env: quickExit}}, moreHostileTasks...)
		if err != nil {
			t.Fatal(err)
		}
		f := add.Go(context.Background(), p, [2]int64{1, 1})
		for i := range 200 {
			if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 7}); err != nil || sum != int64(i)+7 {
				t.Fatalf("add %d: %d, %v", i, sum, err)
			}
		}
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("pool %d: Close: %v", k, err)
		}
	}
}
