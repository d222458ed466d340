package lifecycle

import (
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
)

// fakeRings records what a Lane's life asks of the host end of its rings.
type fakeRings struct {
	mu      sync.Mutex
	closed  int           // CloseLocked calls
	settled []*Error      // Settle calls, in order
	release []bool        // their release arguments
	stopped chan struct{} // closed by StopRequested
	letGo   int
}

func (r *fakeRings) CloseLocked() { r.closed++ }
func (r *fakeRings) Settle(e *Error, release bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settled, r.release = append(r.settled, e), append(r.release, release)
}
func (r *fakeRings) StopRequested() { close(r.stopped) }
func (r *fakeRings) LetGo()         { r.letGo++ }

// fakeRun is an incarnation that ends when the test says, and that may or may not be
// killable.
type fakeRun struct {
	region   *fastpath.Region
	end      func(*Error, bool)
	killable bool
	closed   int
}

func (f *fakeRun) Region() *fastpath.Region        { return f.region }
func (f *fakeRun) LaneBell() fastpath.Bell         { return fastpath.NewChanBell() }
func (f *fakeRun) DoneBell() fastpath.Bell         { return nil }
func (f *fakeRun) DirectBell() fastpath.Bell       { return nil }
func (f *fakeRun) Remote() bool                    { return false }
func (f *fakeRun) Start(l Launch) error            { f.end = l.End; return nil }
func (f *fakeRun) Ready() <-chan struct{}          { return closedChan }
func (f *fakeRun) Poll()                           {}
func (f *fakeRun) AwaitReady(<-chan struct{}) bool { return true }
func (f *fakeRun) PID() int                        { return 0 }
func (f *fakeRun) Close()                          { f.closed++ }
func (f *fakeRun) Signal() func(syscall.Signal) {
	if !f.killable {
		return nil
	}
	return func(syscall.Signal) { go f.end(&Error{Code: CodeWorkerCrashed, Message: "signalled"}, false) }
}
func (f *fakeRun) Kill(Exit) bool { return f.killable }

type fakeRuntime struct{ run *fakeRun }

func (r fakeRuntime) Open(int, int) (Incarnation, error) { return r.run, nil }
func (fakeRuntime) Caps() Caps                           { return Caps{} }

func newTestLane(t *testing.T, killable bool, ack time.Duration) (*Lane, *fakeRun, *fakeRings, *sync.Mutex) {
	t.Helper()
	layout := fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 2, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	run := &fakeRun{region: region, killable: killable}
	rings := &fakeRings{stopped: make(chan struct{})}
	mu := new(sync.Mutex)
	l := new(Lane)
	l.Init(2, 1, LaneConfig{Runtime: fakeRuntime{run}, Mu: mu, StopAckTimeout: ack, KillGrace: ack, Log: zap.NewNop()}, rings)
	if err := l.OpenRegion(); err != nil {
		t.Fatal(err)
	}
	if err := l.Start(Launch{}); err != nil {
		t.Fatal(err)
	}
	return l, run, rings, mu
}

// An incarnation that ends by itself: the rings are closed and settled once, with its end,
// the region is released after the rings let go, and Ended closes.
func TestLaneEnd(t *testing.T) {
	l, run, rings, _ := newTestLane(t, true, time.Second)
	want := &Error{Code: CodeWorkerExited, Lane: 2, Message: "exited"}
	run.end(want, true)
	<-l.Ended()
	e, normal := l.Outcome()
	if e != want || !normal {
		t.Fatalf("Outcome: %v, %v; want %v, true", e, normal, want)
	}
	if rings.closed != 1 || len(rings.settled) != 1 || rings.settled[0] != want || !rings.release[0] || rings.letGo != 1 {
		t.Fatalf("rings: closed %d, settled %v (release %v), let go %d", rings.closed, rings.settled, rings.release, rings.letGo)
	}
	if run.closed != 1 || l.State() != LaneEnded {
		t.Fatalf("memory closed %d times, state %d", run.closed, l.State())
	}
	// A second end, and a stop after the end, change nothing.
	run.end(&Error{Code: CodeWorkerCrashed}, false)
	if !l.Stop() || len(rings.settled) != 1 {
		t.Fatalf("after the end: %d settles", len(rings.settled))
	}
}

// A stop the lane acknowledges: the stop word is set, the rings are told, and the lane ends
// THREAD_CLOSED when its incarnation reports the end.
func TestLaneStopAcknowledged(t *testing.T) {
	l, run, rings, _ := newTestLane(t, true, time.Minute)
	go func() {
		<-rings.stopped
		if got := l.Region().Stop().Load(); got != fastpath.StopRequested {
			t.Errorf("stop word %d, want requested", got)
		}
		l.Region().Stop().Store(fastpath.StopAcknowledged)
		l.CheckAck()
		run.end(&Error{Code: CodeThreadClosed, Lane: 2, Message: "lane stopped"}, false)
	}()
	if !l.Stop() {
		t.Fatal("Stop reported no acknowledgement")
	}
	if len(rings.settled) != 1 || rings.settled[0].Code != CodeThreadClosed || !rings.release[0] {
		t.Fatalf("settled %v (release %v)", rings.settled, rings.release)
	}
}

// A lane that can be neither signalled nor killed and does not acknowledge is abandoned:
// its calls settle (release false: its records are never reused) and Stop returns.
func TestLaneStopAbandons(t *testing.T) {
	l, run, rings, _ := newTestLane(t, false, time.Millisecond)
	if l.Stop() {
		t.Fatal("Stop reported an acknowledgement nobody gave")
	}
	if len(rings.settled) != 1 || rings.settled[0].Code != CodeThreadClosed || rings.release[0] {
		t.Fatalf("settled %v (release %v), want one THREAD_CLOSED without release", rings.settled, rings.release)
	}
	if run.closed != 0 {
		t.Fatal("an abandoned lane's memory was released while it may still run")
	}
	// Its goroutine returns at last: the memory goes, nothing settles twice.
	run.end(&Error{Code: CodeThreadClosed}, false)
	if run.closed != 1 || len(rings.settled) != 1 {
		t.Fatalf("after the late end: memory closed %d, %d settles", run.closed, len(rings.settled))
	}
}

// A start that fails releases the region and leaves nothing running.
func TestLaneStartFails(t *testing.T) {
	layout := fastpath.Layout{Inline: 64, Arena: 64, AbortBits: 1}
	region, err := fastpath.NewRegion(shm.Heap(layout.Size()), layout, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	run := &failingRun{fakeRun{region: region}}
	l := new(Lane)
	l.Init(0, 0, LaneConfig{Runtime: fakeRuntime{&run.fakeRun}, Mu: new(sync.Mutex), Log: zap.NewNop()}, &fakeRings{})
	l.cfg.Runtime = failingRuntime{run}
	if err := l.OpenRegion(); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if err := l.Start(Launch{}); !errors.As(err, &e) || e.Code != CodeStartupFailed {
		t.Fatalf("Start: %v, want STARTUP_FAILED", err)
	}
	if run.closed != 1 || !l.Stop() {
		t.Fatalf("memory closed %d times; Stop of a lane that never started must return at once", run.closed)
	}
}

type failingRun struct{ fakeRun }

func (f *failingRun) Start(Launch) error { return errors.New("no process") }

type failingRuntime struct{ run *failingRun }

func (r failingRuntime) Open(int, int) (Incarnation, error) { return r.run, nil }
func (failingRuntime) Caps() Caps                           { return Caps{} }
