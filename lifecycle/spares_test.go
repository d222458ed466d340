package lifecycle

import (
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit/internal/procfs"
)

// spareCommand plays a spare that has initialised: it reports so with one byte on its
// socket (fd 3), then waits.
const spareCommand = "printf x >&3; exec sleep 60"

func spares(t *testing.T, command string, count int) (*Spares, *Launcher, *observer.ObservedLogs) {
	t.Helper()
	lc, logs := launcher(t, command)
	s := &Spares{Launcher: lc, Count: count, Log: lc.Log}
	t.Cleanup(s.Close)
	return s, lc, logs
}

// TestSparesTakeAndRefill: Refill starts Count spares; Take hands them out one at a time,
// then none; Refill tops the stock up again.
func TestSparesTakeAndRefill(t *testing.T) {
	s, _, _ := spares(t, spareCommand, 2)
	s.Refill()
	s.Wait()
	if pids := s.PIDs(); len(pids) != 2 {
		t.Fatalf("%d spares ready, want 2", len(pids))
	}
	a, b := s.Take(), s.Take()
	if a == nil || b == nil || a.PID() == b.PID() {
		t.Fatalf("took %v and %v", a, b)
	}
	if sp := s.Take(); sp != nil || len(s.PIDs()) != 0 {
		t.Fatalf("took a third spare %v of two", sp)
	}
	a.kill()
	b.kill()
	s.Refill()
	s.Wait()
	if pids := s.PIDs(); len(pids) != 2 {
		t.Fatalf("%d spares after a refill, want 2", len(pids))
	}
}

// TestSpareAssign: a spare taken for lane 3 becomes its process: it receives the record
// and files, and ends like one.
func TestSpareAssign(t *testing.T) {
	s, lc, _ := spares(t, spareCommand, 1)
	s.Refill()
	s.Wait()
	sp := s.Take()
	if sp == nil {
		t.Fatal("no spare")
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := lc.Assign(sp, Boot{Lane: 3}, []*os.File{f, f})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID() != sp.PID() {
		t.Fatalf("process %d, spare %d", p.PID(), sp.PID())
	}
	p.Kill(Exit{Unresponsive: "test"})
	x := p.Wait()
	p.Collect(&x)
	if x.Signal != syscall.SIGKILL || x.Unresponsive != "test" {
		t.Fatalf("exit %+v", x)
	}
}

// TestSparesSkipDeadAndFrozen: a spare that died waiting, or that is stopped (it would make
// the restart wait for nothing), is not handed out; the stopped one is killed.
func TestSparesSkipDeadAndFrozen(t *testing.T) {
	s, _, _ := spares(t, spareCommand, 2)
	s.Refill()
	s.Wait()
	pids := s.PIDs()
	if len(pids) != 2 {
		t.Fatalf("%d spares ready, want 2", len(pids))
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.ready[0].waited
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for { // the stop takes effect when the kernel next schedules the process
		if state, _, err := procfs.Stat(pids[1]); err != nil || state == 'T' || state == 't' {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if sp := s.Take(); sp != nil {
		t.Fatalf("took spare %d, dead or stopped", sp.PID())
	}
	s.Wait() // the stopped one is killed and reaped
	if err := syscall.Kill(pids[1], 0); err != syscall.ESRCH {
		t.Fatalf("stopped spare %d still there: %v", pids[1], err)
	}
}

// TestSparesThatFail: a process that exits without reporting is no spare: it is logged, not
// kept.
func TestSparesThatFail(t *testing.T) {
	s, _, logs := spares(t, "exit 0", 1)
	s.Refill()
	s.Wait()
	if len(s.PIDs()) != 0 {
		t.Fatalf("spares %v from a command that exits", s.PIDs())
	}
	if logs.FilterMessage("could not start a spare lane process").Len() != 1 {
		t.Fatalf("the failed spare was not logged: %v", logs.All())
	}
}

// TestSparesCloseWhileBooting: Close ends spares that have not reported yet.
func TestSparesCloseWhileBooting(t *testing.T) {
	s, _, _ := spares(t, "exec sleep 60", 2)
	s.Refill()
	s.Close() // returns once both are killed and reaped (goleak checks their waiters)
	s.Refill()
	if len(s.PIDs()) != 0 {
		t.Fatal("a closed stock refilled")
	}
}

// The zero Spares starts none and closes.
func TestZeroSpares(t *testing.T) {
	var s Spares
	s.Refill()
	if s.Take() != nil || s.PIDs() != nil {
		t.Fatal("the zero Spares has spares")
	}
	s.Close()
}

// TestSparesAdaptive: with Max above Count, each Take that finds no spare keeps one more
// (up to Max), so that the next burst of restarts finds them ready.
func TestSparesAdaptive(t *testing.T) {
	s, _, _ := spares(t, spareCommand, 1)
	s.Max = 3
	s.Refill()
	s.Wait()
	var taken []*Spare
	for range 2 { // a burst of restarts takes every spare, and one more finds none
		for sp := s.Take(); sp != nil; sp = s.Take() {
			taken = append(taken, sp)
		}
		s.Refill()
		s.Wait()
	}
	if pids := s.PIDs(); len(pids) != 3 {
		t.Fatalf("%d spares after two misses, want 3 (Max)", len(pids))
	}
	if sp := s.Take(); sp == nil {
		t.Fatal("no spare after growing")
	} else {
		taken = append(taken, sp)
	}
	for _, sp := range taken {
		sp.kill()
	}
}
