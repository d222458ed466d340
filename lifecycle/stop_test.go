package lifecycle

import (
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// fakeLane plays a lane for the stop protocol: it acknowledges or not, and ends on the
// signals it heeds. It records what the host did, in order.
type fakeLane struct {
	mu     sync.Mutex
	did    []string
	acked  chan struct{}
	ended  chan struct{}
	heeds  map[syscall.Signal]bool
	closed bool
}

func newFakeLane(heeds ...syscall.Signal) *fakeLane {
	f := &fakeLane{acked: make(chan struct{}), ended: make(chan struct{}), heeds: map[syscall.Signal]bool{}}
	for _, s := range heeds {
		f.heeds[s] = true
	}
	return f
}

func (f *fakeLane) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.did = append(f.did, s)
}

func (f *fakeLane) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.ended)
	}
}

func (f *fakeLane) stop(process bool) Stop {
	s := Stop{AckTimeout: time.Millisecond, KillGrace: time.Millisecond, Acked: f.acked, Ended: f.ended,
		Debug: func(msg string, _ ...zap.Field) {
			f.note("log " + strings.Fields(msg)[0] + " " + strings.Fields(msg)[1])
		},
		TimedOut: func() { f.note("timed out") },
		Killed:   func(signal, reason string) { f.note(signal + " " + reason) },
		Abandon:  func() { f.note("abandon"); f.end() },
	}
	if process {
		s.Signal = func(sig syscall.Signal) {
			f.note("signal " + sig.String())
			if f.heeds[sig] {
				f.end()
			}
		}
	}
	return s
}

func TestStopEscalation(t *testing.T) {
	for _, c := range []struct {
		name    string
		process bool
		ack     bool // the lane acknowledges, and, if it heeds nothing, stays
		heeds   []syscall.Signal
		acked   bool
		did     []string
	}{
		{"goroutine acknowledges", false, true, nil, true, []string{"log stop acknowledged"}},
		{"goroutine ignores", false, false, nil, false,
			[]string{"timed out", "log stop not", "abandon"}},
		{"process ignores, SIGTERM ends it", true, false, []syscall.Signal{syscall.SIGTERM}, false,
			[]string{"log stop not", "timed out", "SIGTERM stop_timeout", "signal terminated"}},
		{"process ignores even SIGTERM", true, false, []syscall.Signal{syscall.SIGKILL}, false,
			[]string{"log stop not", "timed out", "SIGTERM stop_timeout", "signal terminated", "log still running",
				"SIGKILL stop_timeout", "signal killed"}},
		{"process acknowledges and stays", true, true, []syscall.Signal{syscall.SIGKILL}, true,
			[]string{"log stop acknowledged", "log acknowledged but", "SIGKILL exit_timeout", "signal killed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeLane(c.heeds...)
			if c.ack {
				close(f.acked)
				if !c.process {
					f.end()
				}
			}
			if got := f.stop(c.process).Run(); got != c.acked {
				t.Errorf("Run = %v, want %v", got, c.acked)
			}
			if !slices.Equal(f.did, c.did) {
				t.Errorf("the host did\n %q, want\n %q", f.did, c.did)
			}
		})
	}
}

// A lane that ends before its acknowledgement timeout counts as acknowledged, and nothing
// is sent to it.
func TestStopEndedLane(t *testing.T) {
	f := newFakeLane()
	f.end()
	s := f.stop(true)
	s.AckTimeout = time.Hour
	if !s.Run() || slices.Contains(f.did, "signal killed") {
		t.Fatalf("an ended lane: did %q", f.did)
	}
}

// TestAwaitReady: a process that does not report ready in time is killed, with the startup
// timeout as the reason.
func TestAwaitReady(t *testing.T) {
	lc, _ := launcher(t, "exec sleep 60")
	p, err := lc.Start(Boot{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	var x Exit
	go func() {
		x = p.Wait()
		p.Collect(&x)
		close(ended)
	}()
	if p.AwaitReady(make(chan struct{}), ended, time.Millisecond) {
		t.Fatal("ready without a report")
	}
	if x.Startup != time.Millisecond || x.Signal != syscall.SIGKILL {
		t.Fatalf("exit %+v", x)
	}
	ready := make(chan struct{})
	close(ready)
	if !(&Process{}).AwaitReady(ready, nil, time.Hour) {
		t.Fatal("a lane seen ready is not ready")
	}
}
