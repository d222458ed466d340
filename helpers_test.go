package knit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit"
)

// Helpers that the tests of several files share. A helper that one file's tests use stays in
// that file; the tasks and what they need are in tasks_test.go, the benchmarks' helpers in
// pool_bench_test.go.

// Pools and calls.

// newPool starts a pool of the basic tasks, which the test's cleanup closes.
func newPool(t testing.TB, cfg knit.Config) *knit.Pool {
	t.Helper()
	tasks := []knit.Definition{add, echo, fail, boom, block, blockTimeout, blockDefault, goexit}
	if cfg.Runtime == knit.Process {
		// A *gate holds channels in unexported fields: it cannot cross a process boundary,
		// and NewPool refuses it for process lanes.
		tasks = []knit.Definition{add, echo, fail, boom, goexit}
	}
	p, err := knit.NewPool(cfg, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// addConcurrently makes n add calls from workers goroutines and checks every sum.
func addConcurrently(t *testing.T, p *knit.Pool, n, workers int) {
	t.Helper()
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				sum, err := add.Call(context.Background(), p, [2]int64{int64(i), int64(w)})
				if err != nil || sum != int64(i+w) {
					errc <- fmt.Errorf("call %d: %d, %v", i, sum, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

// newProcessPool starts a pool of process lanes serving tasks (procTasks if none), which the
// test's cleanup closes.
func newProcessPool(t testing.TB, cfg knit.Config, tasks ...knit.Definition) *knit.Pool {
	t.Helper()
	cfg.Runtime = knit.Process
	if len(tasks) == 0 {
		tasks = procTasks
	}
	p, err := knit.NewPool(cfg, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// quiet is a logger for tests whose lanes are meant to fail loudly.
func quiet() *zap.Logger { return zap.NewNop() }

// quickExit keeps a lane built with the race detector from sleeping a second at exit (its
// atexit_sleep_ms), which Close, once the lane has acknowledged its stop, would wait for.
var quickExit = []string{"GORACE=atexit_sleep_ms=0"}

// eager restarts a lane that a test kills again and again at once, however often.
var eager = knit.Restart{MaxRestarts: -1, Backoff: knit.Backoff{Min: -1, Jitter: -1}}

// Errors and events.

// wantCode fails t unless err is a *knit.Error with code.
func wantCode(t *testing.T, what string, err error, code knit.Code) {
	t.Helper()
	var ke *knit.Error
	if !errors.As(err, &ke) || ke.Code != code {
		t.Fatalf("%s: err = %v, want %s", what, err, code)
	}
}

// recorder keeps a pool's events and lets a test wait for one.
type recorder struct {
	mu   sync.Mutex
	cond *sync.Cond
	all  []knit.Event
}

func newRecorder() *recorder {
	r := &recorder{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *recorder) record(e knit.Event) {
	r.mu.Lock()
	r.all = append(r.all, e)
	r.cond.Broadcast()
	r.mu.Unlock()
}

// await blocks until an event matches (the supervisor reports every transition). A bound
// far beyond any expected wait turns a hang into a failure with the events so far.
func (r *recorder) await(t testing.TB, what string, match func(knit.Event) bool) knit.Event {
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
		for _, e := range r.all {
			if match(e) {
				return e
			}
		}
		if expired {
			t.Fatalf("no event: %s; events: %+v", what, r.all)
		}
		r.cond.Wait()
	}
}

func (r *recorder) events(lane int) []knit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []knit.Event
	for _, e := range r.all {
		if e.Lane == lane {
			out = append(out, e)
		}
	}
	return out
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

// events collects a pool's transitions through OnEvent and lets a test wait for one.
type events struct {
	mu   sync.Mutex
	seen []knit.Event
	more chan struct{}
}

func newEvents() *events { return &events{more: make(chan struct{}, 1)} }

func (e *events) on(ev knit.Event) {
	e.mu.Lock()
	e.seen = append(e.seen, ev)
	e.mu.Unlock()
	select {
	case e.more <- struct{}{}:
	default:
	}
}

// await waits for an event that f accepts.
func (e *events) await(t *testing.T, what string, f func(knit.Event) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		e.mu.Lock()
		for _, ev := range e.seen {
			if f(ev) {
				e.mu.Unlock()
				return
			}
		}
		e.mu.Unlock()
		select {
		case <-e.more:
		case <-deadline:
			t.Fatalf("no %s event in %+v", what, e.seen)
		}
	}
}

// Lanes and their processes.

// allReady reports whether every lane of p is ready.
func allReady(p *knit.Pool) bool {
	for _, l := range p.Stats().Lanes {
		if l.State != knit.StateReady {
			return false
		}
	}
	return true
}

// shmNames lists the named mappings this process created (their names carry its pid).
func shmNames(t *testing.T) []string {
	t.Helper()
	m, _ := filepath.Glob(fmt.Sprintf("/dev/shm/knit-%d-*", os.Getpid()))
	return m
}

// children lists this process's child processes.
func children(t *testing.T) []string {
	t.Helper()
	me := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []string
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(b[bytes.LastIndexByte(b, ')')+2:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == me {
			kids = append(kids, s)
		}
	}
	return kids
}

// checkNoLeaks fails t if child processes or /dev/shm names of this process are left.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	if kids := children(t); len(kids) > 0 {
		t.Errorf("child processes left: %v", kids)
	}
	if names := shmNames(t); len(names) > 0 {
		t.Errorf("/dev/shm names left: %v", names)
	}
}

// startHelperHost runs this test binary's test helper as a child host, with env set
// ("NAME=value"), and returns it and its stdout. The child dies with the test (Pdeathsig).
func startHelperHost(t *testing.T, helper, env string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// lanePIDs collects every lane process a pool has had, so that a test can check that none
// outlives Close.
type lanePIDs struct {
	mu   sync.Mutex
	seen map[int]bool
}

// note records the pool's current lane processes.
func (s *lanePIDs) note(p *knit.Pool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[int]bool{}
	}
	for _, l := range p.Stats().Lanes {
		if l.PID > 0 {
			s.seen[l.PID] = true
		}
	}
}

// checkGone fails t for every noted process that still exists.
func (s *lanePIDs) checkGone(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid := range s.seen {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("lane process %d still exists after Close", pid)
		}
	}
}

// Load while lanes are recycled, added and retired: calls with unique ids, each run counted,
// and the lanes' lives followed through their events.

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

// fifoWait is how long a test waits for a lane at the other end of a FIFO: a watchdog
// against a lane that died before it opened its end, not a speed claim.
const fifoWait = time.Minute

// fifoWrite writes a byte into the FIFO at path, which a task reads to go on. It fails the
// test, rather than hanging it, if nothing opens the FIFO to read within fifoWait (the
// lane died first).
func fifoWrite(t *testing.T, path, what string) {
	t.Helper()
	fifoEnd(t, path, what, true)
}

// fifoRead reads the FIFO at path until a task that writes into it closes it, and fails
// the test if none does within fifoWait.
func fifoRead(t *testing.T, path, what string) {
	t.Helper()
	fifoEnd(t, path, what, false)
}

// fifoEnd opens the test's end of a FIFO (to write a byte, or to read to EOF) and waits
// for the task's end, for fifoWait at most: then it opens the task's end itself, which
// unblocks its own open, and fails.
func fifoEnd(t *testing.T, path, what string, write bool) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var err error
		if write {
			err = os.WriteFile(path, []byte{1}, 0o600)
		} else {
			_, err = os.ReadFile(path)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(fifoWait):
		other := os.O_WRONLY
		if write {
			other = os.O_RDONLY
		}
		if f, err := os.OpenFile(path, other|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
			<-done
		}
		t.Fatalf("%s: no task opened its end of the FIFO within %v", what, fifoWait)
	}
}
