package lifecycle

import (
	"errors"
	"testing"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
)

// A goroutine incarnation is local, ready at once, and can be neither signalled nor killed:
// its lane abandons it instead.
func TestGoroutineIncarnation(t *testing.T) {
	run, err := Goroutines{Inline: 64, Epoch: 1}.Open(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if run.Remote() || run.DoneBell() != nil || run.Signal() != nil || run.PID() != 0 {
		t.Fatalf("goroutine incarnation: remote %v, done bell %v, signal set %v, pid %d",
			run.Remote(), run.DoneBell(), run.Signal() != nil, run.PID())
	}
	if run.Kill(Exit{Corrupt: errors.New("x")}) {
		t.Fatal("Kill reported a goroutine killed")
	}
	select {
	case <-run.Ready():
	default:
		t.Fatal("a goroutine incarnation is not ready at once")
	}
	if !run.AwaitReady(nil) {
		t.Fatal("AwaitReady: not ready")
	}
	if r := run.Region(); r.Lane() != 3 || r.Incarnation() != 2 {
		t.Fatalf("region names lane %d incarnation %d, want 3 and 2", r.Lane(), r.Incarnation())
	}
}

// Start runs the executor on a goroutine and reports its end, classified, once: a stop the
// host asked for ends it THREAD_CLOSED.
func TestGoroutineIncarnationStartAndEnd(t *testing.T) {
	run, err := Goroutines{Inline: 64}.Open(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	type end struct {
		e      *Error
		normal bool
	}
	ended := make(chan end, 2)
	err = run.Start(Launch{
		Exec: func(region *fastpath.Region, bell fastpath.Bell) (Runner, error) {
			return &actors.Executor{Local: true, Region: region, Lane: bell}, nil
		},
		Stopping: func() bool { return true },
		End:      func(e *Error, normal bool) { ended <- end{e, normal} },
	})
	if err != nil {
		t.Fatal(err)
	}
	run.Region().Stop().Store(fastpath.StopRequested)
	run.Region().LaneWake().Force(run.LaneBell())
	got := <-ended
	if got.e.Code != CodeThreadClosed || got.e.Lane != 1 || got.normal {
		t.Fatalf("end after a stop request: %v (normal %v), want THREAD_CLOSED on lane 1", got.e, got.normal)
	}
	run.Close()
	select {
	case e := <-ended:
		t.Fatalf("End called twice: %v", e.e)
	default:
	}
}

// An executor that cannot be built fails Start, and nothing runs.
func TestGoroutineIncarnationStartError(t *testing.T) {
	run, err := Goroutines{Inline: 64}.Open(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("no consumer id")
	err = run.Start(Launch{
		Exec: func(*fastpath.Region, fastpath.Bell) (Runner, error) { return nil, boom },
		End:  func(*Error, bool) { t.Error("End called for an incarnation that never started") },
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Start: %v, want %v", err, boom)
	}
}

// A process incarnation is remote and not ready until its lane reports ready in its region.
func TestProcessIncarnationReady(t *testing.T) {
	rt := &Processes{Layout: fastpath.Layout{Inline: 64, Arena: 4096, AbortBits: 8}}
	run, err := rt.Open(0, 0)
	if err != nil {
		t.Skipf("no memfd here: %v", err)
	}
	defer run.Close()
	if !run.Remote() || run.DoneBell() == nil {
		t.Fatal("a process incarnation must be remote, with a completion doorbell")
	}
	run.Poll()
	select {
	case <-run.Ready():
		t.Fatal("ready before the lane reported ready")
	default:
	}
	run.Region().Boot().Store(fastpath.BootReady)
	run.Poll()
	run.Poll() // a second look must not close Ready again
	select {
	case <-run.Ready():
	default:
		t.Fatal("not ready after the lane reported ready")
	}
}
