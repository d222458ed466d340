package knit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit"
)

// Stress for work stealing (issue 13, docs/stealing.md "Benchmarks and stress"): many calls
// over 4 lanes of each runtime with each steal discipline, and SIGKILLs of process lanes in
// the middle. The tests assert what must hold whatever the dispatch — exactly-once results
// and executions without deaths; with deaths, every call settles, Idempotent calls succeed,
// and a call runs again only after a lane died under it — so they also run, and pass, with
// private lanes (StealOff).
//
// Sizes: KNIT_STRESS=full runs 250,000 calls per pool: 1,000,000 over the four stealing
// pools (Ticket and Dekker, 4 process lanes and 4 goroutine lanes), plus the two private
// pools; the chaos test then makes 100,000 calls per pool with 10 kills. By default (and
// with -short, and under -race, where lanes are race-built processes too) the counts are
// scaled down so that the package's race run stays short.

// newCounters creates a counters file for n calls under t's temporary directory, maps it and
// registers it for the goroutine lanes; the cleanup unregisters and unmaps it (after the
// pool's Close, which a cleanup registered later runs first).
func newCounters(t *testing.T, n int) (path string, runs []atomic.Uint32) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "runs")
	if err := os.WriteFile(path, make([]byte, 4*n), 0o600); err != nil {
		t.Fatal(err)
	}
	runs, mem, err := mapCounters(path)
	if err != nil {
		t.Fatal(err)
	}
	stressCounters.Store(path, runs)
	t.Cleanup(func() {
		stressCounters.Delete(path)
		_ = syscall.Munmap(mem)
	})
	return path, runs
}

// stressModes are the dispatch modes every stress test runs.
var stressModes = []knit.Steal{knit.StealTicket, knit.StealDekker, knit.StealOff}

// stressCount is the number of calls per pool: full is KNIT_STRESS=full's.
func stressCount(full, normal, short, race int) int {
	switch {
	case os.Getenv("KNIT_STRESS") == "full":
		return full
	case raceEnabled:
		return race
	case testing.Short():
		return short
	}
	return normal
}

// stressDeadline bounds every call of a stress test: a call still unsettled then is a bug
// (a lost call), reported with a goroutine dump rather than as a hung test.
func stressDeadline() time.Duration {
	if raceEnabled || os.Getenv("KNIT_STRESS") == "full" {
		return 10 * time.Minute
	}
	return 3 * time.Minute
}

// drive makes calls 0..n-1 on p from sequential callers and from callers keeping a window of
// futures, with ctx bounding each call, and hands each outcome to check (from many
// goroutines). Call id is Slow when id%50 == 7, Idempotent when idem(id).
func drive(ctx context.Context, p *knit.Pool, file string, n int, idem func(int) bool,
	check func(id int, got int, err error), progress func(done int64)) {
	var next, done atomic.Int64
	task := func(id int) *knit.Task[stressCall, int] {
		if idem(id) {
			return stressIdem
		}
		return stressOnce
	}
	call := func(id int) stressCall { return stressCall{ID: id, Runs: file, Slow: id%50 == 7} }
	finish := func(id, got int, err error) {
		check(id, got, err)
		if progress != nil {
			progress(done.Add(1))
		}
	}
	const sequential, windowed, window = 12, 4, 64
	var wg sync.WaitGroup
	for range sequential {
		wg.Go(func() {
			for id := int(next.Add(1) - 1); id < n; id = int(next.Add(1) - 1) {
				got, err := task(id).Call(ctx, p, call(id))
				finish(id, got, err)
			}
		})
	}
	for range windowed {
		wg.Go(func() {
			type pending struct {
				id int
				f  *knit.Future[int]
			}
			var ring []pending
			for {
				if id := int(next.Add(1) - 1); id < n {
					ring = append(ring, pending{id, task(id).Go(ctx, p, call(id))})
					if len(ring) < window {
						continue
					}
				}
				if len(ring) == 0 {
					return
				}
				got, err := ring[0].f.Wait()
				finish(ring[0].id, got, err)
				ring = ring[1:]
			}
		})
	}
	wg.Wait()
}

// dumpGoroutines logs every goroutine's stack (a stuck call's story).
func dumpGoroutines(t *testing.T) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	t.Logf("goroutines:\n%s", buf.String())
}

// stressWithin runs f and fails t with a goroutine dump if it has not returned within d (the
// per-call deadlines should have settled every call long before).
func stressWithin(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	finished := make(chan struct{})
	go func() { defer close(finished); f() }()
	select {
	case <-finished:
	case <-time.After(d):
		dumpGoroutines(t)
		t.Fatalf("calls still unsettled %v after the start, past their deadline", d)
	}
}

// sumClaimed is the calls the pool's lanes took from the shared submit ring.
func sumClaimed(p *knit.Pool) (n uint64) {
	for _, l := range p.Stats().Lanes {
		n += l.Claimed
	}
	return n
}

// 1,000,000 calls (KNIT_STRESS=full) over 4 stealing process lanes and 4 stealing goroutine
// lanes, 250,000 per pool and discipline, from sequential callers and windows of futures,
// 1 call in 50 blocking its lane for a moment: every call returns its own result and runs
// exactly once. The private pools (StealOff) run the same calls.
func TestStealStress(t *testing.T) {
	n := stressCount(250_000, 40_000, 8_000, 10_000)
	for _, rt := range []knit.Runtime{knit.Process, knit.Goroutine} {
		modes := stressModes
		if rt == knit.Goroutine {
			modes = append(modes[:len(modes):len(modes)], knit.StealLocal)
		}
		for _, mode := range modes {
			t.Run(fmt.Sprintf("%v/%v", rt, mode), func(t *testing.T) {
				file, counters := newCounters(t, n)
				p, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: rt, Steal: mode, Logger: zap.NewNop()}, stressOnce, stressIdem)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close(context.Background()) })
				ctx, cancel := context.WithTimeout(context.Background(), stressDeadline())
				defer cancel()
				var bad atomic.Int64
				var first atomic.Value
				var stuck atomic.Bool
				returned := make([]atomic.Uint32, n)
				start := time.Now()
				stressWithin(t, stressDeadline()+time.Minute, func() {
					drive(ctx, p, file, n, func(id int) bool { return id%2 == 0 }, func(id, got int, err error) {
						returned[id].Add(1)
						if err == nil && got == stressResult(id) {
							return
						}
						bad.Add(1)
						if errors.Is(err, context.DeadlineExceeded) {
							stuck.Store(true)
						}
						first.CompareAndSwap(nil, fmt.Sprintf("call %d: got %d, %v; want %d", id, got, err, stressResult(id)))
					}, nil)
				})
				elapsed := time.Since(start)
				if stuck.Load() {
					dumpGoroutines(t)
				}
				if b := bad.Load(); b > 0 {
					t.Fatalf("%d calls failed or returned a wrong result; first: %v", b, first.Load())
				}
				for id := range n {
					if r, c := counters[id].Load(), returned[id].Load(); r != 1 || c != 1 {
						t.Fatalf("call %d ran %d times and returned %d times, want once", id, r, c)
					}
				}
				st := p.Stats()
				claimed := sumClaimed(p)
				t.Logf("%d calls in %v (%.0f calls/s); Stats.Steal %v, claimed from the shared ring %d",
					n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), st.Steal, claimed)
				switch {
				case mode == knit.StealOff && (claimed != 0 || st.Steal != knit.StealOff):
					t.Errorf("private lanes: Stats.Steal %v, %d calls claimed from a shared ring", st.Steal, claimed)
				case mode == knit.StealLocal && st.Steal != knit.StealLocal:
					t.Errorf("Steal local: Stats.Steal %v", st.Steal) // (uniform calls: it may steal none)
				case mode != knit.StealOff && (st.Steal != mode || claimed == 0):
					t.Errorf("Steal %v: Stats.Steal %v, %d calls claimed from the shared ring", mode, st.Steal, claimed)
				}
			})
		}
	}
}

// Chaos over 4 stealing process lanes: process lanes are SIGKILLed at random while half the
// calls (the Idempotent ones) may run again and half may not. Every call settles (a
// deadline bounds each, and a goroutine dump explains any that does not); every Idempotent
// call succeeds; a non-Idempotent call runs at most once, and fails only if it had started
// on a lane that died; and a call runs again only because a lane died while running it.
//
// What is provable from outside: a lane runs one call at a time, so each lane death
// interrupts at most one started, unsettled call, which is then either failed (not
// Idempotent) or run again (Idempotent) — calls it had claimed but not started go to
// another lane without having run. Hence, summed over all calls, the extra runs plus the
// failed non-Idempotent calls are at most the number of lane deaths. (The counter is
// bumped when the task starts, so a call killed between its start and that increment ran
// "0 times" there: the bound still holds.)
func TestStealChaos(t *testing.T) {
	n := stressCount(100_000, 24_000, 6_000, 4_000)
	kills := stressCount(10, 10, 4, 4)
	for _, mode := range stressModes {
		t.Run(mode.String(), func(t *testing.T) {
			file, counters := newCounters(t, n)
			var deaths atomic.Int64
			var readyMu sync.Mutex
			ready := sync.NewCond(&readyMu)
			p, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: knit.Process, Steal: mode, Logger: zap.NewNop(),
				Restart: knit.Restart{MaxRestarts: -1, Backoff: knit.Backoff{Min: time.Millisecond, Max: 10 * time.Millisecond}},
				OnEvent: func(e knit.Event) {
					if e.Lane >= 0 && (e.To == knit.StateCrashed || e.To == knit.StateExited) {
						deaths.Add(1)
					}
					readyMu.Lock()
					ready.Broadcast()
					readyMu.Unlock()
				}}, stressOnce, stressIdem)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			pids := &lanePIDs{}
			notePIDs := func() { pids.note(p) }
			notePIDs()

			idem := func(id int) bool { return id%2 == 0 }
			var failedOnce, bad atomic.Int64
			var first atomic.Value
			var stuck atomic.Bool
			failed := make([]atomic.Bool, n)
			killAt := make(chan struct{}, kills)
			every := int64(n / (kills + 1))
			ctx, cancel := context.WithTimeout(context.Background(), stressDeadline())
			defer cancel()
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				drive(ctx, p, file, n, idem, func(id, got int, err error) {
					var ke *knit.Error
					var what string
					switch {
					case err == nil && got == stressResult(id):
						return
					case err == nil:
						what = fmt.Sprintf("returned %d, want %d", got, stressResult(id))
					case errors.Is(err, context.DeadlineExceeded):
						stuck.Store(true)
						what = fmt.Sprintf("did not settle: %v", err)
					case idem(id):
						what = fmt.Sprintf("Idempotent call failed: %v", err)
					case !errors.As(err, &ke):
						what = fmt.Sprintf("uncoded error %v", err)
					case !ke.Started:
						what = fmt.Sprintf("failed although it had not started: %v", err)
					default:
						failed[id].Store(true)
						failedOnce.Add(1)
						return
					}
					bad.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("call %d %s", id, what))
				}, func(done int64) {
					if done%every == 0 {
						select {
						case killAt <- struct{}{}:
						default:
						}
					}
				})
			}()
			// The per-call deadline settles every call well before giveUp, unless a call is
			// lost for good: then the goroutine dump shows where it is.
			giveUp := time.NewTimer(stressDeadline() + time.Minute)
			defer giveUp.Stop()
			killed := 0
			for loop := true; loop; {
				select {
				case <-killAt:
					if killed == kills {
						continue
					}
					notePIDs()
					lanes := p.Stats().Lanes
					if l := lanes[rand.N(len(lanes))]; l.PID > 0 && l.State == knit.StateReady {
						if err := syscall.Kill(l.PID, syscall.SIGKILL); err == nil {
							killed++
						}
					}
				case <-finished:
					loop = false
				case <-giveUp.C:
					dumpGoroutines(t)
					t.Fatalf("calls still unsettled %v after the start, past their deadline", stressDeadline()+time.Minute)
				}
			}
			if stuck.Load() {
				dumpGoroutines(t)
			}
			if b := bad.Load(); b > 0 {
				t.Fatalf("%d calls broke the rules; first: %v", b, first.Load())
			}
			extra := 0
			for id := range n {
				r := int(counters[id].Load())
				switch {
				case !idem(id) && r > 1:
					t.Errorf("non-Idempotent call %d ran %d times", id, r)
				case !failed[id].Load() && r < 1:
					t.Errorf("call %d succeeded but never ran", id)
				case r > 1:
					extra += r - 1
				}
			}
			// The pool serves on every lane again; then every death has been an event.
			readyMu.Lock()
			for !allReady(p) {
				ready.Wait()
			}
			readyMu.Unlock()
			for i := range 64 {
				if got, err := stressOnce.Call(context.Background(), p, stressCall{ID: i, Runs: file}); err != nil || got != stressResult(i) {
					t.Errorf("call after the chaos: %d, %v", got, err)
				}
			}
			// Kills are honest deaths: the journals say what each lane held, and the host
			// gives its ring up only for words no protocol writes, or calls stuck on it.
			if knit.StealDegraded(p) {
				t.Errorf("the pool gave its shared ring up after kills: %s", knit.StealState(p))
			}
			notePIDs()
			// Every kill is a death (a killed lane was ready); a lane killed last may still
			// be seen ready before its end is an event, so the kills count too.
			d := max(deaths.Load(), int64(killed))
			t.Logf("%d calls, %d kills, %d lane deaths, %d Idempotent re-runs, %d non-Idempotent calls failed; Stats.Steal %v",
				n, killed, deaths.Load(), extra, failedOnce.Load(), p.Stats().Steal)
			if killed == 0 {
				t.Fatal("no lane was killed")
			}
			if int64(extra)+failedOnce.Load() > d {
				t.Errorf("%d re-runs and %d failed calls for %d lane deaths: more than the calls that were running",
					extra, failedOnce.Load(), d)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			pids.checkGone(t)
		})
	}
}

// Issue 13's stuck call, as often as it can happen: stealing pools of 2 lanes without the
// watchdog's backstop, many short rounds in which a call that does not end holds one lane
// and a few adds follow it at once, so that the first add is published while the held
// call's claimant may be between its claim and the held call's start. Every add must be
// claimed by the other lane: before the fix, the host counted the claimant as a lane
// looking for work and rang neither lane, and the add waited for ever (a goroutine lane)
// or for a parked process lane's safety net (parkSafetyNet, 10 s: the adds here wait 5 s).
func TestStealFreeLaneStress(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		rounds, wait := stressCount(20000, 2000, 400, 600), 10*time.Second
		if rt == knit.Process {
			rounds, wait = stressCount(10000, 1000, 200, 600), 5*time.Second
		}
		for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
			t.Run(rt.String()+"/"+mode.String(), func(t *testing.T) {
				freeLaneRounds(t, rt, mode, rounds, wait)
			})
		}
	}
}

// freeLaneRounds is one pool of TestStealFreeLaneStress: rounds of a held call and 3 adds,
// each of which must settle within wait.
func freeLaneRounds(t *testing.T, rt knit.Runtime, mode knit.Steal, rounds int, wait time.Duration) {
	p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Steal: mode, Logger: quiet()}, stealTasks...)
	if err != nil {
		t.Fatal(err)
	}
	knit.StealAlways(p) // the calls under test go through the shared ring

	defer func() { // bounded: a call left on the ring keeps Close waiting
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	}()
	knit.StopStealBackstop(p)
	for r := range rounds {
		ctx, release := context.WithCancel(context.Background())
		held := sleepy.Go(ctx, p, 0)
		for i := range 3 {
			actx, acancel := context.WithTimeout(context.Background(), wait) // longer: stuck
			v, err := add.Call(actx, p, [2]int64{int64(r), int64(i)})
			acancel()
			if err != nil || v != int64(r+i) {
				state := knit.StealState(p)
				release()
				t.Fatalf("round %d, add %d: %d, %v; %s", r, i, v, err, state)
			}
		}
		release()
		if _, err := held.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: held call: %v", r, err)
		}
	}
}

// stealTargets are the shared words a hostile lane writes in TestStealHostileLane: every
// word of steal.Ring.Words by family, and the abort bitmap.
var stealTargets = []string{"control", "head", "tail", "live", "order", "stamp", "want", "journal", "entries",
	"H", "W", "slot", "aborts"}

// TestStealHostileLane (issue 29): on a Ticket and on a Dekker pool of 3 process lanes, a
// task running in one lane writes one family of the shared ring's words (stealScribble),
// again and again for 300 ms, while 16 goroutines call. No call runs twice (each execution
// counts in a file every lane maps: the run log), every call returns its own result (each
// has a deadline far beyond any wait: one that reaches it was lost), the hostile lane, killed
// afterwards, restarts (the control block may be left rewritten: the host's copy of it is
// what a lane is started against), the pool serves, and Close returns. Whether the host gave the ring up (it does when the words
// it audits are written, or calls stay stuck) is logged: the journals, stamps and WANT words
// are hints the host checks everything against, and writing them may only slow claims.
func TestStealHostileLane(t *testing.T) {
	targets := stealTargets
	if testing.Short() || raceEnabled {
		targets = []string{"head", "W", "control", "want"}
	}
	for _, mode := range []knit.Steal{knit.StealTicket, knit.StealDekker} {
		for _, target := range targets {
			t.Run(mode.String()+"/"+target, func(t *testing.T) { hostileLane(t, mode, target) })
		}
	}
}

func hostileLane(t *testing.T, mode knit.Steal, target string) {
	const ids = 1 << 16
	file, counters := newCounters(t, ids)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Lanes: 3, Runtime: knit.Process, Steal: mode, Logger: quiet(), Restart: eager,
		OnEvent: rec.record, Process: knit.ProcessConfig{Env: quickExit}}, stressOnce, stealScribble, add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	knit.StealAlways(p) // every call goes through the shared ring

	var next atomic.Int64
	var bad atomic.Int64
	var first atomic.Value
	report := func(format string, args ...any) {
		bad.Add(1)
		first.CompareAndSwap(nil, fmt.Sprintf(format, args...))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := int(next.Add(1) - 1)
				if id >= ids {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				got, err := stressOnce.Call(ctx, p, stressCall{ID: id, Runs: file})
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					report("call %d did not settle: %v; %s", id, err, knit.StealState(p))
				case err != nil:
					report("call %d: %v", id, err)
				case got != stressResult(id):
					report("call %d returned %d, want %d", id, got, stressResult(id))
				}
			}
		})
	}
	out, err := stealScribble.Call(context.Background(), p, scribbleIn{Target: target, MS: 300, Seed: rand.Uint64()})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the scribbling call: %v", err)
	}
	if b := bad.Load(); b > 0 {
		t.Errorf("%d calls went wrong; first: %v", b, first.Load())
	}
	n := int(next.Load())
	for id := range min(n, ids) {
		if r := counters[id].Load(); r > 1 {
			t.Errorf("call %d ran %d times", id, r)
		}
	}
	// The hostile lane dies and comes back: whatever it left in the mapping (a zeroed magic
	// among it) does not keep a lane from starting.
	hostile := -1
	for i, ls := range p.Stats().Lanes {
		if ls.PID == out.PID {
			hostile = i
		}
	}
	if hostile < 0 {
		t.Fatalf("no lane has PID %d: %+v", out.PID, p.Stats().Lanes)
	}
	mark := rec.mark()
	if err := syscall.Kill(out.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.awaitFrom(t, mark, "the hostile lane restarted", func(e knit.Event) bool {
		return e.Lane == hostile && e.To == knit.StateReady
	})
	// The pool serves: on its lanes' own rings if it gave the shared ring up.
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sum, err := add.Call(ctx, p, [2]int64{int64(i), 1})
		cancel()
		if err != nil || sum != int64(i)+1 {
			t.Fatalf("call %d after the scribbling: %d, %v; %s", i, sum, err, knit.StealState(p))
		}
	}
	t.Logf("%d calls, %d rounds of writes to %s; ring given up: %v", n, out.Rounds, target, knit.StealDegraded(p))
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Close did not return: %s", knit.StealState(p))
	}
}

// TestStealClaimThatSits: on a Ticket pool of process lanes, a task in one lane claims calls
// by the protocol's own words (head and W) and never hands them over (stealSit), as a
// claimant descheduled between its claim and its notice would look. Once: the host takes
// the call back after a second and dispatches it again, the caller gets its result, and the
// ring goes on. Twice within expireAgain: a lane claims calls to sit on them, and the host
// gives the ring up; every call still returns its result.
func TestStealClaimThatSits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		gone  bool
	}{{"once", 1, false}, {"twice", 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 2, Steal: knit.StealTicket, Logger: quiet(),
				Process: knit.ProcessConfig{Env: quickExit}}, stealSit, add)
			knit.StealAlways(p)
			sitter := stealSit.Go(context.Background(), p, scribbleIn{MS: 60_000, Limit: tc.limit})
			for i := 0; ; i++ {
				select {
				case <-sitter.Done():
				default:
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					sum, err := add.Call(ctx, p, [2]int64{int64(i), 1})
					cancel()
					if err != nil || sum != int64(i)+1 {
						t.Fatalf("add %d: %d, %v; %s", i, sum, err, knit.StealState(p))
					}
					continue
				}
				break
			}
			took, err := sitter.Wait()
			if err != nil || took != tc.limit {
				t.Fatalf("the sitter took %d calls (%v), want %d", took, err, tc.limit)
			}
			callAdds(t, p, 20) // the calls it sat on included, every call is answered
			if tc.gone {
				// The second call it sat on is taken back by giving the ring up, whenever the
				// audit comes to it: wait for it, through a call that waits for nothing else.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				for !knit.StealDegraded(p) {
					if _, err := add.Call(ctx, p, [2]int64{1, 1}); err != nil {
						t.Fatalf("waiting for the ring to be given up: %v; %s", err, knit.StealState(p))
					}
				}
				if why := p.Stats().StealGivenUp; why == "" {
					t.Errorf("the ring was given up and Stats.StealGivenUp is empty")
				} else {
					t.Logf("Stats.StealGivenUp: %s", why)
				}
			} else if knit.StealDegraded(p) || p.Stats().StealGivenUp != "" {
				t.Errorf("one call sat on gave the ring up: %s (Stats: %q)", knit.StealState(p), p.Stats().StealGivenUp)
			}
		})
	}
}
