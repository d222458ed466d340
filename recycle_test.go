package knit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit"
)

// Recycling (MaxCallsPerLane, MaxLaneMemory) and Resize: lanes are replaced, added and
// retired under load without losing a call, running one twice, or dipping below the
// capacity the pool should have. Runs are counted per call id: in memory for goroutine
// lanes, in the mapped counters file of the settlement tasks (tasks_test.go) for
// process lanes.

// lifeWatch follows a pool's events: which lane incarnations serve (from ready until they
// stop, a recycled one until it stops too), the fewest serving at once while armed, and
// the order of recycles.
type lifeWatch struct {
	mu      sync.Mutex
	events  []knit.Event
	serving map[[2]int]bool
	armed   bool
	least   int
	changed chan struct{} // a token after each event
}

func newLifeWatch() *lifeWatch {
	return &lifeWatch{serving: map[[2]int]bool{}, least: 1 << 30, changed: make(chan struct{}, 1)}
}

func (w *lifeWatch) on(e knit.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, e)
	select {
	case w.changed <- struct{}{}:
	default:
	}
	if e.Lane < 0 {
		return
	}
	k := [2]int{e.Lane, e.Incarnation}
	switch e.To {
	case knit.StateReady:
		w.serving[k] = true
	case knit.StateRecycling: // it serves on until its replacement is ready
	default:
		delete(w.serving, k)
	}
	if w.armed {
		w.least = min(w.least, len(w.serving))
	}
}

func (w *lifeWatch) arm(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = on
	if on {
		w.least = len(w.serving)
	}
}

// await waits until n events have gone to state, or until quit is closed.
func (w *lifeWatch) await(state knit.State, n int, quit <-chan struct{}) {
	for {
		w.mu.Lock()
		seen := 0
		for _, e := range w.events {
			if e.To == state {
				seen++
			}
		}
		w.mu.Unlock()
		if seen >= n {
			return
		}
		select {
		case <-w.changed:
		case <-quit:
			return
		}
	}
}

func (w *lifeWatch) snapshot() ([]knit.Event, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]knit.Event(nil), w.events...), w.least
}

// checkRecycles checks every recycle in events: the replacement of lane L's incarnation i
// is ready before i begins to stop, and nothing crashed or restarted. It returns how many
// recycles there were.
func checkRecycles(t *testing.T, events []knit.Event) int {
	t.Helper()
	recycles := 0
	for k, e := range events {
		switch e.To {
		case knit.StateCrashed, knit.StateExited, knit.StateRestarting, knit.StateCrashLoopBackoff, knit.StateStartupFailed, knit.StateDead:
			t.Errorf("event %d: %+v: a recycle is not a failure", k, e)
		}
		if e.To != knit.StateRecycling {
			continue
		}
		recycles++
		readyAt, stopAt := -1, -1
		for j := k + 1; j < len(events); j++ {
			f := events[j]
			if f.Lane != e.Lane {
				continue
			}
			if readyAt < 0 && f.Incarnation > e.Incarnation && f.To == knit.StateReady {
				readyAt = j
			}
			if stopAt < 0 && f.Incarnation == e.Incarnation && f.To == knit.StateStopping {
				stopAt = j
			}
		}
		if stopAt >= 0 && (readyAt < 0 || readyAt > stopAt) {
			t.Errorf("lane %d incarnation %d began to stop (event %d) before its replacement was ready (event %d)",
				e.Lane, e.Incarnation, stopAt, readyAt)
		}
	}
	return recycles
}

// load runs calls with unique ids from goroutines until stop is closed or the ids run out;
// call returns the result of id's call.
type load struct {
	next, done atomic.Int64
	wrong      atomic.Value
	failed     atomic.Int64
	wg         sync.WaitGroup
	stop, out  chan struct{}
	ids        int64

	target  atomic.Int64 // until's goal for done
	mu      sync.Mutex
	reached chan struct{} // closed when done reaches target
}

// errStopLoad, returned by a load's call, stops its goroutine.
var errStopLoad = errors.New("stop the load")

func startLoad(goroutines int, ids int64, call func(id int) (int, error)) *load {
	ld := &load{stop: make(chan struct{}), out: make(chan struct{}), ids: ids}
	ld.target.Store(math.MaxInt64)
	for range goroutines {
		ld.wg.Go(func() {
			for {
				select {
				case <-ld.stop:
					return
				default:
				}
				id := ld.next.Add(1) - 1
				if id >= ids {
					return
				}
				got, err := call(int(id))
				switch {
				case errors.Is(err, errStopLoad):
					return
				case err != nil:
					ld.failed.Add(1)
					ld.wrong.Store(fmt.Sprintf("call %d: %v", id, err))
				case got != int(2*id):
					ld.wrong.Store(fmt.Sprintf("call %d returned %d", id, got))
				}
				if d := ld.done.Add(1); d >= ld.target.Load() {
					ld.mu.Lock()
					if ld.reached != nil && d >= ld.target.Load() {
						close(ld.reached)
						ld.reached = nil
						ld.target.Store(math.MaxInt64)
					}
					ld.mu.Unlock()
				}
			}
		})
	}
	go func() {
		ld.wg.Wait()
		close(ld.out)
	}()
	return ld
}

// until waits for n more calls to have finished, or for the callers to run out of ids.
func (ld *load) until(n int64) {
	ld.mu.Lock()
	ch := make(chan struct{})
	ld.reached = ch
	ld.target.Store(ld.done.Load() + n)
	ld.mu.Unlock()
	select {
	case <-ch:
	case <-ld.out:
	}
}

func (ld *load) finish(t *testing.T) int64 {
	t.Helper()
	close(ld.stop)
	ld.wg.Wait()
	if w := ld.wrong.Load(); w != nil {
		t.Fatalf("%d calls failed or were wrong; one: %v", ld.failed.Load(), w)
	}
	return min(ld.next.Load(), ld.ids) // the calls made: ids [0, n)
}

// checkRuns checks that each of the first n calls ran exactly once.
func checkRuns(t *testing.T, runs []atomic.Uint32, n int64) {
	t.Helper()
	bad := 0
	for id := range min(n, int64(len(runs))) {
		if r := runs[id].Load(); r != 1 {
			if bad++; bad <= 5 {
				t.Errorf("call %d ran %d times", id, r)
			}
		}
	}
	if bad > 5 {
		t.Errorf("… %d calls in all did not run exactly once", bad)
	}
}

func memRuns(n int) []atomic.Uint32 {
	runs := make([]atomic.Uint32, n)
	goRuns.Store(&runs)
	return runs
}

// fileRuns makes the counters file that process lanes map (KNIT_TEST_RUNS) for n calls.
func fileRuns(t *testing.T, n int) (string, []atomic.Uint32) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs")
	if err := os.WriteFile(path, make([]byte, 4*n), 0o600); err != nil {
		t.Fatal(err)
	}
	runs, err := mapRuns(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, runs
}

// A goroutine lane is recycled after MaxCallsPerLane under steady load from 8 goroutines:
// no call fails, none is lost or runs twice, the replacement is always ready before the
// recycled lane stops, and the pool never has fewer than its 2 lanes serving.
//
// The load runs until two recycled incarnations have stopped, not for a fixed number of
// calls: a recycled lane serves until its replacement is ready, and a request made while
// one boots is dropped, so how many calls an incarnation serves depends on how fast the
// supervisor boots one (on a loaded machine, 20 000 calls sometimes saw one recycle).
func TestRecycleMaxCallsGoroutine(t *testing.T) {
	const ids = 2_000_000 // a cap: a pool that never recycles fails the test once they run out
	runs := memRuns(ids)
	w := newLifeWatch()
	p, err := knit.NewPool(knit.Config{Lanes: 2, MaxCallsPerLane: 1000, Logger: quiet(), OnEvent: w.on}, counted)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	w.arm(true)
	ld := startLoad(8, ids, func(id int) (int, error) { return counted.Call(context.Background(), p, id) })
	w.await(knit.StateStopping, 2, ld.out)
	n := ld.finish(t)
	w.arm(false)
	checkRuns(t, runs, n)
	events, least := w.snapshot()
	recycles := checkRecycles(t, events)
	stats := 0
	for _, l := range p.Stats().Lanes {
		stats += l.Recycles
	}
	t.Logf("%d calls, %d recycles (Stats: %d), fewest lanes serving: %d", n, recycles, stats, least)
	// The load ran until two incarnations stopped: each must have been a recycle, counted
	// alike in events and Stats (a pool that never recycles ran out of ids and fails here).
	if recycles < 2 || stats != recycles {
		t.Errorf("%d recycles in events, %d in Stats: want the same, at least 2 (%d calls, 1000 per lane)", recycles, stats, n)
	}
	if least < 2 {
		t.Errorf("only %d lanes served at one point: recycling dipped capacity", least)
	}
}

// A process lane is recycled after MaxCallsPerLane under load: a spare takes over (no call
// waits for a process start, and capacity never dips), no call fails, none runs twice.
//
// As in TestRecycleMaxCallsGoroutine, the load runs until three recycled incarnations have
// stopped (ids is a cap), not for a fixed number of calls.
func TestRecycleMaxCallsProcess(t *testing.T) {
	perLane := 2_000
	if testing.Short() {
		perLane = 700
	}
	ids := 100 * perLane
	path, runs := fileRuns(t, ids)
	w := newLifeWatch()
	core, logs := observer.New(zapcore.DebugLevel)
	p := newProcessPool(t, knit.Config{Lanes: 2, MaxCallsPerLane: perLane, Logger: zap.New(core), OnEvent: w.on,
		Process: knit.ProcessConfig{Env: []string{envRuns + "=" + path}}}, chaosOnce)
	knit.AwaitSpares(p) // the first recycle finds the spare ready
	w.arm(true)
	ld := startLoad(8, int64(ids), func(id int) (int, error) { return chaosOnce.Call(context.Background(), p, chaosCall{ID: id}) })
	w.await(knit.StateStopping, 3, ld.out)
	n := ld.finish(t)
	w.arm(false)
	checkRuns(t, runs, n)
	events, least := w.snapshot()
	recycles := checkRecycles(t, events)
	spares := logs.FilterMessage("spare process assigned").Len()
	t.Logf("%d calls, %d recycles, %d from a spare, fewest lanes serving: %d", n, recycles, spares, least)
	if recycles < 3 {
		t.Errorf("%d recycles, want at least 3 (%d calls, %d per lane)", recycles, n, perLane)
	}
	if spares == 0 {
		t.Error("no replacement took a spare")
	}
	if least < 2 {
		t.Errorf("only %d lanes served at one point: recycling dipped capacity", least)
	}
	for _, e := range events {
		if e.To == knit.StateRecycling && !strings.Contains(e.Reason, "MaxCallsPerLane") {
			t.Errorf("recycle reason %q does not name MaxCallsPerLane", e.Reason)
		}
	}
}

// A process lane whose resident memory grows past MaxLaneMemory is recycled (a planned
// replacement, not a crash), counted in Stats, and the pool serves on.
func TestRecycleMaxLaneMemory(t *testing.T) {
	w := newLifeWatch()
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), OnEvent: w.on, Liveness: 600 * time.Millisecond,
		Process: knit.ProcessConfig{MaxLaneMemory: 160 << 20}}, grow, add)
	if _, err := grow.Call(context.Background(), p, 192); err != nil {
		t.Fatal(err)
	}
	// The watchdog samples the lane's RSS at its next tick: wait for the recycle to finish.
	ended := make(chan knit.Event, 1)
	var once sync.Once
	sub := p.Events()
	go func() {
		for e := range sub {
			if e.Incarnation == 0 && e.To == knit.StateClosed {
				once.Do(func() { ended <- e })
			}
		}
	}()
	<-ended
	got, err := add.Call(context.Background(), p, [2]int64{2, 3})
	if err != nil || got != 5 {
		t.Fatalf("call after the recycle: %d, %v", got, err)
	}
	events, _ := w.snapshot()
	if n := checkRecycles(t, events); n != 1 {
		t.Errorf("%d recycles, want 1", n)
	}
	for _, e := range events {
		if e.To == knit.StateRecycling && !strings.Contains(e.Reason, "MaxLaneMemory") {
			t.Errorf("recycle reason %q does not name MaxLaneMemory", e.Reason)
		}
	}
	st := p.Stats().Lanes[0]
	if st.Recycles != 1 || st.Restarts != 0 || st.Incarnation == 0 || st.State != knit.StateReady {
		t.Errorf("lane after the recycle: %+v", st)
	}
}

// Resize under load, goroutine and process lanes: 64 goroutines call continuously while the
// pool grows from 2 to 8 lanes and shrinks back to 2. No call fails, is lost, or runs twice.
func TestResizeUnderLoad(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			const ids = 1 << 20
			var runs []atomic.Uint32
			var task func(p *knit.Pool) func(int) (int, error)
			cfg := knit.Config{Lanes: 2, Runtime: rt, Logger: quiet()}
			w := newLifeWatch()
			cfg.OnEvent = w.on
			if rt == knit.Process {
				var path string
				path, runs = fileRuns(t, ids)
				cfg.Process.Env = []string{envRuns + "=" + path}
				task = func(p *knit.Pool) func(int) (int, error) {
					return func(id int) (int, error) { return chaosOnce.Call(context.Background(), p, chaosCall{ID: id}) }
				}
			} else {
				runs = memRuns(ids)
				task = func(p *knit.Pool) func(int) (int, error) {
					return func(id int) (int, error) { return counted.Call(context.Background(), p, id) }
				}
			}
			p, err := knit.NewPool(cfg, chaosOnce, counted)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			ld := startLoad(64, ids, task(p))
			ld.until(500)
			if err := p.Resize(context.Background(), 8); err != nil {
				t.Fatalf("grow: %v", err)
			}
			st := p.Stats()
			if len(st.Lanes) != 8 || !allReady(p) {
				t.Fatalf("after growing to 8: %+v", st.Lanes)
			}
			ld.until(2000) // the new lanes take calls
			if err := p.Resize(context.Background(), 2); err != nil {
				t.Fatalf("shrink: %v", err)
			}
			if st := p.Stats(); len(st.Lanes) != 2 || !allReady(p) {
				t.Fatalf("after shrinking to 2: %+v", st.Lanes)
			}
			ld.until(500)
			n := ld.finish(t)
			checkRuns(t, runs, n)
			events, _ := w.snapshot()
			added, retired, removed := 0, 0, 0
			for _, e := range events {
				switch {
				case e.To == knit.StateBooting && strings.HasPrefix(e.Reason, "added"):
					added++
				case e.To == knit.StateRetiring:
					retired++
				case e.To == knit.StateRemoved:
					removed++
				case e.To == knit.StateCrashed || e.To == knit.StateRestarting:
					t.Errorf("event %+v while resizing", e)
				}
			}
			t.Logf("%d calls; lanes added %d, retired %d, removed %d", n, added, retired, removed)
			if added != 6 || retired != 6 || removed != 6 {
				t.Errorf("lanes added %d, retired %d, removed %d: want 6 each", added, retired, removed)
			}
		})
	}
}

// Resize racing Close, goroutine and process lanes: every Resize returns nil or
// POOL_CLOSED, Close settles everything (goleak checks that nothing is left running), calls
// succeed or fail with POOL_CLOSED, none runs twice, and a Resize after Close fails with
// POOL_CLOSED.
func TestResizeRacingClose(t *testing.T) {
	type round struct {
		rt       knit.Runtime
		from, to int
		mid      bool // Close once the resize is under way (a lane added is booting, or one retires)
	}
	rounds := []round{{knit.Goroutine, 2, 6, false}, {knit.Goroutine, 6, 1, false}, {knit.Goroutine, 3, 8, true}, {knit.Goroutine, 8, 2, true},
		{knit.Process, 2, 5, true}, {knit.Process, 5, 1, true}}
	for _, r := range rounds {
		t.Run(fmt.Sprintf("%v-%dto%d-mid=%v", r.rt, r.from, r.to, r.mid), func(t *testing.T) {
			const ids = 1 << 16
			underway := make(chan struct{})
			var once sync.Once
			// StopAckTimeout: a machine busy enough may hold a lane past the default 50ms;
			// a lane that never acknowledges still fails the test, later.
			cfg := knit.Config{Lanes: r.from, Runtime: r.rt, Logger: quiet(), StopAckTimeout: 10 * time.Second, OnEvent: func(e knit.Event) {
				if e.To == knit.StateRetiring || e.To == knit.StateBooting && strings.HasPrefix(e.Reason, "added") {
					once.Do(func() { close(underway) })
				}
			}}
			var runs []atomic.Uint32
			if r.rt == knit.Process {
				var path string
				path, runs = fileRuns(t, ids)
				cfg.Process.Env = []string{envRuns + "=" + path}
			} else {
				runs = memRuns(ids)
			}
			p, err := knit.NewPool(cfg, counted, chaosOnce)
			if err != nil {
				t.Fatal(err)
			}
			var closed atomic.Int64
			ld := startLoad(16, ids, func(id int) (int, error) {
				var got int
				var err error
				if r.rt == knit.Process {
					got, err = chaosOnce.Call(context.Background(), p, chaosCall{ID: id})
				} else {
					got, err = counted.Call(context.Background(), p, id)
				}
				if errors.Is(err, knit.ErrPoolClosed) {
					closed.Add(1)
					return 0, errStopLoad
				}
				return got, err
			})
			ld.until(200)
			var wg sync.WaitGroup
			var rerr, cerr error
			wg.Go(func() { rerr = p.Resize(context.Background(), r.to) })
			if r.mid {
				<-underway
			}
			cerr = p.Close(context.Background())
			wg.Wait()
			n := ld.finish(t)
			if rerr != nil && !errors.Is(rerr, knit.ErrPoolClosed) {
				t.Errorf("Resize racing Close: %v", rerr)
			}
			if cerr != nil {
				t.Errorf("Close: %v", cerr)
			}
			err = p.Resize(context.Background(), 4)
			var ke *knit.Error
			if !errors.As(err, &ke) || ke.Code != knit.CodePoolClosed {
				t.Errorf("Resize after Close: %v, want POOL_CLOSED", err)
			}
			for id := range n {
				if r := runs[id].Load(); r > 1 {
					t.Errorf("call %d ran %d times", id, r)
				}
			}
			t.Logf("%d calls, %d refused as closed; Resize: %v", n, closed.Load(), rerr)
		})
	}
}

// A retiring lane finishes the call it holds before Resize returns; when Resize's context
// ends first, the lane is stopped at once through the stop protocol (a goroutine lane whose
// task does not return is abandoned: its call fails with THREAD_CLOSED) and Resize returns
// CANCELED.
func TestResizeShrinkFinishesHeldCalls(t *testing.T) {
	for _, cancelFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancelFirst), func(t *testing.T) {
			retiring := make(chan struct{})
			var once sync.Once
			// Private lanes: the test places calls on given lanes.
			p := newPool(t, knit.Config{Lanes: 2, Logger: quiet(), Steal: knit.StealOff, OnEvent: func(e knit.Event) {
				if e.Lane == 1 && e.To == knit.StateRetiring {
					once.Do(func() { close(retiring) })
				}
			}})
			g0, g1 := newGate(), newGate()
			f0 := block.Go(context.Background(), p, g0)
			<-g0.started // lane 0 is busy: the next call goes to lane 1
			f1 := block.Go(context.Background(), p, g1)
			<-g1.started
			if st := p.Stats().Lanes; st[1].InFlight != 1 {
				t.Fatalf("lane 1 holds %d calls, want the blocked one", st[1].InFlight)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resized := make(chan error, 1)
			go func() { resized <- p.Resize(ctx, 1) }()
			<-retiring
			// A call now goes to lane 0, which is busy, rather than to the retiring lane.
			f2 := add.Go(context.Background(), p, [2]int64{1, 1})
			if cancelFirst {
				cancel()
				err := <-resized
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Resize with its context cancelled: %v", err)
				}
				if _, err := f1.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
					t.Errorf("the call of the lane stopped at once: %v, want THREAD_CLOSED", err)
				}
				close(g1.open) // the abandoned goroutine ends
			} else {
				close(g1.open)
				if err := <-resized; err != nil {
					t.Fatalf("Resize: %v", err)
				}
				select {
				case <-f1.Done():
				default:
					t.Error("Resize returned before the retiring lane's call settled")
				}
				if got, err := f1.Wait(); err != nil || got != "opened" {
					t.Errorf("the retiring lane's call: %q, %v", got, err)
				}
			}
			close(g0.open)
			if got, err := f0.Wait(); err != nil || got != "opened" {
				t.Errorf("lane 0's call: %q, %v", got, err)
			}
			if got, err := f2.Wait(); err != nil || got != 2 {
				t.Errorf("a call made while lane 1 retired: %d, %v", got, err)
			}
			if n := len(p.Stats().Lanes); n != 1 {
				t.Errorf("%d lanes after Resize(1)", n)
			}
		})
	}
}
