//go:build linux

package lifecycle

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// The host's soft RLIMIT_NOFILE, lowered (as a lane's prlimit64 would), is raised back at
// the next Check, logged at Error the first time and at Debug after.
func TestHostLimitsCheck(t *testing.T) {
	var orig unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Cur < 64 {
		t.Skipf("RLIMIT_NOFILE %d: no room to lower it", orig.Cur)
	}
	t.Cleanup(func() { _ = unix.Prlimit(0, unix.RLIMIT_NOFILE, &orig, nil) })
	core, logs := observer.New(zap.DebugLevel)
	h, err := WatchHostLimits(zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Check(); len(got) != 0 {
		t.Fatalf("nothing changed, Check found %+v", got)
	}
	for round := range 2 {
		lowered := unix.Rlimit{Cur: orig.Cur / 2, Max: orig.Max}
		if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &lowered, nil); err != nil {
			t.Fatal(err)
		}
		got := h.Check()
		if len(got) != 1 || got[0].Resource != "RLIMIT_NOFILE" || got[0].Found.Soft != lowered.Cur || got[0].Now.Soft != orig.Cur || got[0].Err != nil {
			t.Fatalf("round %d: Check found %+v", round, got)
		}
		var now unix.Rlimit
		if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &now); err != nil || now != orig {
			t.Fatalf("round %d: RLIMIT_NOFILE %+v after Check, want %+v", round, now, orig)
		}
	}
	if n := logs.FilterLevelExact(zap.ErrorLevel).Len(); n != 1 {
		t.Errorf("%d Error entries, want 1: %v", n, logs.All())
	}
	if n := logs.FilterLevelExact(zap.DebugLevel).Len(); n != 1 {
		t.Errorf("%d Debug entries, want 1: %v", n, logs.All())
	}
	var none *HostLimits
	if got := none.Check(); got != nil {
		t.Errorf("a nil HostLimits found %+v", got)
	}
}
